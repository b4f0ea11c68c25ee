/*
 * BF16 grouped GEMM "NT" for sm_90a: out[r, n] = sum_k A[r, k] * B[e(r), n, k] over the plan's row
 * space, persistent and warp-specialised.
 *
 *   warpgroup 0      producer: TMA for B (and for A when rows are contiguous), or cp.async
 *                    gather-on-load of A rows (row r reads a[a_gather[r] / a_gather_div]);
 *                    B is K-major ([E, N, K], "NT") or, with kBMN, N-major ([E, K, N], "NN": the
 *                    dgrad GEMMs read the weights as they are, no transposed copy);
 *   warpgroups 1, 2  consumers: wgmma m64n256k16 on 64 rows each, f32 accumulators in registers;
 *                    epilogue through shared memory: [64 x 64] bf16 chunks stored by TMA, staged
 *                    in the tile's last ring stage (lent to the epilogue, given back during the
 *                    next tile's first K-block) and two own buffers per warpgroup; plain or with
 *                    the fused SwiGLU.
 *
 * Tile 128 x 256 x 64, kStages-deep shared-memory ring; full/empty mbarriers per stage.
 * With kCluster = 2 the CTAs of a cluster take pairs of M-tiles (the same N-tile); where both run
 * the same expert each loads half of the B tile and multicasts it into both CTAs' rings (32 KiB of
 * L2 traffic per K-block per SM instead of 48), and consumers release a stage in both CTAs.
 * The SwiGLU variant reads gate rows [n0, n0 + 128) and up rows [I + n0, I + n0 + 128) of the
 * expert's [2I, K] weight into one 256-row B tile, so each thread holds a gate value and its up
 * value in the same registers and writes h = [gate | up] and act = silu(gate) * up itself.
 *
 * Tiles straddling experts (plans whose row tile is not a multiple of 128) are run once per
 * expert segment, each pass storing only the segment's rows straight from registers; mok's own
 * CUDA plans are 128-aligned, so that is one pass per tile, stored by TMA. Rows outside
 * [offsets[0], offsets[E]) are written as 0.
 *
 * The weight-gradient variant (kWgrad) reuses the pipeline with one tile group per expert and the
 * expert's rows as the contraction: out[e] = a[rows of e, :]^T b[rows of e, :] with a [R, M] and
 * b [R, N] read by TMA as they are, as MN-major wgmma operands (no transposed copies).
 *
 * Shared-memory operand layouts (128B swizzle, 64 bf16 = 128 bytes per swizzle row):
 *   K-major   rows of the M (or N) dimension, 64 K values each; 8-row atoms of 1024 bytes;
 *   MN-major  64-wide chunks along M (or N), each [64 K rows][64 values] = 8 KiB, chunk after
 *             chunk; one TMA box per chunk. A consumer warpgroup's 64 rows of A are one chunk.
 */
#ifndef MOK_CUDA_GEMM_GROUPED_GEMM_SM90_CUH
#define MOK_CUDA_GEMM_GROUPED_GEMM_SM90_CUH

#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "../common/dtype.cuh"
#include "../common/swiglu.cuh"
#include "../ptx/cluster.cuh"
#include "../ptx/mbarrier.cuh"
#include "../ptx/smem.cuh"
#include "../ptx/stmatrix.cuh"
#include "../ptx/tma.cuh"
#include "../ptx/wgmma.cuh"
#include "../quant/qdq_mxfp8_smem.cuh"
#include "scheduler.cuh"

namespace mok_sm90 {

/* Cycle counters of one consumer thread per CTA (thread 128), summed over CTAs: compiled in only
 * by benchmarks/sm90_gemm_timing.cu (-DMOK_SM90_TIMING) to see where a tile's time goes besides
 * its K-blocks. Slots: TIMING_* below. */
enum {
    TIMING_TILES,
    TIMING_SETUP,
    TIMING_MAINLOOP,
    TIMING_FULL_WAIT,
    TIMING_DRAIN,
    TIMING_EPILOGUE,
    TIMING_EPI_ACQUIRE,
    TIMING_PROMOTE, /* FP8 kernel only: the FP32 promotion after each K-block */
    TIMING_SLOTS
};
#ifdef MOK_SM90_TIMING
__device__ unsigned long long timing[TIMING_SLOTS];
#define MOK_TIMING_NOW() clock64()
#define MOK_TIMING_ADD(slot, since)                                                                      \
    do {                                                                                                \
        if (threadIdx.x == 128) atomicAdd(&mok_sm90::timing[slot], (unsigned long long)(clock64() - (since))); \
    } while (0)
#define MOK_TIMING_COUNT(slot)                                 \
    do {                                                       \
        if (threadIdx.x == 128) atomicAdd(&mok_sm90::timing[slot], 1ull); \
    } while (0)
#else
#define MOK_TIMING_NOW() 0ll
#define MOK_TIMING_ADD(slot, since) ((void)(since))
#define MOK_TIMING_COUNT(slot) ((void)0)
#endif

/* Pipeline depth and epilogue buffers per consumer warpgroup; overridable for experiments with
 * benchmarks/sm90_gemm_timing.cu only (the library builds the defaults). */
#ifndef MOK_SM90_STAGES
#define MOK_SM90_STAGES 4
#endif
#ifndef MOK_SM90_EPI_BUFS
#define MOK_SM90_EPI_BUFS 2
#endif

enum {
    BM = 128,
    BN = 256,
    BK = 64,
    kStages = MOK_SM90_STAGES,
    kEpiBufs = MOK_SM90_EPI_BUFS, /* 2: a chunk is written while the previous one is stored; 1 (an
                                     experiment: frees shared memory for a ring stage) waits for it */
    kThreads = 384,
    kProducerRegs = 56,
    kConsumerRegs = 224,
    A_STAGE_BYTES = BM * BK * 2,
    B_HALF_BYTES = (BN / 2) * BK * 2,
    B_STAGE_BYTES = BN * BK * 2,
    MN_CHUNK = 64,                        /* MN-major: values per 128-byte swizzle row */
    MN_CHUNK_ELEMS = MN_CHUNK * BK,       /* one [64 K][64 MN] chunk */
    MN_CHUNK_BYTES = MN_CHUNK_ELEMS * 2,  /* 8 KiB: the leading byte offset of MN-major descriptors */
    kSmemOffsets = 384,                   /* plan offsets kept in shared memory when E + 1 <= this */
};

/* The tile's last ring stage is lent to the epilogue (MOK_SM90_EPI_LEND, on by default): once both
 * consumer warpgroups have drained its wgmma, its 48 KiB hold 6 of the tile's [64 x 64] chunks
 * (3 per warpgroup: its 8 KiB of A and 16 KiB of B) besides the 2 x 2 own buffers, so a plain
 * tile's 4 chunks per warpgroup are staged without waiting for any store to have read a buffer.
 * The stage goes back to the producer after the next tile's first K-block is issued, once the
 * stores have read it; the producer needs it only 3 K-blocks into the next tile.
 * Why: a Qwen3 tile staged without TMA stores runs ~10% faster than one that waits, two chunks
 * later, for a store to have read its buffer (v25); the whole tile staged in dedicated buffers
 * would cost a ring stage (3 stages: the mainloop starves, v12). 0: own buffers only. */
#ifndef MOK_SM90_EPI_LEND
#define MOK_SM90_EPI_LEND 1
#endif


/* Shared memory of one CTA; the tile buffers come first so each is 1024-byte aligned (128B swizzle). */
struct smem_layout {
    __nv_bfloat16 a[kStages][BM * BK];
    __nv_bfloat16 b[kStages][BN * BK];
    __nv_bfloat16 epi[2][kEpiBufs][64 * 64]; /* [consumer warpgroup][buffer]: one TMA store box each */
    uint64_t full[kStages];
    uint64_t empty[kStages];
    int32_t offsets[kSmemOffsets]; /* copy of p.offsets: the per-tile expert lookups read it */
};
static_assert(kEpiBufs >= 1, "the epilogue stages its chunks in shared memory");
static_assert(sizeof(smem_layout) + 1024 <= 227 * 1024, "shared memory budget of one CTA");
static_assert((BM * BK * 2) % 1024 == 0 && (BN * BK * 2) % 1024 == 0, "stage buffers keep 1024-byte alignment");
static_assert(BK * 2 == 128, "one K-block row is one 128-byte swizzle row");

struct params {
    const __nv_bfloat16* a;    /* [rows of a, Kd] */
    const int32_t* a_gather;   /* [R] or NULL */
    int32_t a_gather_div;
    const int32_t* offsets;    /* [E + 1] */
    int32_t E;
    int64_t R, N, Kd;
    __nv_bfloat16* out;        /* [R, N] */
    __nv_bfloat16* swiglu_out; /* [R, N / 2], SwiGLU variant only */
    int64_t num_n_tiles;
    /* Weight-gradient variant: out [E, M, N] = per expert a[rows of e, :]^T b[rows of e, :];
     * K = the expert's rows. */
    int64_t M;
    const __nv_bfloat16* wa; /* [R, M] (its TMA map is tma_a) */
    const __nv_bfloat16* wb; /* [R, N] (its TMA map is tma_b) */
    /* Split weights (torchtitan's separate w1 / w3): 0, or the rows of each half of a [gate | up]
     * operand held in two tensors: the gate and up rows of the NT SwiGLU weight, the two K halves of
     * the NN weight (GEMM1's dgrad), the two M halves of the weight gradient's output. Their tensor
     * map gets an outermost dimension of 2 over the two tensors, based at the lower address (TMA
     * strides are unsigned); split_flip = 1 when the second half is the lower one, so half h sits
     * at plane h ^ split_flip. */
    int64_t split_rows;
    int32_t split_flip;
};

__device__ __forceinline__ void store_bf16x2(__nv_bfloat16* p, float x, float y) {
    __nv_bfloat162 v;
    v.x = mok_from_acc<__nv_bfloat16>(x);
    v.y = mok_from_acc<__nv_bfloat16>(y);
    *reinterpret_cast<__nv_bfloat162*>(p) = v;
}

/* Timing bounds only (WRONG results), for benchmarks/sm90_gemm_timing.cu: MOK_SM90_SKIP_EPILOGUE=1
 * stores nothing from whole-segment tiles (what overlapping the epilogue with the next tile's
 * mainloop could win at most); =2 stages every chunk in shared memory but issues no TMA store (what
 * the stores themselves cost). */
#ifndef MOK_SM90_SKIP_EPILOGUE
#define MOK_SM90_SKIP_EPILOGUE 0
#endif

/* A consumer warp's release of a ring stage: an arrival on its empty barrier here and, in a
 * 2-CTA cluster, on the peer's (whose producer multicasts into this CTA's stage too). Any layout
 * with an `empty` barrier per stage (the FP8 kernel's too). */
template <int kCluster, typename Layout>
__device__ __forceinline__ void release_stage(Layout& s, uint32_t stage) {
    mbarrier_arrive(&s.empty[stage]);
    if (kCluster > 1) mbarrier_arrive_cluster(&s.empty[stage], cluster_ctarank() ^ 1);
}

/* ------------------------------------------------------------------------------------------------
 * TMA-store epilogue of one consumer warpgroup: its 64 rows of the tile leave in [64 x 64] bf16
 * chunks staged in shared memory. A tile's first kLentChunks chunks go into its lent stage (when
 * lent); the others cycle through the warpgroup's kEpiBufs own buffers, each reused only once the
 * store that last read it has (thread 0 waits, then a named barrier). Thread 0 of the warpgroup
 * issues the stores, one bulk group per chunk. Every store map is 3-D (a TMA instruction's rank
 * must match its map's).
 * ---------------------------------------------------------------------------------------------- */
enum { kLentChunks = 3, EPI_CHUNK_BYTES = 64 * 64 * 2 };

struct epi_stager {
    uint32_t bufs;   /* shared address of this warpgroup's kEpiBufs own buffers of 8 KiB */
    int wg, t;       /* warpgroup (0, 1) and thread in it */
    uint32_t row;    /* byte offset in a buffer of the row this thread addresses for stmatrix */
    uint32_t sw;     /* its 16-byte chunk of column block 0, swizzled (bytes) */
    uint32_t lent_a, lent_b; /* the lent stage: the warpgroup's 8 KiB of A and 16 KiB of B */
    int32_t lent_stage;      /* a lent stage not yet given back to the producer; -1: none */
    bool use_lent;           /* the current tile's epilogue stages its first chunks in it */
    uint32_t lent_used;      /* chunks of the current tile staged in the lent stage */
    uint32_t own_uses;       /* own-buffer chunks so far */
    /* Stores (bulk groups) are numbered in issue order: groups issued so far; own_last[i] the
     * group of the own-buffer chunk i + 1 uses back (buffer own_uses % kEpiBufs was last used
     * kEpiBufs uses back), -1 for none; groups below read_upto have read their buffers (known
     * to every thread: a barrier passed since thread 0 waited), read_pending: thread 0 has waited
     * for them, not yet followed by a barrier. */
    int32_t groups;
    int32_t own_last[kEpiBufs];
    int32_t read_upto, read_pending;
};

__device__ __forceinline__ epi_stager make_epi_stager(uint32_t bufs, int wg, int t) {
    epi_stager e;
    e.bufs = bufs;
    e.wg = wg;
    e.t = t;
    /* stmatrix x4 of column blocks (2k, 2k + 1): lanes 8 j .. 8 j + 7 address the rows of matrix j,
     * j = (rows + 8: bit 0, column block + 1: bit 1). */
    const int lane = t & 31;
    const int r = (t >> 5) * 16 + 8 * ((lane >> 3) & 1) + (lane & 7);
    e.row = (uint32_t)r * 128;
    /* NOTE: the 128B swizzle puts 16-byte chunk c of row r at chunk c ^ (r % 8); r % 8 = lane % 8. */
    e.sw = (uint32_t)(((lane >> 4) ^ (lane & 7)) << 4);
    e.lent_a = e.lent_b = 0;
    e.lent_stage = -1;
    e.use_lent = false;
    e.lent_used = 0;
    e.own_uses = 0;
    e.groups = 0;
#pragma unroll
    for (int i = 0; i < kEpiBufs; ++i) e.own_last[i] = -1;
    e.read_upto = e.read_pending = 0;
    return e;
}

/* Waits (thread 0) until at most n of its bulk groups have not yet read their shared memory. */
__device__ __forceinline__ void bulk_wait_read_at_most(int32_t n) {
    switch (n) {
        case 0: bulk_wait_group_read<0>(); break;
        case 1: bulk_wait_group_read<1>(); break;
        case 2: bulk_wait_group_read<2>(); break;
        case 3: bulk_wait_group_read<3>(); break;
        case 4: bulk_wait_group_read<4>(); break;
        case 5: bulk_wait_group_read<5>(); break;
        case 6: bulk_wait_group_read<6>(); break;
        default: bulk_wait_group_read<7>(); break; /* in order: n >= 7 newer groups imply it */
    }
}

/* A tile's epilogue starts; lent: its mainloop lent its last stage (consume_kblocks with lend_last
 * and at least one K-block), so the first chunks go there. */
__device__ __forceinline__ void epi_begin_tile(epi_stager& e, bool lent) {
    e.lent_used = 0;
    e.use_lent = MOK_SM90_EPI_LEND && lent && e.lent_stage >= 0;
}

/* The next chunk's buffer, once free: its shared-memory address. A buffer of the lent stage if one
 * is left, else the next own buffer (if its last store may still be reading it, thread 0 waits for
 * that, and a barrier tells the warpgroup). */
__device__ __forceinline__ uint32_t epi_acquire(epi_stager& e) {
    if (e.use_lent && e.lent_used < kLentChunks) {
        const uint32_t c = e.lent_used++;
        return c == 0 ? e.lent_a : e.lent_b + (c - 1) * EPI_CHUNK_BYTES;
    }
    const int32_t last = e.own_last[0]; /* the store that last read this buffer */
#pragma unroll
    for (int i = 0; i + 1 < kEpiBufs; ++i) e.own_last[i] = e.own_last[i + 1];
    e.own_last[kEpiBufs - 1] = e.groups; /* this chunk's store */
    if (last >= e.read_upto) {
        const long long t_acquire = MOK_TIMING_NOW();
        if (e.t == 0) bulk_wait_read_at_most(e.groups - 1 - last);
        named_barrier_sync(1 + e.wg, 128);
        e.read_upto = last + 1;
        MOK_TIMING_ADD(TIMING_EPI_ACQUIRE, t_acquire);
    }
    return e.bufs + (e.own_uses++ % kEpiBufs) * EPI_CHUNK_BYTES;
}

/* Writes 64 columns of the warpgroup's 64 rows into the buffer, in the 128B-swizzled layout of the
 * TMA box: frag(ci, h) is this thread's packed bf16 pair of column block ci (8 columns) in row
 * lane / 4 + 8 h of its warp's 16 rows. Four stmatrix per thread. */
template <typename Frag>
__device__ __forceinline__ void epi_put_chunk(const epi_stager& e, uint32_t buf, Frag&& frag) {
    const uint32_t base = buf + e.row;
#pragma unroll
    for (int k = 0; k < 4; ++k)
        stmatrix_x4(base + (e.sw ^ (uint32_t)(k << 5)), frag(2 * k, 0), frag(2 * k, 1), frag(2 * k + 1, 0),
                    frag(2 * k + 1, 1));
}

/* The packed act pair of accumulators (ig, ig + 1) of gate and (iu, iu + 1) of up: SwiGLU of the
 * values as stored (rounded to bf16), so it equals the swiglu op on h bit for bit. Shared by the BF16
 * and FP8 kernels' SwiGLU epilogues. */
__device__ __forceinline__ uint32_t swiglu_of_rounded(const float* acc, int ig, int iu) {
    const uint32_t g = pack_bf16x2(acc[ig], acc[ig + 1]), u = pack_bf16x2(acc[iu], acc[iu + 1]);
    return pack_bf16x2(mok_swiglu(bf16x2_lo(g), bf16x2_lo(u)), mok_swiglu(bf16x2_hi(g), bf16x2_hi(u)));
}

/* Writes accumulator groups [8 j, 8 j + 8) (64 columns) of this thread's rows into buf, as bf16. */
__device__ __forceinline__ void epi_put_acc(const epi_stager& e, uint32_t buf, const float* acc, int j) {
    epi_put_chunk(e, buf, [&](int ci, int h) {
        return pack_bf16x2(acc[(8 * j + ci) * 4 + 2 * h], acc[(8 * j + ci) * 4 + 2 * h + 1]);
    });
}

/* Stages accumulator groups [8 j, 8 j + 8) (64 columns) of this thread's rows in the next buffer. */
__device__ __forceinline__ uint32_t epi_stage_acc(epi_stager& e, const float* acc, int j) {
    const uint32_t buf = epi_acquire(e);
    epi_put_acc(e, buf, acc, j);
    return buf;
}

/* Issues the TMA store of the staged chunk in buf as the box at (c0, c1, c2) of a 3-D map, or at
 * (c0, c1, c2, c3) of a 4-D one (the weight gradient's split output) when c3 >= 0. */
__device__ __forceinline__ void epi_store_box(const CUtensorMap* map, uint32_t buf, int32_t c0, int32_t c1, int32_t c2,
                                              int32_t c3 = -1) {
    if (c3 >= 0) {
        tma_store_4d(map, buf, c0, c1, c2, c3);
    } else {
        tma_store_3d(map, buf, c0, c1, c2);
    }
}

/* Stores the staged chunk in buf as the box at (c0, c1, c2) of map: every thread's writes made
 * visible to TMA, a barrier, then thread 0 issues the store (one bulk group per chunk).
 * free_next (kernels without a lent stage: the FP8 one): the same barrier also frees the next own
 * buffer, thread 0 first waiting for its last store to have read it, so that the next epi_acquire
 * need not synchronise again (one barrier per chunk).
 * (Measured, v26: staging the lent chunks first and storing them after one barrier made the plain
 * epilogue slower, 1.0 -> 1.27 us per tile: thread 0 then issues its stores back to back; inferred,
 * not measured directly: a TMA store takes ~0.1 us to issue.) */
template <bool kFreeNext = false>
__device__ __forceinline__ void epi_store(epi_stager& e, uint32_t buf, const CUtensorMap* map, int32_t c0, int32_t c1,
                                          int32_t c2, int32_t c3 = -1) {
    fence_proxy_async_shared();
    const int32_t next_last = e.own_last[0]; /* the last store of the next own buffer */
    /* (one own buffer: the next chunk's is this one, whose store is not issued yet) */
    const bool free_next = kFreeNext && kEpiBufs >= 2 && !e.use_lent && next_last >= e.read_upto;
    if (free_next && e.t == 0) bulk_wait_read_at_most(e.groups - 1 - next_last);
    named_barrier_sync(1 + e.wg, 128);
    if (free_next) e.read_upto = next_last + 1;
    e.read_upto = e.read_pending > e.read_upto ? e.read_pending : e.read_upto;
    if (e.t == 0 && MOK_SM90_SKIP_EPILOGUE != 2) {
        epi_store_box(map, buf, c0, c1, c2, c3);
        bulk_commit_group();
    }
    ++e.groups;
}

/* The n <= BN / 64 column chunks j of a plain tile, stored as the boxes at coords(j) of map (an
 * int3, or an int4 whose w < 0 means a 3-D map). */
template <typename Coords>
__device__ __forceinline__ void store_plain_chunks(epi_stager& e, const float* acc, int n, const CUtensorMap* map,
                                                   Coords&& coords) {
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
        if (j >= n) break;
        const uint32_t buf = epi_stage_acc(e, acc, j);
        const auto c = coords(j);
        if constexpr (sizeof(c) == sizeof(int4)) {
            epi_store(e, buf, map, c.x, c.y, c.z, c.w);
        } else {
            epi_store(e, buf, map, c.x, c.y, c.z);
        }
    }
}

/* A consumer warpgroup takes the last stage of a tile's mainloop for its epilogue: called by both
 * warpgroups once their wgmma on it has drained (the barrier: the other one has too, so B is free). */
template <typename Layout>
__device__ __forceinline__ void epi_lend_stage(Layout& s, epi_stager& e, uint32_t stage) {
    named_barrier_sync(3, 256);
    e.lent_a = mok_smem_u32(&s.a[stage][0]) + (uint32_t)e.wg * EPI_CHUNK_BYTES;
    e.lent_b = mok_smem_u32(&s.b[stage][0]) + (uint32_t)e.wg * 2 * EPI_CHUNK_BYTES;
    e.lent_stage = (int32_t)stage;
}

/* Gives a lent stage back to the producer once this warpgroup's stores have read it (thread 0 waits
 * for every store so far, then arrives for the warpgroup's 4 warps); called right after the next
 * K-block's wgmma is issued, so the wait overlaps the tensor cores' work. */
template <int kCluster, typename Layout>
__device__ __forceinline__ void epi_return_stage(Layout& s, epi_stager& e) {
    e.use_lent = false;
    if (e.lent_stage < 0) return;
    if (e.t == 0) {
        bulk_wait_group_read<0>();
#pragma unroll
        for (int w = 0; w < 4; ++w) release_stage<kCluster>(s, (uint32_t)e.lent_stage);
    }
    e.read_pending = e.groups;
    e.lent_stage = -1;
}

/* The warpgroup's last store: the shared memory must outlive the reads (and a lent stage is not
 * needed any more: the producer is done). */
__device__ __forceinline__ void epi_finish(epi_stager& e) {
    if (e.t == 0) bulk_wait_group<0>();
}

/* The plan offsets [E + 1] the tile walk reads: the shared-memory copy when it fits.
 * NOTE: a tile's expert lookup is a binary search; over global memory (with 64-bit scheduler
 * divisions) the consumers' tile setup took about 1.5 us per tile, measured, with the tensor
 * cores idle; 1.0 us with this copy and 32-bit divisions. */
__device__ __forceinline__ const int32_t* plan_offsets(const smem_layout& s, const params& p) {
    return p.E + 1 <= kSmemOffsets ? s.offsets : p.offsets;
}

/* Walk of the expert segments of a tile: experts whose rows intersect [m0, m0 + BM). */
struct segment_walk {
    int32_t e, e_last;
};

__device__ __forceinline__ segment_walk segments_of(const params& p, const int32_t* offs, int64_t m0,
                                                    int64_t rows_used) {
    segment_walk w;
    const int64_t off0 = offs[0];
    const int64_t first = m0 < off0 ? off0 : m0;
    int64_t last = m0 + BM - 1;
    last = last >= rows_used ? rows_used - 1 : last;
    if (first > last) {
        w.e = 1;
        w.e_last = 0;
        return w;
    }
    /* one search; the last row's expert by walking on (mok's plans: no step, tiles never straddle) */
    w.e = (int32_t)mok_expert_of_row(offs, p.E, first);
    w.e_last = w.e;
    while (w.e_last + 1 < p.E && (int64_t)offs[w.e_last + 1] <= last) ++w.e_last;
    return w;
}

/* The expert segments of the pair of M-tiles of a 2-CTA cluster, walked in lockstep ("passes").
 * The two CTAs must consume the same number of ring stages per unit (the producers write into each
 * other's stages), so a unit runs max(segments of either tile) passes; a CTA with fewer segments
 * runs its peer's expert in the extra passes (dummy passes: loads and MMAs, no epilogue). A pass
 * whose two experts are the same loads half of B in each CTA and multicasts it to both.
 * With one CTA per cluster the peer walk is empty and the passes are the tile's segments. */
__device__ __forceinline__ segment_walk skip_empty(const int32_t* offs, segment_walk w) {
    while (w.e <= w.e_last && offs[w.e] == offs[w.e + 1]) ++w.e;
    return w;
}

struct pass_walk {
    segment_walk mine, peer;
};

__device__ __forceinline__ pass_walk passes_of(const params& p, const int32_t* offs, int64_t m0, int64_t m0_peer,
                                               bool has_peer, int64_t rows_used) {
    pass_walk w;
    w.mine.e = 1;
    w.mine.e_last = 0;
    w.peer = w.mine;
    if (m0 < rows_used) w.mine = skip_empty(offs, segments_of(p, offs, m0, rows_used));
    if (has_peer && m0_peer < rows_used) w.peer = skip_empty(offs, segments_of(p, offs, m0_peer, rows_used));
    return w;
}

__device__ __forceinline__ bool pass_more(const pass_walk& w) {
    return w.mine.e <= w.mine.e_last || w.peer.e <= w.peer.e_last;
}
/* This CTA's own segment (false: a dummy pass on the peer's expert). */
__device__ __forceinline__ bool pass_real(const pass_walk& w) { return w.mine.e <= w.mine.e_last; }
__device__ __forceinline__ int32_t pass_expert(const pass_walk& w) { return pass_real(w) ? w.mine.e : w.peer.e; }
/* Both CTAs run the same expert in this pass (so they share its B tiles). */
__device__ __forceinline__ bool pass_shared(const pass_walk& w) {
    const int32_t peer_e = w.peer.e <= w.peer.e_last ? w.peer.e : w.mine.e;
    return pass_expert(w) == peer_e;
}
__device__ __forceinline__ void pass_advance(const int32_t* offs, pass_walk& w) {
    if (w.mine.e <= w.mine.e_last) w.mine = skip_empty(offs, segment_walk{w.mine.e + 1, w.mine.e_last});
    if (w.peer.e <= w.peer.e_last) w.peer = skip_empty(offs, segment_walk{w.peer.e + 1, w.peer.e_last});
}
/* The last pass of the unit. */
__device__ __forceinline__ bool pass_last(const int32_t* offs, pass_walk w) {
    pass_advance(offs, w);
    return !pass_more(w);
}

/* The walk over units of kCluster M-tiles of `rows` rows (pairs for a 2-CTA cluster). */
template <int kCluster>
__device__ __forceinline__ void sched_units(mok_tile_sched* sched, int64_t groups, int64_t rows, int64_t n_tiles,
                                            int64_t rows_used) {
    mok_sched_init(sched, groups, (rows + BM * kCluster - 1) / (BM * kCluster), n_tiles, BM * kCluster, rows_used);
    mok_sched_per_cluster(sched, kCluster);
}

/* This CTA's M-tile of a unit of kCluster M-tiles (rank r takes M-tile kCluster * unit + r). */
template <int kCluster>
__device__ __forceinline__ mok_tile cta_tile(const mok_tile& unit, uint32_t rank, int64_t rows_used) {
    mok_tile t = unit;
    t.m_tile = unit.m_tile * kCluster + rank;
    t.m0 = unit.m0 + (int64_t)rank * BM;
    t.in_use = t.m0 < rows_used ? 1 : 0;
    return t;
}

/* ------------------------------------------------------------------------------------------------
 * producer
 * ---------------------------------------------------------------------------------------------- */
template <bool kSwiGLU, bool kGather, bool kBMN, int kCluster>
__device__ __forceinline__ void produce(smem_layout& s, const params& p, const CUtensorMap* tma_a,
                                        const CUtensorMap* tma_b, int64_t rows_used) {
    const int tid = threadIdx.x; /* 0..127 */
    const int32_t* offs = plan_offsets(s, p);
    const int64_t num_kb = (p.Kd + BK - 1) / BK;
    const uint32_t rank = kCluster > 1 ? cluster_ctarank() : 0;
    uint32_t stage = 0, phase = 0;
    mok_tile_sched sched;
    sched_units<kCluster>(&sched, 1, p.R, p.num_n_tiles, rows_used);
    mok_tile unit;
    while (mok_sched_next_tile(&sched, &unit)) {
        const mok_tile tile = cta_tile<kCluster>(unit, rank, rows_used);
        pass_walk w = passes_of(p, offs, tile.m0, unit.m0 + (int64_t)(rank ^ 1) * BM, kCluster > 1, rows_used);
        if (!pass_more(w)) continue;
        mok_sched_wait_ready(&tile);
        const int32_t n_coord = (int32_t)(tile.n_tile * (kSwiGLU ? BN / 2 : BN));
        /* ---- gathered rows of this thread (chunk tid % 8 of rows tid / 8 + 16 j), once per tile ----
         * NOTE: resolving a_gather[r] / a_gather_div per K-block costs the producer more issue
         * slots than the copies themselves. */
        const __nv_bfloat16* rows[kGather ? BM / 16 : 1];
        if (kGather) {
#pragma unroll
            for (int j = 0; j < BM / 16; ++j) {
                const int64_t r = tile.m0 + (tid >> 3) + 16 * j;
                const int32_t src = (r < p.R) ? p.a_gather[r] : -1;
                rows[j] = src >= 0 ? p.a + (int64_t)(src / p.a_gather_div) * p.Kd + (tid & 7) * 8 : nullptr;
            }
        }
        for (; pass_more(w); pass_advance(offs, w)) {
            const int32_t e = pass_expert(w);
            const bool shared = kCluster > 1 && pass_shared(w);
            for (int64_t kb = 0; kb < num_kb; ++kb) {
                /* ---- wait until the consumers (of both CTAs, in a cluster) have released the stage ---- */
                mbarrier_wait_parity(&s.empty[stage], phase ^ 1);
                const int32_t k0 = (int32_t)(kb * BK);
                if (tid == 0) {
                    mbarrier_arrive_expect_tx(&s.full[stage], B_STAGE_BYTES + (kGather ? 0 : A_STAGE_BYTES));
                    /* ---- issue TMA for B: two 128-row boxes (gate | up, or n0 | n0 + 128), or
                     * four [64 K][64 N] chunks of the N-major weight; shared: this CTA loads its
                     * half (box or chunk pair `rank`) into both CTAs ---- */
                    if (kBMN && p.split_rows) {
                        /* split weight: K-block k0 lies in one half (split_rows % BK == 0, checked by the
                         * host), at plane half ^ split_flip of the [2, E, K / 2, N] map */
                        const int32_t half = k0 >= p.split_rows ? 1 : 0;
                        const int32_t kk = k0 - half * (int32_t)p.split_rows, plane = half ^ p.split_flip;
#pragma unroll
                        for (int j = 0; j < BN / MN_CHUNK; ++j) {
                            if (shared && (j >> 1) != (int)rank) continue;
                            __nv_bfloat16* dst = &s.b[stage][j * MN_CHUNK_ELEMS];
                            if (shared)
                                tma_load_4d_multicast(dst, tma_b, &s.full[stage], 0x3, n_coord + j * MN_CHUNK, kk, e,
                                                      plane);
                            else
                                tma_load_4d(dst, tma_b, &s.full[stage], n_coord + j * MN_CHUNK, kk, e, plane);
                        }
                    } else if (kBMN) {
#pragma unroll
                        for (int j = 0; j < BN / MN_CHUNK; ++j) {
                            if (shared && (j >> 1) != (int)rank) continue;
                            __nv_bfloat16* dst = &s.b[stage][j * MN_CHUNK_ELEMS];
                            if (shared)
                                tma_load_3d_multicast(dst, tma_b, &s.full[stage], 0x3, n_coord + j * MN_CHUNK, k0, e);
                            else
                                tma_load_3d(dst, tma_b, &s.full[stage], n_coord + j * MN_CHUNK, k0, e);
                        }
                    } else {
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            if (shared && h != (int)rank) continue;
                            __nv_bfloat16* dst = &s.b[stage][h * (BN / 2) * BK];
                            /* gate / up rows of the [E, 2, I, K] view, or rows n0 + 128 h; a split weight's
                             * gate (h = 0) / up rows at plane h ^ split_flip of its [2, E, I, K] map
                             * (NOTE: coordinates chosen, not a second loop: that one spilled the SwiGLU
                             * producer more) */
                            const int32_t c1 = kSwiGLU ? n_coord : n_coord + h * (BN / 2);
                            int32_t c2 = kSwiGLU ? h : 0, c3 = e;
                            if (kSwiGLU && p.split_rows) {
                                c2 = e;
                                c3 = h ^ p.split_flip;
                            }
                            if (shared)
                                tma_load_4d_multicast(dst, tma_b, &s.full[stage], 0x3, k0, c1, c2, c3);
                            else
                                tma_load_4d(dst, tma_b, &s.full[stage], k0, c1, c2, c3);
                        }
                    }
                    /* ---- issue TMA for A (contiguous rows; past R: zero-filled) ---- */
                    if (!kGather) tma_load_2d(&s.a[stage][0], tma_a, &s.full[stage], k0, (int32_t)tile.m0);
                }
                if (kGather) {
                    /* ---- gather-on-load of A: 16-byte cp.async per chunk, 128B swizzle by hand ---- */
                    const int chunk = tid & 7;
                    const bool k_ok = (int64_t)k0 + chunk * 8 < p.Kd;
                    char* a_base = reinterpret_cast<char*>(&s.a[stage][0]);
#pragma unroll
                    for (int j = 0; j < BM / 16; ++j) {
                        const int row = (tid >> 3) + 16 * j;
                        const bool ok = rows[j] != nullptr && k_ok;
                        /* NOTE: the 128B swizzle moves 16-byte chunk c of row r to chunk c ^ (r % 8). */
                        char* dst = a_base + row * 128 + ((chunk ^ (row & 7)) << 4);
                        cp_async_16(dst, ok ? rows[j] + k0 : p.a, ok ? 16u : 0u);
                    }
                    cp_async_mbarrier_arrive_noinc(&s.full[stage]);
                }
                if (++stage == kStages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------------
 * consumers
 * ---------------------------------------------------------------------------------------------- */
template <bool kSwiGLU>
__device__ __forceinline__ void store_zero_row(const params& p, int64_t row, int64_t n_tile, int lane4) {
    /* One thread writes its column pairs of one row of the tile. */
    if (kSwiGLU) {
        const int64_t I = p.N / 2;
        for (int i = 0; i < BN / 16; ++i) {
            const int64_t c = n_tile * (BN / 2) + i * 8 + lane4 * 2;
            if (c < I) {
                store_bf16x2(p.out + row * p.N + c, 0.f, 0.f);
                store_bf16x2(p.out + row * p.N + I + c, 0.f, 0.f);
                store_bf16x2(p.swiglu_out + row * I + c, 0.f, 0.f);
            }
        }
    } else {
        for (int i = 0; i < BN / 8; ++i) {
            const int64_t c = n_tile * BN + i * 8 + lane4 * 2;
            if (c < p.N) store_bf16x2(p.out + row * p.N + c, 0.f, 0.f);
        }
    }
}

/* Descriptor of the k16-th K step of an operand tile at smem_addr. */
template <bool kMN>
__device__ __forceinline__ uint64_t operand_desc(uint32_t smem_addr, int k16) {
    /* NOTE: K-major: a K step of 16 bf16 is 32 bytes inside the 128-byte swizzled row;
     * MN-major: it is 16 rows of 128 bytes. */
    return kMN ? wgmma_desc_mnmajor_sw128(smem_addr + k16 * 16 * 128, MN_CHUNK_BYTES)
               : wgmma_desc_kmajor_sw128(smem_addr + k16 * 32);
}

/* The mainloop of one tile: wait for each K-block's stage, 4 wgmma k16 steps on it; the stage of
 * the previous K-block is released once its wgmma group has retired (one group stays in flight).
 * A stage lent to the previous tile's epilogue is given back while the first K-block runs. The
 * last stage is released, or with lend_last (both warpgroups must agree) lent to this tile's
 * epilogue. kQdqA: each warpgroup first replaces its 64 rows of A (K-major) by their MXFP8
 * quantise-dequantise, in place (quant/qdq_mxfp8_smem.cuh), while its previous K-block's wgmma runs. */
template <bool kGather, bool kAMN, bool kBMN, int kCluster, bool kQdqA, typename Hook>
__device__ __forceinline__ void consume_kblocks(smem_layout& s, float* acc, int64_t num_kb, uint32_t& stage,
                                                uint32_t& phase, int wg, int lane, epi_stager& epi, bool lend_last,
                                                Hook&& while_first_kblock_runs) {
    static_assert(!kQdqA || !kAMN, "the on-load qdq reads K-major rows of A");
    uint32_t prev_stage = 0;
    for (int64_t kb = 0; kb < num_kb; ++kb) {
        const long long t_wait = MOK_TIMING_NOW();
        mbarrier_wait_parity(&s.full[stage], phase);
        MOK_TIMING_ADD(TIMING_FULL_WAIT, t_wait);
        if (kQdqA) {
            mok_qdq::qdq_rows_kmajor_sw128(shared_u32x4{}, mok_smem_u32(&s.a[stage][wg * 64 * BK]),
                                           (int)(threadIdx.x & 127));
            /* NOTE: the rows were written through the generic proxy and wgmma reads through the
             * async proxy: each thread fences its writes, then the warpgroup meets (its wgmma reads
             * all 64 rows). The fence also orders them before the producer's next TMA write into
             * the stage, which follows this warpgroup's release of it. */
            fence_proxy_async_shared();
            named_barrier_sync(1 + wg, 128);
        }
        /* NOTE: gathered A was written by cp.async (generic proxy); wgmma reads through the async
         * proxy, so order the two in this thread before the first wgmma. */
        if (kGather && !kQdqA) fence_proxy_async_shared();
        /* NOTE: a warpgroup's 64 rows of A are 8 KiB in both layouts (64 K-major rows, or one
         * MN-major chunk). */
        const uint32_t a_addr = mok_smem_u32(&s.a[stage][wg * 64 * BK]);
        const uint32_t b_addr = mok_smem_u32(&s.b[stage][0]);
        wgmma_fence();
#pragma unroll
        for (int k16 = 0; k16 < BK / 16; ++k16) {
            wgmma_m64n256k16_f32_bf16<kAMN, kBMN>(acc, operand_desc<kAMN>(a_addr, k16), operand_desc<kBMN>(b_addr, k16),
                                                  (kb > 0 || k16 > 0) ? 1 : 0);
        }
        wgmma_commit_group();
        /* NOTE: the tensor cores run this K-block while the hook runs: the consumers' work for
         * the next tile (scheduler, expert lookup) and the wait for the previous tile's stores to
         * have read a lent stage cost no tensor-core time here. */
        if (kb == 0) {
            while_first_kblock_runs();
            /* (measured, v26: giving it back one K-block later was 1% slower) */
            epi_return_stage<kCluster>(s, epi);
        }
        wgmma_wait_group<1>();
        /* ---- release the previous stage: one arrival per consumer warp (in both CTAs of a
         * cluster: either producer writes into both) ---- */
        if (kb > 0 && lane == 0) release_stage<kCluster>(s, prev_stage);
        prev_stage = stage;
        if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
        }
    }
    const long long t_drain = MOK_TIMING_NOW();
    wgmma_wait_group<0>();
    if (num_kb > 0) {
        if (MOK_SM90_EPI_LEND && lend_last) {
            epi_lend_stage(s, epi, prev_stage);
        } else if (lane == 0) {
            release_stage<kCluster>(s, prev_stage);
        }
    }
    MOK_TIMING_ADD(TIMING_DRAIN, t_drain); /* (with the lending's barrier between the warpgroups) */
}

/* TMA-store epilogue of a tile whose rows all belong to one expert segment: this warpgroup's rows
 * [row0, row0 + 64) (the maps clip rows past R and columns past N or I). */
template <bool kSwiGLU>
__device__ __forceinline__ void store_tile_tma(epi_stager& e, const params& p, const float* acc, int64_t n_tile,
                                               int32_t row0, const CUtensorMap* tma_out, const CUtensorMap* tma_act) {
    if (MOK_SM90_SKIP_EPILOGUE == 1) return;
    if (kSwiGLU) {
        /* ---- h = [gate | up] through the [R, 2, I] map, act through the [R, I] map ---- */
        const int64_t I = p.N / 2;
#pragma unroll
        for (int j = 0; j < BN / 2 / 64; ++j) {
            const int32_t c = (int32_t)(n_tile * (BN / 2) + 64 * j);
            if (c >= I) break;
            uint32_t buf = epi_stage_acc(e, acc, j);
            epi_store(e, buf, tma_out, c, 0, row0);
            buf = epi_stage_acc(e, acc, j + BN / 2 / 64);
            epi_store(e, buf, tma_out, c, 1, row0);
            buf = epi_acquire(e);
            epi_put_chunk(e, buf, [&](int ci, int h) {
                const int ig = (8 * j + ci) * 4 + 2 * h;
                return swiglu_of_rounded(acc, ig, ig + (BN / 2 / 8) * 4);
            });
            epi_store(e, buf, tma_act, c, row0, 0);
        }
    } else {
        const int64_t c0 = n_tile * BN;
        const int n = (int)((p.N - c0 + 63) / 64 < BN / 64 ? (p.N - c0 + 63) / 64 : BN / 64);
        store_plain_chunks(e, acc, n, tma_out, [&](int j) { return make_int3((int)c0 + 64 * j, row0, 0); });
    }
}

template <bool kSwiGLU, bool kGather, bool kBMN, int kCluster, bool kQdqA>
__device__ __forceinline__ void consume(smem_layout& s, const params& p, int64_t rows_used, const CUtensorMap* tma_out,
                                        const CUtensorMap* tma_act) {
    const int wg = (threadIdx.x / 128) - 1; /* consumer warpgroup 0 or 1: rows wg * 64 .. + 64 */
    const int t = threadIdx.x & 127;
    const int warp = t >> 5, lane = t & 31;
    const int lane4 = lane & 3;
    /* Rows of this thread inside the tile (wgmma accumulator layout): r_lo and r_lo + 8. */
    const int r_lo = wg * 64 + warp * 16 + (lane >> 2);
    const int64_t num_kb = (p.Kd + BK - 1) / BK;
    const int32_t* offs = plan_offsets(s, p);
    const int64_t off0 = offs[0];
    const uint32_t rank = kCluster > 1 ? cluster_ctarank() : 0;
    uint32_t stage = 0, phase = 0;
    float acc[BN / 2];
    epi_stager epi = make_epi_stager(mok_smem_u32(&s.epi[wg][0][0]), wg, t);

    mok_tile_sched sched;
    sched_units<kCluster>(&sched, 1, p.R, p.num_n_tiles, rows_used);
    /* The next tile and its expert segments are looked up while the current tile's first K-block
     * runs on the tensor cores (measured: 1.0 us per tile between tiles otherwise). */
    struct tile_job {
        mok_tile tile;
        pass_walk w;
        bool valid;
    };
    auto fetch = [&](tile_job& j) {
        mok_tile unit;
        j.valid = mok_sched_next_tile(&sched, &unit);
        if (!j.valid) return;
        j.tile = cta_tile<kCluster>(unit, rank, rows_used);
        j.w = passes_of(p, offs, j.tile.m0, unit.m0 + (int64_t)(rank ^ 1) * BM, kCluster > 1, rows_used);
    };
    tile_job cur;
    fetch(cur);
    long long t_setup = MOK_TIMING_NOW();
    while (cur.valid) {
        const mok_tile tile = cur.tile;
        tile_job next;
        bool fetched = false;
        auto fetch_next = [&] {
            if (!fetched) fetch(next);
            fetched = true;
        };
        /* ---- rows outside [offsets[0], rows in use) are zeros ---- */
        for (int h = 0; h < 2; ++h) {
            const int64_t row = tile.m0 + r_lo + 8 * h;
            if (row < p.R && (row < off0 || row >= rows_used)) store_zero_row<kSwiGLU>(p, row, tile.n_tile, lane4);
        }
        for (pass_walk w = cur.w; pass_more(w); pass_advance(offs, w)) {
            const bool last_pass = pass_last(offs, w);
            MOK_TIMING_ADD(TIMING_SETUP, t_setup);
            /* the pass's rows: the whole tile (mok's plans: TMA stores, through the lent last stage) or
             * a segment of it (stores from registers) */
            const int64_t seg_lo = pass_real(w) ? offs[w.mine.e] : 0, seg_hi = pass_real(w) ? offs[w.mine.e + 1] : 0;
            const int64_t tile_end = tile.m0 + BM < p.R ? tile.m0 + BM : p.R;
            const bool whole_tile = pass_real(w) && seg_lo <= tile.m0 && seg_hi >= tile_end;
            const long long t_main = MOK_TIMING_NOW();
            auto fetch_after_last_pass = [&] {
                if (last_pass) fetch_next();
            };
            consume_kblocks<kGather, false, kBMN, kCluster, kQdqA>(s, acc, num_kb, stage, phase, wg, lane, epi,
                                                                  whole_tile, fetch_after_last_pass);
            MOK_TIMING_ADD(TIMING_MAINLOOP, t_main);
            MOK_TIMING_COUNT(TIMING_TILES);
            if (!pass_real(w)) {
                /* ---- a dummy pass (the peer's expert, for the peer's sake): nothing to store ---- */
                t_setup = MOK_TIMING_NOW();
                continue;
            }
            if (whole_tile) {
                /* ---- epilogue: the whole tile is one segment (mok's plans): TMA stores ---- */
                const long long t_epi = MOK_TIMING_NOW();
                const int64_t row0 = tile.m0 + 64 * wg;
                epi_begin_tile(epi, num_kb > 0);
                if (row0 < p.R) store_tile_tma<kSwiGLU>(epi, p, acc, tile.n_tile, (int32_t)row0, tma_out, tma_act);
                MOK_TIMING_ADD(TIMING_EPILOGUE, t_epi);
                t_setup = MOK_TIMING_NOW();
                continue;
            }
            /* ---- epilogue: rows of this segment only, from registers ---- */
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int64_t row = tile.m0 + r_lo + 8 * h;
                if (row < seg_lo || row >= seg_hi || row >= p.R) continue;
                if (kSwiGLU) {
                    const int64_t I = p.N / 2;
#pragma unroll
                    for (int i = 0; i < BN / 16; ++i) {
                        const int64_t c = tile.n_tile * (BN / 2) + i * 8 + lane4 * 2;
                        if (c >= I) continue;
                        const float g0 = acc[i * 4 + 2 * h], g1 = acc[i * 4 + 2 * h + 1];
                        const float u0 = acc[(i + BN / 16) * 4 + 2 * h], u1 = acc[(i + BN / 16) * 4 + 2 * h + 1];
                        store_bf16x2(p.out + row * p.N + c, g0, g1);
                        store_bf16x2(p.out + row * p.N + I + c, u0, u1);
                        /* SwiGLU of the stored (rounded) values: equals the swiglu op on h. */
                        const float rg0 = __bfloat162float(__float2bfloat16_rn(g0));
                        const float rg1 = __bfloat162float(__float2bfloat16_rn(g1));
                        const float ru0 = __bfloat162float(__float2bfloat16_rn(u0));
                        const float ru1 = __bfloat162float(__float2bfloat16_rn(u1));
                        store_bf16x2(p.swiglu_out + row * I + c, mok_swiglu(rg0, ru0), mok_swiglu(rg1, ru1));
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < BN / 8; ++i) {
                        const int64_t c = tile.n_tile * BN + i * 8 + lane4 * 2;
                        if (c < p.N) store_bf16x2(p.out + row * p.N + c, acc[i * 4 + 2 * h], acc[i * 4 + 2 * h + 1]);
                    }
                }
            }
        }
        fetch_next();
        cur = next;
    }
    /* ---- the shared memory must outlive the last TMA stores' reads ---- */
    epi_finish(epi);
}

/* ------------------------------------------------------------------------------------------------
 * weight-gradient variant: one group per expert, K = the expert's rows [offsets[e], offsets[e+1])
 * ---------------------------------------------------------------------------------------------- */

/* K-blocks of expert e on the wgmma path, or -1 when its rows are not 64-aligned (such a tile runs
 * on the consumers' FMA fallback: mok's CUDA plans are 128-aligned, user offsets may not be). */
__device__ __forceinline__ int64_t wgrad_kblocks(const params& p, const int32_t* offs, int64_t e) {
    const int64_t lo = offs[e], hi = offs[e + 1];
    if (lo % BK || hi % BK || hi < lo || hi > p.R) return -1;
    return (hi - lo) / BK;
}

template <int kCluster>
__device__ __forceinline__ void produce_wgrad(smem_layout& s, const params& p, const CUtensorMap* tma_a,
                                              const CUtensorMap* tma_b) {
    if (threadIdx.x != 0) return; /* TMA only: one thread issues everything */
    const int32_t* offs = plan_offsets(s, p);
    const uint32_t rank = kCluster > 1 ? cluster_ctarank() : 0;
    uint32_t stage = 0, phase = 0;
    mok_tile_sched sched;
    sched_units<kCluster>(&sched, p.E, p.M, p.num_n_tiles, INT64_MAX);
    mok_tile unit;
    while (mok_sched_next_tile(&sched, &unit)) {
        /* both CTAs of a cluster: the same expert, K-blocks and N-tile, so B is always shared */
        const mok_tile tile = cta_tile<kCluster>(unit, rank, INT64_MAX);
        const int64_t num_kb = wgrad_kblocks(p, offs, tile.group);
        const int32_t lo = offs[tile.group];
        const int32_t n0 = (int32_t)(tile.n_tile * BN);
        for (int64_t kb = 0; kb < num_kb; ++kb) {
            mbarrier_wait_parity(&s.empty[stage], phase ^ 1);
            const int32_t k0 = lo + (int32_t)(kb * BK);
            mbarrier_arrive_expect_tx(&s.full[stage], B_STAGE_BYTES + A_STAGE_BYTES);
            /* ---- MN-major chunks [64 rows][64 columns]: 2 of a (past M: zero-filled), 4 of b (in a
             * cluster: chunks 2 rank, 2 rank + 1, into both CTAs) ---- */
#pragma unroll
            for (int j = 0; j < BM / MN_CHUNK; ++j)
                tma_load_3d(&s.a[stage][j * MN_CHUNK_ELEMS], tma_a, &s.full[stage], (int32_t)tile.m0 + j * MN_CHUNK, k0, 0);
#pragma unroll
            for (int j = 0; j < BN / MN_CHUNK; ++j) {
                if (kCluster > 1) {
                    if ((j >> 1) == (int)rank)
                        tma_load_3d_multicast(&s.b[stage][j * MN_CHUNK_ELEMS], tma_b, &s.full[stage], 0x3,
                                              n0 + j * MN_CHUNK, k0, 0);
                } else {
                    tma_load_3d(&s.b[stage][j * MN_CHUNK_ELEMS], tma_b, &s.full[stage], n0 + j * MN_CHUNK, k0, 0);
                }
            }
            if (++stage == kStages) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
}

template <int kCluster>
__device__ __forceinline__ void consume_wgrad(smem_layout& s, const params& p, const CUtensorMap* tma_out) {
    const int wg = (threadIdx.x / 128) - 1;
    const int t = threadIdx.x & 127;
    const int warp = t >> 5, lane = t & 31;
    const int lane4 = lane & 3;
    const int r_lo = wg * 64 + warp * 16 + (lane >> 2);
    const int32_t* offs = plan_offsets(s, p);
    const uint32_t rank = kCluster > 1 ? cluster_ctarank() : 0;
    uint32_t stage = 0, phase = 0;
    float acc[BN / 2];
    epi_stager epi = make_epi_stager(mok_smem_u32(&s.epi[wg][0][0]), wg, t);

    mok_tile_sched sched;
    sched_units<kCluster>(&sched, p.E, p.M, p.num_n_tiles, INT64_MAX);
    mok_tile unit;
    while (mok_sched_next_tile(&sched, &unit)) {
        const mok_tile tile = cta_tile<kCluster>(unit, rank, INT64_MAX);
        const int64_t num_kb = wgrad_kblocks(p, offs, tile.group);
        if (num_kb > 0) {
            consume_kblocks<false, true, true, kCluster, false>(s, acc, num_kb, stage, phase, wg, lane, epi, true,
                                                                [] {});
        } else {
            /* ---- no rows (zeros), or unaligned rows: one FMA chain per output, in row order ---- */
            int64_t lo = offs[tile.group], hi = num_kb == 0 ? lo : offs[tile.group + 1];
            lo = lo < 0 ? 0 : lo;
            hi = hi > p.R ? p.R : hi;
#pragma unroll
            for (int i = 0; i < BN / 8; ++i) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int64_t m = tile.m0 + r_lo + 8 * h;
                        const int64_t n = tile.n_tile * BN + i * 8 + lane4 * 2 + c;
                        float v = 0.f;
                        if (m < p.M && n < p.N) {
                            for (int64_t r = lo; r < hi; ++r)
                                v = fmaf(__bfloat162float(p.wa[r * p.M + m]), __bfloat162float(p.wb[r * p.N + n]), v);
                        }
                        acc[i * 4 + 2 * h + c] = v;
                    }
                }
            }
        }
        /* ---- epilogue: out[e, m, n] through the [E, M, N] map (clips m past M, n past N) ---- */
        const int64_t m0 = tile.m0 + 64 * wg;
        epi_begin_tile(epi, num_kb > 0);
        if (m0 >= p.M) continue;
        const int64_t c0 = tile.n_tile * BN;
        const int n = (int)((p.N - c0 + 63) / 64 < BN / 64 ? (p.N - c0 + 63) / 64 : BN / 64);
        if (p.split_rows) {
            /* split output: the chunk's 64 rows lie in one half (split_rows % 64 == 0, checked by the host) */
            const int32_t half = m0 >= p.split_rows ? 1 : 0;
            const int32_t mm = (int32_t)(m0 - half * p.split_rows), plane = half ^ p.split_flip;
            store_plain_chunks(epi, acc, n, tma_out,
                               [&](int j) { return make_int4((int)c0 + 64 * j, mm, (int)tile.group, plane); });
        } else {
            store_plain_chunks(epi, acc, n, tma_out,
                               [&](int j) { return make_int3((int)c0 + 64 * j, (int)m0, (int)tile.group); });
        }
    }
    epi_finish(epi);
}

/* kQdqA: A's rows quantise-dequantised to MXFP8 (1 x 32 blocks along K) on load, in the consumers
 * (consume_kblocks): out = qdq_mxfp8_rows(A) . B, bit for bit the plain kernel on the row-wise qdq copy. */
template <bool kSwiGLU, bool kGather, bool kBMN, bool kWgrad, int kCluster, bool kQdqA = false>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_bf16_nt_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                                const __grid_constant__ CUtensorMap tma_out, const __grid_constant__ CUtensorMap tma_act,
                                const params p) {
    static_assert(!kWgrad || (!kSwiGLU && !kGather && !kBMN && !kQdqA),
                  "the weight-gradient variant reads both operands by TMA");
    static_assert(!(kSwiGLU && kBMN), "the SwiGLU epilogue reads gate and up rows of a K-major weight");
    static_assert(kCluster == 1 || kCluster == 2, "one CTA, or a pair sharing B by multicast");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    /* NOTE: the 128B swizzle pattern is a function of address bits [9:4]: align the ring to 1024. */
    smem_layout& s = *reinterpret_cast<smem_layout*>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);

    /* ---- barriers: full waits for the producer's bytes (and cp.async arrivals), empty for
     * one arrival per consumer warp ---- */
    if (threadIdx.x == 0) {
        for (int i = 0; i < kStages; ++i) {
            mbarrier_init(&s.full[i], kGather ? 1 + 128 : 1);
            mbarrier_init(&s.empty[i], 8 * kCluster); /* every consumer warp of the cluster */
        }
        fence_mbarrier_init();
        tma_prefetch_descriptor(&tma_b);
        if (!kGather) tma_prefetch_descriptor(&tma_a);
    }
    if (p.E + 1 <= kSmemOffsets) {
        for (int i = threadIdx.x; i <= p.E; i += kThreads) s.offsets[i] = p.offsets[i];
    }
    /* NOTE: in a cluster the peer's first multicast may land before this CTA's producer starts, so
     * its barriers must be initialised cluster-wide first. */
    if (kCluster > 1) {
        cluster_sync();
    } else {
        __syncthreads();
    }

    if (threadIdx.x < 128) {
        setmaxnreg_dec<kProducerRegs>();
        if (kWgrad) {
            produce_wgrad<kCluster>(s, p, &tma_a, &tma_b);
        } else {
            produce<kSwiGLU, kGather, kBMN, kCluster>(s, p, &tma_a, &tma_b, mok_rows_in_use(plan_offsets(s, p), p.E, p.R));
        }
    } else {
        setmaxnreg_inc<kConsumerRegs>();
        if (kWgrad) {
            consume_wgrad<kCluster>(s, p, &tma_out);
        } else {
            consume<kSwiGLU, kGather, kBMN, kCluster, kQdqA>(s, p, mok_rows_in_use(plan_offsets(s, p), p.E, p.R),
                                                             &tma_out, &tma_act);
        }
    }
    /* ---- a CTA's shared memory (stages, barriers) must outlive its peer's multicasts and
     * remote arrivals (NOTE: the barrier is .aligned: reconverge the producer warp first) ---- */
    if (kCluster > 1) {
        __syncwarp();
        cluster_sync();
    }
}

}  // namespace mok_sm90

#endif /* MOK_CUDA_GEMM_GROUPED_GEMM_SM90_CUH */
