/*
 * Persistent tile scheduler of mok's grouped GEMMs.
 *
 * Tile space: num_groups x num_m_tiles x num_n_tiles. Inside a group the tiles are walked in bands
 * of MOK_SCHED_BAND M-tiles, M fastest inside a band:
 *   linear = group * (num_m_tiles * num_n_tiles) + band * (MOK_SCHED_BAND * num_n_tiles)
 *            + n_tile * rows_of_band + (m_tile - band * MOK_SCHED_BAND)
 * so the CTAs that run at the same time (one wave: about as many tiles as SMs) cover a block of
 * about 16 M-tiles x (SMs / 16) N-tiles and share both operands through L2. (N fastest over whole
 * rows re-read the full weight of an expert for every M-tile when N is large: Mixtral's GEMM1,
 * N = 2I = 28672, ran DRAM-bound that way.) CTA b takes tiles b, b + gridDim.x, ... (static round
 * robin: deterministic, no atomics).
 *
 * Forward / dgrad GEMMs walk the plan's row space: one group, M-tiles over the R rows. The number
 * of rows in use, offsets[E], lives in device memory and is read here on the device (no host sync);
 * tiles at or past it are still handed out with in_use = 0 so that the kernel zero-fills them.
 * The weight-gradient GEMM uses one group per expert and M-tiles over the weight's rows.
 *
 * mok_sched_wait_ready() is the hook of the fused dispatch + GEMM kernel (per-tile ready counters,
 * DESIGN.md); it is a no-op today.
 */
#ifndef MOK_CUDA_GEMM_SCHEDULER_CUH
#define MOK_CUDA_GEMM_SCHEDULER_CUH

#include <stdint.h>
#include <cuda_runtime.h>

/* M-tiles per band of the walk (-DMOK_SCHED_BAND_M_TILES=B: the experiment builds of the standalone checkers) */
#ifndef MOK_SCHED_BAND_M_TILES
#define MOK_SCHED_BAND_M_TILES 16
#endif
enum { MOK_SCHED_BAND = MOK_SCHED_BAND_M_TILES };

struct mok_tile_sched {
    int64_t num_groups, num_m_tiles, num_n_tiles, num_tiles;
    int64_t tile_m;    /* rows per M-tile */
    int64_t rows_used; /* rows of the row space in use: min(offsets[E], R); INT64_MAX when unused */
    int64_t next;      /* linear index of this CTA's next tile */
    int64_t stride;    /* gridDim.x */
    int64_t per_group; /* num_m_tiles * num_n_tiles */
    int64_t per_band;  /* MOK_SCHED_BAND * num_n_tiles */
};

struct mok_tile {
    int64_t group, m_tile, n_tile;
    int64_t m0;  /* first row of the tile (m_tile * tile_m) */
    int in_use;  /* 0: every row of the tile is at or past rows_used (zero-fill only) */
};

/* ---- row space helpers (plan offsets [E + 1], device memory) ---- */

/* Rows in use: offsets[E] clamped to [0, R]. */
__device__ __forceinline__ int64_t mok_rows_in_use(const int32_t* offsets, int64_t E, int64_t R) {
    int64_t used = (int64_t)offsets[E];
    used = used < 0 ? 0 : used;
    return used > R ? R : used;
}

/* The expert e with offsets[e] <= r < offsets[e + 1], for offsets[0] <= r < offsets[E]; -1 when
 * r < offsets[0]. Binary search for the last e in [0, E] with offsets[e] <= r.
 * NOTE: empty experts (equal consecutive offsets) are never returned for a row in use, because
 * the last e with offsets[e] <= r has offsets[e + 1] > r. */
__device__ __forceinline__ int64_t mok_expert_of_row(const int32_t* offsets, int64_t E, int64_t r) {
    if (r < (int64_t)offsets[0]) {
        return -1;
    }
    int64_t lo = 0, hi = E; /* invariant: offsets[lo] <= r, answer in [lo, hi] */
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if ((int64_t)offsets[mid] <= r) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

/* ---- scheduler ---- */

/* Set up the walk of this CTA. rows_used: INT64_MAX when every tile is in use. */
__device__ __forceinline__ void mok_sched_init(struct mok_tile_sched* s, int64_t num_groups, int64_t num_m_tiles,
                                               int64_t num_n_tiles, int64_t tile_m, int64_t rows_used) {
    s->num_groups = num_groups;
    s->num_m_tiles = num_m_tiles;
    s->num_n_tiles = num_n_tiles;
    s->num_tiles = num_groups * num_m_tiles * num_n_tiles;
    s->tile_m = tile_m;
    s->rows_used = rows_used;
    s->next = (int64_t)blockIdx.x;
    s->stride = (int64_t)gridDim.x;
    s->per_group = num_m_tiles * num_n_tiles;
    s->per_band = (int64_t)MOK_SCHED_BAND * num_n_tiles;
}

/* Units of `ctas` CTAs (a thread-block cluster): the walk hands unit b / ctas, b / ctas +
 * gridDim.x / ctas, ... to every CTA b of the cluster, which then takes its part of the unit. */
__device__ __forceinline__ void mok_sched_per_cluster(struct mok_tile_sched* s, int ctas) {
    s->next = (int64_t)(blockIdx.x / (unsigned)ctas);
    s->stride = (int64_t)(gridDim.x / (unsigned)ctas);
}

/* The next tile of this CTA; false when the CTA is done. Every thread of the CTA calls it and gets
 * the same tile (the walk depends on blockIdx only). */
__device__ __forceinline__ bool mok_sched_next_tile(struct mok_tile_sched* s, struct mok_tile* t) {
    if (s->next >= s->num_tiles) {
        return false;
    }
    const int64_t linear = s->next;
    s->next += s->stride;
    /* NOTE: 32-bit divisions where the tile count allows (always, in practice): the 64-bit ones
     * are ~70-instruction calls, and a consumer runs this while the tensor cores wait. */
    if (s->num_tiles <= (int64_t)UINT32_MAX) {
        const uint32_t lin = (uint32_t)linear, pg = (uint32_t)s->per_group, pb = (uint32_t)s->per_band;
        const uint32_t group = lin / pg, in_group = lin - group * pg;
        const uint32_t band = in_group / pb, in_band = in_group - band * pb;
        const uint32_t first_m = band * MOK_SCHED_BAND;
        const uint32_t left = (uint32_t)s->num_m_tiles - first_m;
        const uint32_t rows_of_band = left < MOK_SCHED_BAND ? left : MOK_SCHED_BAND;
        const uint32_t n_tile = in_band / rows_of_band;
        t->group = group;
        t->m_tile = first_m + (in_band - n_tile * rows_of_band);
        t->n_tile = n_tile;
    } else {
        t->group = linear / s->per_group;
        const int64_t in_group = linear % s->per_group;
        const int64_t band = in_group / s->per_band, in_band = in_group % s->per_band;
        const int64_t first_m = band * MOK_SCHED_BAND;
        const int64_t left = s->num_m_tiles - first_m;
        const int64_t rows_of_band = left < MOK_SCHED_BAND ? left : MOK_SCHED_BAND;
        t->m_tile = first_m + in_band % rows_of_band;
        t->n_tile = in_band / rows_of_band;
    }
    t->m0 = t->m_tile * s->tile_m;
    t->in_use = t->m0 < s->rows_used ? 1 : 0;
    return true;
}

/* Wait until the rows of tile t have arrived. No-op today: every input is complete at launch.
 * NOTE: a fused dispatch + GEMM kernel replaces this with a bounded spin on a per-tile ready
 * counter (ld.acquire), ending in mok's error flag on timeout. */
__device__ __forceinline__ void mok_sched_wait_ready(const struct mok_tile* t) { (void)t; }

/* Host: grid size of a persistent launch over num_tiles tiles (num_tiles > 0). */
static inline unsigned int mok_sched_grid(int64_t num_tiles, int num_sms, int ctas_per_sm) {
    int64_t g = (int64_t)(num_sms > 0 ? num_sms : 1) * ctas_per_sm;
    if (g > num_tiles) {
        g = num_tiles;
    }
    return (unsigned int)(g < 1 ? 1 : g);
}

#endif /* MOK_CUDA_GEMM_SCHEDULER_CUH */
