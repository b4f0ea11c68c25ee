/*
 * FP8 (E4M3) blockwise-scaled grouped GEMM "NT" for sm_90a, first version (launcher:
 * grouped_gemm_fp8_sm90.cu; standalone check: benchmarks/sm90_fp8_gemm_check.cu):
 *
 *   out[r, n] = sum_kb  sa[r, kb] * sb[e(r), n / 128, kb] * sum_{k in block kb} A[r, k] B[e(r), n, k]
 *
 * A [R, K] e4m3 with 1x128 scales sa [R, K / 128] (fp32, row-major: mok.fp8's "blockwise_1x128"),
 * B [E, N, K] e4m3 with 128x128 scales sb [E, N / 128, K / 128] ("blockwise_128x128"), out [R, N]
 * bf16. DeepGEMM's scheme: each 128-wide K-block runs on the tensor cores into a partial fp32
 * accumulator, which is then scaled and added to the final one on the CUDA cores (FP32 promotion
 * every 128 of K; FP8 wgmma accumulates in reduced precision).
 *
 *   warpgroup 0      producer: TMA for the A and B tiles, cp.async (4 bytes) for the 128 A scales
 *                    and the one B scale of each K-block, all completing on the stage's full barrier;
 *   warpgroups 1, 2  consumers: 64 rows each, wgmma m64n128k32 e4m3, 64 partial + 64 final fp32
 *                    accumulators per thread; the epilogue of the BF16 kernel (stmatrix, TMA stores).
 *
 * Tile 128 x 128 x 128 (bytes: 16 KiB of A and 16 KiB of B per stage, one 128-byte swizzle row per
 * tile row), kStages-deep ring. The promotion waits for the K-block's wgmma (wait_group 0); the two
 * consumer warpgroups drift apart, so one promotes while the other's wgmma runs. A tile's first
 * K-block is issued before the previous tile's epilogue and runs under it (v31).
 *
 * SwiGLU variant (kSwiGLU, GEMM1 of the experts: B's rows are [gate | up], N = 2I): a tile's 128 columns
 * are gate rows [64 t, 64 t + 64) and up rows I + [64 t, 64 t + 64) of B (two 64-row TMA boxes, each in
 * one 128 x 128 scale block: I % 64 == 0), so its epilogue has both halves of 64 act columns and
 * writes h (gate and up chunks, at their columns of [R, 2I]) and act = SwiGLU(h) [R, I] from the
 * rounded h values, exactly as the swiglu op computes it from h (the BF16 kernel's SwiGLU epilogue).
 * Single CTAs only (no B multicast).
 *
 * Weight-gradient variant (kWgrad, a K-grouped GEMM: mok_grouped_gemm_fp8_wgrad_cuda):
 *
 *   out[e, m, n] = sum_{kb of expert e's rows} sa[m, kb] * sb[n, kb] * sum_{r in block kb} A[m, r] B[n, r]
 *
 * on the column-wise copies A [M, R] and B [N, R] (1 x 128 scales along R for both, stored MN-major:
 * sa [ceil(R / 128), M], sb [ceil(R / 128), N], so a stage's 128 + BN scales are two contiguous runs,
 * one bulk copy each): one tile group per expert, its K-blocks those of its 128-aligned rows. B's
 * scale differs per column, so the promotion multiplies per element (sa[row] * sb[col]): twice the
 * forward's CUDA-core work. kSbTiled (B quantised in 128 x 128 tiles of its [R, N] source, sb
 * [ceil(R / 128), N / 128]): the forward's promotion, one factor per row and 128-column block (v50).
 *
 * v1 limits: plans aligned to 128 rows (a tile never straddles experts; mok's CUDA plans are; a
 * misaligned offset is reported in the error word and nothing is computed); K % 128 == 0 and
 * N % 128 == 0 (whole scale blocks). Rows outside [offsets[0], offsets[E]) are written as zeros.
 */
#ifndef MOK_CUDA_GEMM_GROUPED_GEMM_FP8_SM90_CUH
#define MOK_CUDA_GEMM_GROUPED_GEMM_FP8_SM90_CUH

#include "../mok_cuda.h"
#include "../ptx/cluster.cuh"
#include "../ptx/smem.cuh"
#include "grouped_gemm_sm90.cuh"

namespace mok_sm90_fp8 {

using mok_sm90::epi_stager;

/* MOK_SM90_FP8_EPI_TILE (default 1 since v70; performance log v68): a plain tile's epilogue (forward and weight
 * gradient) stages all of a warpgroup's chunks into its own buffers (3 per warpgroup, 16 KiB more shared memory),
 * makes them visible with one proxy fence and one barrier, and issues chunk j's TMA store from lane 0 of the
 * warpgroup's warp j, so the stores go out in parallel instead of one barrier, fence and store issue by thread 0
 * per chunk. A buffer is reused a tile later, once its issuing lane has seen its store read it. v67's timing build
 * put a Qwen3 GEMM2 tile's epilogue at 1566 of 8045 cycles, nearly all of it staging, not waiting for stores.
 * Measured (H100, RESULTS v39): forward +0.1-2.4% alone, +1.1-3.4% on top of MOK_SM90_FP8_HALF_PIPE=4 (the two
 * together +3.4-6.5% over neither), weight gradients -0.3 to +4%, the same output bits. =0 is the per-chunk
 * stager. The SwiGLU variant's epilogue keeps the stager (2 of the buffers). */
#ifndef MOK_SM90_FP8_EPI_TILE
#define MOK_SM90_FP8_EPI_TILE 1
#endif
constexpr int kFp8EpiBufs = MOK_SM90_FP8_EPI_TILE ? 3 : (int)mok_sm90::kEpiBufs;
static_assert(kFp8EpiBufs >= (int)mok_sm90::kEpiBufs, "the stager's buffers come first");

/* Tile widths (performance log v30). The plain forward (MOK_SM90_FP8_BN_FWD) and the weight gradient
 * (MOK_SM90_FP8_BN_WGRAD) run 128 x 192 tiles: 96 + 96 fp32 accumulators per thread, a tile spanning
 * two 128-wide scale blocks of B (forward), and 13% fewer shared-memory bytes per MAC than 128 x 128
 * (at the FP8 rate a 128 x 128 tile's wgmma reads and TMA writes need 160 bytes per clock of the 128
 * an SM's shared memory delivers; 128 x 192, 139); measured +0-9% forward, +4% weight gradient. The
 * SwiGLU variant keeps 128 x 128 (64 gate + 64 up rows, each inside one 128 x 128 scale block). */
#ifndef MOK_SM90_FP8_BN_FWD
#define MOK_SM90_FP8_BN_FWD 192
#endif
#ifndef MOK_SM90_FP8_BN_WGRAD
#define MOK_SM90_FP8_BN_WGRAD 192
#endif

enum {
    BM = 128,
    BK = 128, /* bytes of FP8 along K: one 128B swizzle row */
    SCALE_BLOCK = 128,
    kThreads = 384,
    kProducerRegs = 40,
    kConsumerRegs = 232,
    STAGE_A_BYTES = BM * BK,
    BN_FWD = MOK_SM90_FP8_BN_FWD,
    BN_SWIGLU = 128,
    BN_WGRAD = MOK_SM90_FP8_BN_WGRAD,
};

struct params {
    const float* sa;        /* [R, Kd / 128] */
    const float* sb;        /* [E, N / 128, Kd / 128] */
    const int32_t* offsets; /* [E + 1], multiples of 128 */
    int32_t E;
    int64_t R, N, Kd;
    int64_t num_n_tiles, num_kb; /* ceil(N / the tile width), Kd / 128 */
    int64_t I;                   /* SwiGLU variant: N / 2, the row of B where the up half starts */
    int32_t* error_flag; /* host-mapped error word or NULL */
    /* wgrad: out [E, M, N]; the contraction runs over each expert's rows of the R-row space; sa, sb
     * are MN-major, [ceil(R / 128), M] and [ceil(R / 128), N] (kSbTiled: [ceil(R / 128), N / 128]) */
    int64_t M, num_m_tiles;
    /* wgrad, split output (torchtitan's w1 / w3 gradients): rows [0, split_rows) and [split_rows, M)
     * of every expert go to the planes 0 ^ split_flip and 1 ^ split_flip of a [2, E, M / 2, N] map
     * (split_rows % 64 == 0); 0: one [E, M, N] map */
    int64_t split_rows;
    int32_t split_flip;
};

/* MOK_SM90_FP8_SKIP_SCALE_LOADS=1: a timing experiment only (WRONG results): the producer loads no
 * per-row (and, wgrad, per-column) scales, to measure what those copies per stage cost. */
#ifndef MOK_SM90_FP8_SKIP_SCALE_LOADS
#define MOK_SM90_FP8_SKIP_SCALE_LOADS 0
#endif

/* (Tried and removed: TMA prefetches of K-block kb + 4 or + 8 into the L2 before the producer waits
 * for a free stage: 1051 -> 620 TFLOP/s on DeepSeek-V3 GEMM1; performance log v24.) */

/* ---- the tile walk: single CTAs, or 2-CTA clusters over pairs of M-tiles ----
 * With kCluster = 2 (MOK_SM90_FP8_CLUSTER=2 at run time) a cluster takes a unit of two M-tiles with
 * the same N-tile, rank r the M-tile 2u + r. Where both tiles run the same expert, each CTA loads
 * half of the B tile and multicasts it into both rings (24 KiB per K-block per SM from L2 instead
 * of 32). Where they do not, each loads its own B. Both CTAs always step through the same ring
 * stages (every forward tile has the same K-blocks) and release each stage in both CTAs; a CTA
 * whose tile has no expert while its peer's has runs a dummy mainloop on the peer's expert (its
 * output is discarded: zeros are stored, as for any tile outside the plan). */
struct fp8_job {
    mok_tile tile;  /* this CTA's tile */
    int32_t e_load; /* the expert whose B this CTA loads: its own, or (dummy) its peer's */
    bool compute;   /* this CTA's tile is in the plan */
    bool active;    /* this CTA or its peer computes: the pair runs the mainloop */
    bool shared;    /* both compute the same expert: B is multicast */
};

template <int kCluster>
__device__ __forceinline__ fp8_job fp8_job_of(const params& p, const mok_tile& unit, uint32_t rank, int64_t rows_used) {
    fp8_job j;
    j.tile = mok_sm90::cta_tile<kCluster>(unit, rank, rows_used);
    const int32_t e_me = j.tile.in_use ? (int32_t)mok_expert_of_row(p.offsets, p.E, j.tile.m0) : -1;
    int32_t e_peer = -1;
    if (kCluster > 1) {
        const mok_tile peer = mok_sm90::cta_tile<kCluster>(unit, rank ^ 1, rows_used);
        e_peer = peer.in_use ? (int32_t)mok_expert_of_row(p.offsets, p.E, peer.m0) : -1;
    }
    j.compute = e_me >= 0;
    j.active = e_me >= 0 || e_peer >= 0;
    j.shared = kCluster > 1 && e_me >= 0 && e_me == e_peer;
    j.e_load = e_me >= 0 ? e_me : e_peer;
    return j;
}

template <int kCluster>
__device__ __forceinline__ void fp8_sched_init(mok_tile_sched* sched, const params& p, int64_t rows_used) {
    mok_sched_init(sched, 1, (p.R + BM * kCluster - 1) / (BM * kCluster), p.num_n_tiles, BM * kCluster, rows_used);
    if (kCluster > 1) mok_sched_per_cluster(sched, kCluster);
}

/* (Measured and removed, v25: the A scales MN-major, a stage's 128 row scales as one bulk copy by the
 * TMA thread instead of 128 four-byte cp.async: 1-3% slower.) */
/* the forward's full-barrier arrivals: the TMA thread's expect_tx, plus the cp.async arrivals of
 * the 128 threads that copy the row scales */
enum { kFwdFullArrivals = 1 + 128 };

/* ---- consumers ---- */

/* Timing bound only (WRONG results): MOK_SM90_FP8_NO_PROMOTE=1 skips the FP32 promotion (still one
 * wait_group 0 per K-block); =2 also keeps one K-block's wgmma in flight (wait_group 1, the BF16
 * kernel's pipeline). Why: torch's row-wise FP8 kernel, which does neither, runs 19% more TFLOP/s per
 * GHz on the same problems (v25); this says how much of that is the promotion and how much the
 * drain per K-block. */
#ifndef MOK_SM90_FP8_NO_PROMOTE
#define MOK_SM90_FP8_NO_PROMOTE 0
#endif

/* MOK_SM90_FP8_HALF_PIPE=N (default 4 since v70, 0 turns it off; performance log v69): a 192-wide plain forward tile
 * (the weight gradient's: MOK_SM90_FP8_HALF_PIPE_WGRAD=N) runs each K-block as two commit groups, its 96-column
 * halves (m64n96k32, 48 of part's registers each), and promotes one half while the other is on the tensor cores:
 * lo(kb) retires, is promoted while hi(kb) runs; lo(kb + 1) is issued, hi(kb) retires and is promoted while
 * lo(kb + 1) runs; then hi(kb + 1) is issued. The K-blocks go in runs of N with nothing in flight between runs
 * (a tile's last nkb % N one at a time), so 2N - 1 of a run's 2N half-promotions have MMA of the warpgroup
 * queued, with no more registers (v16 and v24 gave K-block kb + 1 a second whole partial accumulator instead:
 * 64 more registers, slower). v31's timing build put 34% of a long-K tile's mainloop in the drain and 24% in
 * the promotion. */
#ifndef MOK_SM90_FP8_HALF_PIPE
#define MOK_SM90_FP8_HALF_PIPE 4
#endif
/* The weight gradient's run length, apart (default 0, off): on the H100 (checker, v69) N = 4 took the forward +1-5%
 * with the same output bits, and the weight gradient with per-column scales -2% (N = 2: -0.3%); on the tiled one
 * (RESULTS v39) N = 2 and 4 were -0.6 to +2.6%, below MOK_SM90_FP8_EPI_TILE's gain, and not measured with it. */
#ifndef MOK_SM90_FP8_HALF_PIPE_WGRAD
#define MOK_SM90_FP8_HALF_PIPE_WGRAD 0
#endif
static_assert(MOK_SM90_FP8_HALF_PIPE >= 0 && MOK_SM90_FP8_HALF_PIPE <= 8, "K-blocks per run: 0 (off) to 8");
static_assert(MOK_SM90_FP8_HALF_PIPE_WGRAD >= 0 && MOK_SM90_FP8_HALF_PIPE_WGRAD <= 8, "K-blocks per run: 0 to 8");
static_assert(!((MOK_SM90_FP8_HALF_PIPE || MOK_SM90_FP8_HALF_PIPE_WGRAD) && MOK_SM90_FP8_NO_PROMOTE),
              "the timing bounds use whole K-blocks");

/* The consumer warpgroup's index (0, 1), warp-uniform for ptxas (a shuffle from lane 0): the A
 * descriptors derived from it then live in uniform registers (no R2UR per wgmma). */
__device__ __forceinline__ int consumer_wg() { return __shfl_sync(0xFFFFFFFFu, (int)(threadIdx.x / 128), 0) - 1; }

/* A compile-time int as a value (the consumer's generic lambdas take the promotion's split this way). */
template <int V>
struct int_c {
    static constexpr int value = V;
};

/* MOK_SM90_FP8_EPI_OVERLAP=0: the A/B build of v31, the next tile's first K-block issued after this
 * tile's epilogue instead of before it. */
#ifndef MOK_SM90_FP8_EPI_OVERLAP
#define MOK_SM90_FP8_EPI_OVERLAP 1
#endif

/* The scales of one K-block in flight, read from its stage before its wgmma (early release). */
struct kblock_scales {
    float sa0 = 0.f, sa1 = 0.f, sb0 = 0.f, sb1 = 0.f;
    float sb2 = 0.f, sb3 = 0.f; /* a 192-wide SwiGLU tile: its up half's blocks (sb0, sb1: the gate half's) */
};

/* (A consumer warp hands a stage back with the BF16 kernel's mok_sm90::release_stage: to its
 * producer, and in a pair also to the peer's.) */
using mok_sm90::release_stage;

/* ------------------------------------------------------------------------------------------------
 * One tile width's kernel pieces: 128 x BN tiles, the ring, producer, consumers, epilogue
 * ---------------------------------------------------------------------------------------------- */
template <int BN>
struct fp8_tile {
    static_assert(BN == 128 || BN == 192, "tile widths with a wgmma wrapper: 128, 192");

    /* MOK_SM90_FP8_STAGES: the ring's depth; 5 (BN 128) or 4 (BN 192) is what fits beside the 32 KiB
     * epilogue buffer. 6 fits with one epilogue buffer per warpgroup (-DMOK_SM90_EPI_BUFS=1), an
     * experiment for the standalone checker. */
#ifdef MOK_SM90_FP8_STAGES
    enum { kStages = MOK_SM90_FP8_STAGES };
#else
    enum { kStages = BN == 128 ? 5 : 4 };
#endif
    enum { STAGE_B_BYTES = BN * BK };

    struct smem_layout {
        uint8_t a[kStages][BM * BK];
        uint8_t b[kStages][BN * BK];
        __nv_bfloat16 epi[2][kFp8EpiBufs][64 * 64]; /* [consumer warpgroup][buffer] */
        float sa[kStages][BM]; /* A scales of the stage's K-block, one per tile row */
        float sb[kStages][4];  /* the B scales of the stage's K-block: the tile's first and (BN > 128) second
                                  128-column block (padded to 16 bytes); SwiGLU: the gate half's, then the
                                  up half's (192 wide: two blocks each) */
        /* wgrad: the K-block's A scales (one per tile row) and B scales (one per tile column: B is 1 x 128
         * along K, like A), two copies per stage selected by the ring phase, so that a stage goes back
         * to the producer as soon as its wgmma has drained while its promotion still reads the scales
         * (the producer rewrites a copy two rounds later, after this consumer's next release) */
        float wsa[2][kStages][BM];
        float wsb[2][kStages][BN];
        uint64_t full[kStages];
        uint64_t empty[kStages];
    };
    static_assert(sizeof(smem_layout) + 1024 <= 227 * 1024, "shared memory budget of one CTA");
    static_assert(STAGE_A_BYTES % 1024 == 0 && STAGE_B_BYTES % 1024 == 0, "stage buffers keep 1024-byte alignment");

    /* ---- producer: TMA for the tiles, cp.async for the scales (one per thread and K-block) ---- */
    template <int kCluster, bool kSwiGLU>
    static __device__ __forceinline__ void produce(smem_layout& s, const params& p, const CUtensorMap* tma_a,
                                                   const CUtensorMap* tma_b, const CUtensorMap* tma_b_half,
                                                   int64_t rows_used) {
        constexpr bool kWideSwiGLU = kSwiGLU && BN > SCALE_BLOCK;
        const int tid = threadIdx.x; /* 0..127 */
        const uint32_t rank = kCluster > 1 ? cluster_ctarank() : 0;
        uint32_t stage = 0, phase = 0;
        mok_tile_sched sched;
        fp8_sched_init<kCluster>(&sched, p, rows_used);
        mok_tile unit;
        while (mok_sched_next_tile(&sched, &unit)) {
            const fp8_job j = fp8_job_of<kCluster>(p, unit, rank, rows_used);
            if (!j.active) continue;
            const int32_t e = j.e_load;
            const mok_tile& tile = j.tile;
            const int64_t row = tile.m0 + tid;
            const bool row_ok = row < p.R;
            const float* sa_row = p.sa + (row_ok ? row : 0) * p.num_kb;
            /* the tile's B scale blocks: the one of its first column, and (BN > 128) the next one, clamped
             * to the last block (a partial last tile stores no column of a block past N); SwiGLU: the
             * gate half's block and the up half's */
            const int32_t n0 = (int32_t)(tile.n_tile * (kSwiGLU ? BN / 2 : BN)); /* SwiGLU: the gate half's row */
            const int64_t n_blocks = p.N / SCALE_BLOCK, blk0 = n0 / SCALE_BLOCK;
            /* a 192-wide SwiGLU tile: the blocks of its gate half's first and last rows (the last one
             * clamped, as a partial tile's rows past I are never stored), then its up half's */
            auto last_blk = [&](int64_t row) { return row / SCALE_BLOCK < n_blocks ? row / SCALE_BLOCK : n_blocks - 1; };
            const int64_t blk1 = kWideSwiGLU ? last_blk(n0 + BN / 2 - 1)
                                 : kSwiGLU   ? (p.I + n0) / SCALE_BLOCK
                                             : (blk0 + 1 < n_blocks ? blk0 + 1 : blk0);
            const float* sb_tile0 = p.sb + ((int64_t)e * n_blocks + blk0) * p.num_kb;
            const float* sb_tile1 = p.sb + ((int64_t)e * n_blocks + blk1) * p.num_kb;
            const float* sb_tile2 = p.sb + ((int64_t)e * n_blocks + (p.I + n0) / SCALE_BLOCK) * p.num_kb;
            const float* sb_tile3 = p.sb + ((int64_t)e * n_blocks + last_blk(p.I + n0 + BN / 2 - 1)) * p.num_kb;
            for (int64_t kb = 0; kb < p.num_kb; ++kb) {
                /* (a pair: both CTAs' consumers have released the stage, so the peer's half of B may land) */
                mbarrier_wait_parity(&s.empty[stage], phase ^ 1);
                const int32_t k0 = (int32_t)(kb * BK);
                if (tid == 0) {
                    /* a shared stage: this CTA's half of B and the peer's land here too, 32 KiB in all */
                    mbarrier_arrive_expect_tx(&s.full[stage], STAGE_A_BYTES + STAGE_B_BYTES);
                    tma_load_2d(&s.a[stage][0], tma_a, &s.full[stage], k0, (int32_t)tile.m0);
                    if (kSwiGLU) { /* gate rows n0.., up rows I + n0.. */
                        tma_load_3d(&s.b[stage][0], tma_b_half, &s.full[stage], k0, n0, e);
                        tma_load_3d(&s.b[stage][(BN / 2) * BK], tma_b_half, &s.full[stage], k0, (int32_t)p.I + n0, e);
                    } else if (kCluster > 1 && j.shared) {
                        tma_load_3d_multicast(&s.b[stage][rank * (BN / 2) * BK], tma_b_half, &s.full[stage], 0x3, k0,
                                              n0 + (int32_t)rank * (BN / 2), e);
                    } else {
                        tma_load_3d(&s.b[stage][0], tma_b, &s.full[stage], k0, n0, e);
                    }
                    cp_async_4(&s.sb[stage][0], sb_tile0 + kb, 4u);
                }
                if ((BN > SCALE_BLOCK || kSwiGLU) && tid == 1) cp_async_4(&s.sb[stage][1], sb_tile1 + kb, 4u);
                if (kWideSwiGLU && tid == 2) cp_async_4(&s.sb[stage][2], sb_tile2 + kb, 4u);
                if (kWideSwiGLU && tid == 3) cp_async_4(&s.sb[stage][3], sb_tile3 + kb, 4u);
                /* rows past R: a zero scale (their A rows are zero-filled by TMA anyway) */
                if (!MOK_SM90_FP8_SKIP_SCALE_LOADS)
                    cp_async_4(&s.sa[stage][tid], row_ok ? sa_row + kb : p.sa, row_ok ? 4u : 0u);
                cp_async_mbarrier_arrive_noinc(&s.full[stage]);
                if (++stage == kStages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
    }

    /* Issues the wgmma of one K-block (4 steps of k32) into part, as one commit group; accumulate = 0
     * starts part from zero.
     * Each K step's descriptor is the K-block's plus a constant: a step of 32 FP8 values is 32 bytes
     * inside the 128-byte swizzled row, and the start-address field is addr >> 4 (addr + 96 stays below
     * 2^18, so no carry leaves the field). Same descriptors as building each from its address; with the
     * warp-uniform warpgroup index, 76 -> 38 SASS instructions from the full-barrier wait to the drain,
     * +1.5-2% (v25). */
    template <bool kFenceOperands = true>
    static __device__ __forceinline__ void mma_kblock(float (&part)[BN / 2], uint32_t a_addr, uint32_t b_addr,
                                                      int accumulate = 0) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i)
            if (kFenceOperands) wgmma_fence_operand(part[i]);
        wgmma_fence();
        const uint64_t da0 = wgmma_desc_kmajor_sw128(a_addr), db0 = wgmma_desc_kmajor_sw128(b_addr);
#pragma unroll
        for (int k32 = 0; k32 < BK / 32; ++k32) {
            const uint64_t da = da0 + (uint64_t)(k32 * 32 >> 4), db = db0 + (uint64_t)(k32 * 32 >> 4);
            const int scale_d = k32 > 0 ? 1 : accumulate;
            if (BN == 128) wgmma_m64n128k32_f32_e4m3(part, da, db, scale_d);
            else wgmma_m64n192k32_f32_e4m3(part, da, db, scale_d);
        }
        wgmma_commit_group();
    }

    /* Which of a K-block's B scales (kblock_scales sb0..sb3) multiplies 8-column group g of the tile.
     * Plain tiles: columns [0, kSplitA) are in the first scale block (kSplitA = BN: one block).
     * SwiGLU (gate half, then up half, BN / 2 columns each): a 128-wide tile's halves are one block
     * each (kSplitA = BN / 2); a 192-wide tile's halves may straddle a block: the gate half's columns
     * [0, kSplitA) and the up half's [0, kSplitB) are in their halves' first blocks. */
    template <bool kSwiGLU, int kSplitA, int kSplitB>
    static constexpr __host__ __device__ int scale_slot(int g) {
        return !(kSwiGLU && BN > SCALE_BLOCK) ? (8 * g < kSplitA ? 0 : 1)
               : g < BN / 16                  ? (8 * g < kSplitA ? 0 : 1)
                                              : (8 * (g - BN / 16) < kSplitB ? 2 : 3);
    }

    /* FP32 promotion of a finished K-block: acc += part * sa[row] * sb[column block] (rows r_lo and
     * r_lo + 8); kFirst (the tile's first K-block): acc = part * s, no zeroing pass. Registers
     * 4g..4g+3 hold columns 8g + 2 (lane % 4) + {0, 1}: a group's columns share a scale block,
     * whatever the lane (scale_slot). The splits are template parameters because a runtime split made
     * ptxas select and multiply a scale per 8-column group: 96 FFMA + 33 FMUL after the drain of a
     * 192-wide K-block instead of 96 FFMA (v31).
     * kReg0, kRegs: the accumulator registers [kReg0, kReg0 + kRegs) promoted from part[0, kRegs) (the
     * whole tile by default; MOK_SM90_FP8_HALF_PIPE's halves: 48 from 0 or 48).
     * NOTE: part's wgmma group must have retired (wait_group); the operand fence keeps the reads after
     * that wait. */
    template <bool kSwiGLU, int kSplitA, int kSplitB, bool kFirst, int kReg0 = 0, int kRegs = BN / 2>
    static __device__ __forceinline__ void promote(float (&acc)[BN / 2], float (&part)[kRegs], float sa0, float sa1,
                                                   const kblock_scales& sc) {
        static_assert(kSplitA % 8 == 0 && kSplitA > 0 && kSplitA <= BN && kSplitB % 8 == 0,
                      "splits at whole 8-column groups");
        static_assert(kReg0 % 4 == 0 && kRegs % 4 == 0 && kReg0 + kRegs <= BN / 2, "whole 8-column groups");
#pragma unroll
        for (int i = 0; i < kRegs; ++i) wgmma_fence_operand(part[i]);
        const float s0[4] = {sa0 * sc.sb0, sa0 * sc.sb1, sa0 * sc.sb2, sa0 * sc.sb3};
        const float s1[4] = {sa1 * sc.sb0, sa1 * sc.sb1, sa1 * sc.sb2, sa1 * sc.sb3};
#pragma unroll
        for (int i = 0; i < kRegs; i += 4) {
            const int q = scale_slot<kSwiGLU, kSplitA, kSplitB>((kReg0 + i) / 4);
            float* a = &acc[kReg0 + i];
            a[0] = kFirst ? part[i] * s0[q] : fmaf(part[i], s0[q], a[0]);
            a[1] = kFirst ? part[i + 1] * s0[q] : fmaf(part[i + 1], s0[q], a[1]);
            a[2] = kFirst ? part[i + 2] * s1[q] : fmaf(part[i + 2], s1[q], a[2]);
            a[3] = kFirst ? part[i + 3] * s1[q] : fmaf(part[i + 3], s1[q], a[3]);
        }
    }

    /* MOK_SM90_FP8_HALF_PIPE: half kH (0: columns [0, BN / 2), 1: [BN / 2, BN)) of one K-block into half, one
     * commit group (B's half kH starts BN / 2 rows, a whole number of 8-row swizzle atoms, into the stage). */
    template <int kH>
    static __device__ __forceinline__ void mma_half(float (&half)[BN / 4], uint32_t a_addr, uint32_t b_addr) {
        static_assert(BN == 192, "96-column halves");
#pragma unroll
        for (int i = 0; i < BN / 4; ++i) wgmma_fence_operand(half[i]);
        wgmma_fence();
        const uint64_t da0 = wgmma_desc_kmajor_sw128(a_addr);
        const uint64_t db0 = wgmma_desc_kmajor_sw128(b_addr + (uint32_t)(kH * (BN / 2) * BK));
#pragma unroll
        for (int k32 = 0; k32 < BK / 32; ++k32) {
            const uint64_t da = da0 + (uint64_t)(k32 * 32 >> 4), db = db0 + (uint64_t)(k32 * 32 >> 4);
            wgmma_m64n96k32_f32_e4m3(half, da, db, k32 > 0 ? 1 : 0);
        }
        wgmma_commit_group();
    }

    /* A consumer thread's place: its warpgroup (0, 1), thread and lane in it, its accumulator rows
     * (r_lo, r_lo + 8), the shared addresses of its A rows and of B in stage 0, and its epilogue
     * buffers (the forward's and the weight gradient's consumers both start from it). */
    struct consumer_thread {
        int wg, t, lane, r_lo;
        uint32_t a_base, b_base;
        __device__ __forceinline__ explicit consumer_thread(smem_layout& s) {
            wg = consumer_wg();
            t = threadIdx.x & 127;
            lane = t & 31;
            r_lo = wg * 64 + (t >> 5) * 16 + (lane >> 2);
            a_base = mok_smem_u32(&s.a[0][wg * 64 * BK]);
            b_base = mok_smem_u32(&s.b[0][0]);
        }
        __device__ __forceinline__ epi_stager stager(smem_layout& s) const {
            return mok_sm90::make_epi_stager(mok_smem_u32(&s.epi[wg][0][0]), wg, t);
        }
    };

    /* MOK_SM90_FP8_EPI_TILE's plain-tile epilogue of one warpgroup: the [64 x 64] chunks of its tile at
     * columns c0 + 64 j below N (accumulator groups 8 j .. 8 j + 7) staged at once, then chunk j stored as
     * the box at coords(c0 + 64 j) (an int4, epi_store_box's c0..c3) by lane 0 of warp j.
     * bufs: the warpgroup's first own buffer; e: its stager (the thread's stmatrix addressing). */
    template <typename Coords>
    static __device__ __forceinline__ void store_tile_staged(const epi_stager& e, uint32_t bufs, const float* acc,
                                                             int64_t c0, int64_t N, const CUtensorMap* map,
                                                             Coords&& coords) {
        static_assert(BN / 64 <= kFp8EpiBufs, "a buffer per chunk of the tile");
        const int64_t left = (N - c0 + 63) / 64;
        const int n = (int)(left < BN / 64 ? left : BN / 64);
        const int warp = e.t >> 5, lane = e.t & 31;
        /* each buffer's last store (a tile ago) has read it: its issuing lane waits, the warpgroup meets */
        if (lane == 0 && warp < BN / 64) bulk_wait_group_read<0>();
        named_barrier_sync(1 + e.wg, 128);
#pragma unroll
        for (int j = 0; j < BN / 64; ++j) {
            if (j >= n) break;
            mok_sm90::epi_put_acc(e, bufs + (uint32_t)j * mok_sm90::EPI_CHUNK_BYTES, acc, j);
        }
        fence_proxy_async_shared();
        named_barrier_sync(1 + e.wg, 128);
        if (lane == 0 && warp < n && MOK_SM90_SKIP_EPILOGUE != 2) {
            const int4 c = coords((int32_t)(c0 + 64 * warp));
            mok_sm90::epi_store_box(map, bufs + (uint32_t)warp * mok_sm90::EPI_CHUNK_BYTES, c.x, c.y, c.z, c.w);
            bulk_commit_group();
        }
    }

    /* The warpgroup's last stores have read their buffers (the stager's, and with MOK_SM90_FP8_EPI_TILE each
     * issuing lane's), so the shared memory may go. */
    static __device__ __forceinline__ void finish_epilogue(epi_stager& e) {
        mok_sm90::epi_finish(e);
        if (MOK_SM90_FP8_EPI_TILE && (e.t & 31) == 0) bulk_wait_group<0>();
    }

    /* The consumer's ring position. */
    struct ring_pos {
        uint32_t stage = 0, phase = 0;
        __device__ __forceinline__ void advance() {
            if (++stage == kStages) {
                stage = 0;
                phase ^= 1;
            }
        }
    };

    /* MOK_SM90_FP8_HALF_PIPE's run of kRun K-blocks from pos (forward and weight gradient), each issued as two
     * halves, lo and hi (two commit groups); each half is promoted while the tensor cores run the next group
     * (lo(j) under hi(j), hi(j) under lo(j + 1)). land(at) waits for the stage at `at` to be full (and reads
     * what must be read before the stage goes back); promote(int_c<h>, half, j, at) promotes half h (its
     * registers: lo or hi) of the run's K-block j (at its stage `at`). The stage goes back once both halves are
     * read. No group stays in flight past the run: with one in flight across a loop's back edge, ptxas serialises
     * every wgmma of the kernel (C7514) as soon as a promotion reads a half while another group runs; so the run's
     * last half-promotion has no MMA of this warpgroup queued behind it. (The loop over j is unrolled: its
     * branches are constants to ptxas.) */
    template <int kRun, int kCluster, bool kTimed, typename Land, typename Promote>
    static __device__ __forceinline__ void run_halves(smem_layout& s, const consumer_thread& me, ring_pos& pos,
                                                      float (&lo)[BN / 4], float (&hi)[BN / 4], Land&& land,
                                                      Promote&& promote) {
        auto stage_a = [&](const ring_pos& at) { return me.a_base + at.stage * STAGE_A_BYTES; };
        auto stage_b = [&](const ring_pos& at) { return me.b_base + at.stage * STAGE_B_BYTES; };
        /* the timing build's counters (kTimed: the forward's, which the checker prints; in the weight gradient
         * their branch on the thread made ptxas serialise the wgmma, C7514) */
        auto now = [] { return kTimed ? MOK_TIMING_NOW() : 0ll; };
        auto add = [](int slot, long long since) {
            if constexpr (kTimed) MOK_TIMING_ADD(slot, since);
            (void)slot, (void)since;
        };
        land(pos);
        mma_half<0>(lo, stage_a(pos), stage_b(pos));
        mma_half<1>(hi, stage_a(pos), stage_b(pos));
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
            const bool more = j + 1 < kRun;
            ring_pos next = pos;
            next.advance();
            long long t = now();
            wgmma_wait_group<1>(); /* lo(j) retired, hi(j) may still run */
            add(mok_sm90::TIMING_DRAIN, t);
            t = now();
            promote(int_c<0>{}, lo, j, pos);
            add(mok_sm90::TIMING_PROMOTE, t);
            if (more) {
                land(next);
                mma_half<0>(lo, stage_a(next), stage_b(next));
            }
            t = now();
            if (more) wgmma_wait_group<1>(); /* hi(j) retired, lo(j + 1) may still run */
            else wgmma_wait_group<0>();
            add(mok_sm90::TIMING_DRAIN, t);
            t = now();
            if (me.lane == 0) release_stage<kCluster>(s, pos.stage); /* both halves have read it */
            promote(int_c<1>{}, hi, j, pos);
            add(mok_sm90::TIMING_PROMOTE, t);
            if (more) mma_half<1>(hi, stage_a(next), stage_b(next));
            pos = next;
        }
    }

    /* MOK_SM90_FP8_HALF_PIPE's K-blocks of a tile, none in flight before: runs of kRun, then the last
     * nkb % kRun one at a time. run(first_c, run_c) runs run_c K-blocks; first_c: the tile's first. */
    template <int kRun, typename Run>
    static __device__ __forceinline__ void tile_halves(int nkb, Run&& run) {
        static_assert(kRun >= 1, "a run has at least one K-block");
        int kb = 0;
        if (nkb >= kRun) {
            run(int_c<1>{}, int_c<kRun>{});
            for (kb = kRun; kb + kRun <= nkb; kb += kRun) run(int_c<0>{}, int_c<kRun>{});
        }
        for (; kb < nkb; ++kb) {
            if (kb == 0) run(int_c<1>{}, int_c<1>{});
            else run(int_c<0>{}, int_c<1>{});
        }
    }

    /* The stage goes back to the producer as soon as its wgmma has drained, before the promotion
     * (DeepGEMM's order): the K-block's scales are read into registers before its wgmma. Measured on
     * the H200 (standalone checker, v19): 1008 -> 1047 TFLOP/s on DeepSeek-V3 GEMM1, 998 -> 1063 on
     * Mixtral GEMM1 against promoting from the stage and releasing it afterwards.
     * The scales are read with ld.shared: the layout is reached through a cast pointer, and plain C++
     * reads compiled to generic loads (LD.E); +1-2% forward, +7-9% weight gradient (v24).
     * (Tried and removed, slower both times: two partial accumulators, so that K-block kb + 1 runs on
     * the tensor cores while kb is promoted: 914 against 974 TFLOP/s in v16, 994 against 1051 with
     * early release in v24. The two consumer warpgroups already overlap each other's promotion.) */

    /* The SwiGLU variant's epilogue of one warpgroup's 64 rows.
     * 128 wide: chunks 0 (gate) and 1 (up) of h at their columns of [R, 2I], then act's 64 columns from
     * the rounded gate and up values.
     * 192 wide (96 act columns at c = 96 n_tile): h is stored through a [R, 2, I] map (tma_h: gate and
     * up as planes 0 and 1), so that a box past column I is clipped instead of reaching the up half;
     * each 96-column piece (gate, up, act) goes out as two overlapping 64-column chunks, accumulator
     * groups 0-7 at c and 4-11 at c + 32 (the 32 shared columns are written twice with the same
     * values), the second one only where it has columns below I. */
    static __device__ __forceinline__ void store_swiglu_tile(epi_stager& e, const params& p, const float* acc,
                                                             int64_t n_tile, int32_t row0, const CUtensorMap* tma_h,
                                                             const CUtensorMap* tma_act) {
        const int32_t c = (int32_t)(n_tile * (BN / 2));
        if constexpr (BN == SCALE_BLOCK) {
            uint32_t buf = mok_sm90::epi_stage_acc(e, acc, 0);
            mok_sm90::epi_store<true>(e, buf, tma_h, c, row0, 0);
            buf = mok_sm90::epi_stage_acc(e, acc, 1);
            mok_sm90::epi_store<true>(e, buf, tma_h, (int32_t)p.I + c, row0, 0);
            buf = mok_sm90::epi_acquire(e);
            mok_sm90::epi_put_chunk(e, buf, [&](int ci, int h) {
                const int ig = ci * 4 + 2 * h;
                return mok_sm90::swiglu_of_rounded(acc, ig, ig + (BN / 2 / 8) * 4);
            });
            mok_sm90::epi_store<true>(e, buf, tma_act, c, row0, 0);
        } else {
            static_assert(BN == 192, "96-column halves");
            constexpr int kUp = BN / 16; /* the up half's first accumulator group */
            /* h's chunk of accumulator groups [g0, g0 + 8) at column col of plane half */
            auto h_chunk = [&](auto g0_c, int32_t col, int32_t half) {
                constexpr int g0 = decltype(g0_c)::value;
                const uint32_t buf = mok_sm90::epi_acquire(e);
                mok_sm90::epi_put_chunk(e, buf, [&](int ci, int h) {
                    const int i = (g0 + ci) * 4 + 2 * h;
                    return pack_bf16x2(acc[i], acc[i + 1]);
                });
                mok_sm90::epi_store<true>(e, buf, tma_h, col, half, row0);
            };
            /* act's chunk of gate groups [g0, g0 + 8) and the matching up groups */
            auto act_chunk = [&](auto g0_c, int32_t col) {
                constexpr int g0 = decltype(g0_c)::value;
                const uint32_t buf = mok_sm90::epi_acquire(e);
                mok_sm90::epi_put_chunk(e, buf, [&](int ci, int h) {
                    const int ig = (g0 + ci) * 4 + 2 * h;
                    return mok_sm90::swiglu_of_rounded(acc, ig, ig + kUp * 4);
                });
                mok_sm90::epi_store<true>(e, buf, tma_act, col, row0, 0);
            };
            const bool second = c + 64 < p.I; /* the chunk at c + 32 has columns the first one lacks */
            h_chunk(int_c<0>{}, c, 0);
            if (second) h_chunk(int_c<4>{}, c + 32, 0);
            h_chunk(int_c<kUp>{}, c, 1);
            if (second) h_chunk(int_c<kUp + 4>{}, c + 32, 1);
            act_chunk(int_c<0>{}, c);
            if (second) act_chunk(int_c<4>{}, c + 32);
        }
    }

    template <int kCluster, bool kSwiGLU>
    static __device__ __forceinline__ void consume(smem_layout& s, const params& p, int64_t rows_used,
                                                   const CUtensorMap* tma_out, const CUtensorMap* tma_act) {
        constexpr bool kWideSwiGLU = kSwiGLU && BN > SCALE_BLOCK;
        const consumer_thread me(s); /* its rows: me.r_lo, me.r_lo + 8 */
        ring_pos pos;
        float part[BN / 2], acc[BN / 2];
        constexpr bool kHalfPipe = MOK_SM90_FP8_HALF_PIPE && !kSwiGLU && BN == 192;
        constexpr int kHalfRun = kHalfPipe ? MOK_SM90_FP8_HALF_PIPE : 1; /* K-blocks per run */
        float part_lo[BN / 4], part_hi[BN / 4]; /* kHalfPipe's halves of part */
        epi_stager epi = me.stager(s);
        kblock_scales sc; /* the scales of the K-block in flight */
        /* wait for the stage at `at` to land and read its K-block's scales into sc */
        auto land = [&](const ring_pos& at) {
            const long long t_wait = MOK_TIMING_NOW();
            mbarrier_wait_parity(&s.full[at.stage], at.phase);
            MOK_TIMING_ADD(mok_sm90::TIMING_FULL_WAIT, t_wait);
            sc.sa0 = ld_shared_f32(&s.sa[at.stage][me.r_lo]);
            sc.sa1 = ld_shared_f32(&s.sa[at.stage][me.r_lo + 8]);
            sc.sb0 = ld_shared_f32(&s.sb[at.stage][0]);
            sc.sb1 = (BN > SCALE_BLOCK || kSwiGLU) ? ld_shared_f32(&s.sb[at.stage][1]) : 0.f;
            if (kWideSwiGLU) {
                sc.sb2 = ld_shared_f32(&s.sb[at.stage][2]);
                sc.sb3 = ld_shared_f32(&s.sb[at.stage][3]);
            }
        };
        /* issue K-block wgmma for the stage at pos (after its bytes have landed) */
        auto issue = [&](const ring_pos& at) {
            land(at);
            const uint32_t a = me.a_base + at.stage * STAGE_A_BYTES, b = me.b_base + at.stage * STAGE_B_BYTES;
            mma_kblock(part, a, b);
        };
        /* wait for the K-block in flight (at pos), hand its stage back (one arrival per consumer warp: its
         * tiles are read) and promote it */
        auto retire = [&](auto split_a, auto split_b, auto first_c) {
            const long long t_drain = MOK_TIMING_NOW();
            wgmma_wait_group<0>();
            MOK_TIMING_ADD(mok_sm90::TIMING_DRAIN, t_drain);
            const long long t_promote = MOK_TIMING_NOW();
            if (me.lane == 0) release_stage<kCluster>(s, pos.stage);
            if (!MOK_SM90_FP8_NO_PROMOTE) {
                promote<kSwiGLU, decltype(split_a)::value, decltype(split_b)::value, decltype(first_c)::value>(
                    acc, part, sc.sa0, sc.sa1, sc);
            } else if (decltype(first_c)::value) { /* the timing bound: some defined values to store */
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) {
                    wgmma_fence_operand(part[i]);
                    acc[i] = part[i];
                }
            }
            MOK_TIMING_ADD(mok_sm90::TIMING_PROMOTE, t_promote);
            pos.advance();
        };
        /* the nkb > 0 K-blocks of a tile whose first K-block is in flight; split_a, split_b: its scale
         * blocks' splits (scale_slot) */
        /* kHalfPipe: a run of the tile's K-blocks through run_halves; a K-block's scales are read from its stage
         * when it lands (the stage goes back before its hi half is promoted); first_c: the tile's first run (its
         * first K-block's promotion writes acc). The tile's first K-block is not issued under the previous
         * tile's epilogue (no group in flight across the loop; v31: that overlap gained nothing on plain tiles). */
        auto kblocks_halves = [&](auto split_a, auto first_c, auto run_c) {
            constexpr int kSplit = decltype(split_a)::value;
            kblock_scales k; /* the scales of the K-block being promoted */
            auto promote_fwd = [&](auto h_c, float(&half)[BN / 4], int j, const ring_pos&) {
                constexpr int h = decltype(h_c)::value;
                if (h == 0) k = sc; /* before the next K-block's land overwrites sc */
                if (decltype(first_c)::value && j == 0)
                    promote<false, kSplit, 0, true, h * (BN / 4), BN / 4>(acc, half, k.sa0, k.sa1, k);
                else
                    promote<false, kSplit, 0, false, h * (BN / 4), BN / 4>(acc, half, k.sa0, k.sa1, k);
            };
            run_halves<decltype(run_c)::value, kCluster, true>(s, me, pos, part_lo, part_hi, land, promote_fwd);
        };
        auto mainloop = [&](auto split_a, auto split_b, int nkb) {
            if constexpr (kHalfPipe) { /* (no K-block in flight: kblocks_halves issues its own) */
                tile_halves<kHalfRun>(nkb,
                                      [&](auto first_c, auto run_c) { kblocks_halves(split_a, first_c, run_c); });
                return;
            }
            if (MOK_SM90_FP8_NO_PROMOTE == 2) { /* the timing bound: one K-block kept in flight */
                ring_pos prev = pos;
                pos.advance();
                for (int kb = 1; kb < nkb; ++kb) {
                    mbarrier_wait_parity(&s.full[pos.stage], pos.phase);
                    /* (no operand fence while a group is in flight: it would read the accumulators) */
                    mma_kblock<false>(part, me.a_base + pos.stage * STAGE_A_BYTES,
                                      me.b_base + pos.stage * STAGE_B_BYTES, 1);
                    wgmma_wait_group<1>();
                    if (me.lane == 0) release_stage<kCluster>(s, prev.stage);
                    prev = pos;
                    pos.advance();
                }
                pos = prev; /* retire the last one */
                retire(split_a, split_b, int_c<1>{});
                return;
            }
            retire(split_a, split_b, int_c<1>{});
            for (int kb = 1; kb < nkb; ++kb) {
                issue(pos);
                retire(split_a, split_b, int_c<0>{});
            }
        };

        const uint32_t rank = kCluster > 1 ? cluster_ctarank() : 0;
        mok_tile_sched sched;
        fp8_sched_init<kCluster>(&sched, p, rows_used);
        mok_tile unit;
        /* a tile's K-blocks (0: no mainloop; tiles past the rows in use or before offsets[0] have none
         * unless the peer's tile has: a dummy pass, and the epilogue stores zeros)
         * NOTE: a value that ptxas sees as warp-uniform (a shuffle from lane 0): branches on it around
         * the wgmma stay non-divergent, otherwise ptxas serialises every wgmma (C7518) */
        auto kblocks_of = [&](const fp8_job& j) { return __shfl_sync(0xFFFFFFFFu, j.active ? (int)p.num_kb : 0, 0); };
        bool have = mok_sched_next_tile(&sched, &unit);
        fp8_job job = {};
        int nkb = 0;
        if (have) {
            job = fp8_job_of<kCluster>(p, unit, rank, rows_used);
            nkb = kblocks_of(job);
            if (!kHalfPipe && nkb > 0) issue(pos);
        }
        while (have) {
            const mok_tile tile = job.tile;
            const bool compute = job.compute;
            const long long t_main = MOK_TIMING_NOW();
            if (nkb > 0) {
                if constexpr (kSwiGLU && BN == SCALE_BLOCK) {
                    mainloop(int_c<BN / 2>{}, int_c<0>{}, nkb); /* gate | up halves, each in one scale block */
                } else if constexpr (kSwiGLU) {
                    /* 96-column gate and up halves at rows n0 and I + n0 of B (multiples of 32): each half's
                     * first block holds 32, 64 or all 96 of its columns */
                    static_assert(BN == 192, "the splits of other tile widths");
                    const int64_t n0 = tile.n_tile * (BN / 2);
                    auto half_split = [](int64_t row) {
                        const int left = SCALE_BLOCK - (int)(row % SCALE_BLOCK);
                        return left < BN / 2 ? left : BN / 2;
                    };
                    const int sg = __shfl_sync(0xFFFFFFFFu, half_split(n0), 0);
                    const int su = __shfl_sync(0xFFFFFFFFu, half_split(p.I + n0), 0);
                    auto with_up = [&](auto split_g) {
                        if (su == 32) mainloop(split_g, int_c<32>{}, nkb);
                        else if (su == 64) mainloop(split_g, int_c<64>{}, nkb);
                        else mainloop(split_g, int_c<96>{}, nkb);
                    };
                    if (sg == 32) with_up(int_c<32>{});
                    else if (sg == 64) with_up(int_c<64>{});
                    else with_up(int_c<96>{});
                } else if constexpr (BN == SCALE_BLOCK) {
                    mainloop(int_c<BN>{}, int_c<0>{}, nkb);
                } else {
                    /* a 192-wide tile starts at a multiple of 64: its split is 128 or 64 */
                    static_assert(BN == 192, "the splits of other tile widths");
                    const int split = __shfl_sync(0xFFFFFFFFu, SCALE_BLOCK - (int)(tile.n_tile * BN % SCALE_BLOCK), 0);
                    if (split == SCALE_BLOCK) mainloop(int_c<SCALE_BLOCK>{}, int_c<0>{}, nkb);
                    else mainloop(int_c<SCALE_BLOCK / 2>{}, int_c<0>{}, nkb);
                }
                MOK_TIMING_COUNT(mok_sm90::TIMING_TILES);
            }
            MOK_TIMING_ADD(mok_sm90::TIMING_MAINLOOP, t_main);
            if (nkb == 0 || !compute) {
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f; /* no K-blocks, or a dummy pass's sums */
            }
            /* the next tile's first K-block goes to the tensor cores into part before this tile's
             * epilogue reads acc, so it runs under the epilogue (v31) */
            have = mok_sched_next_tile(&sched, &unit);
            if (have) {
                job = fp8_job_of<kCluster>(p, unit, rank, rows_used);
                nkb = kblocks_of(job);
                if (MOK_SM90_FP8_EPI_OVERLAP && !kHalfPipe && nkb > 0) issue(pos);
            }
            /* ---- epilogue: [64 x 64] chunks through the BF16 kernel's stager, TMA stores ---- */
            const int64_t row0 = tile.m0 + 64 * me.wg;
            if (row0 < p.R) {
                const long long t_epi = MOK_TIMING_NOW();
                if (kSwiGLU) {
                    store_swiglu_tile(epi, p, acc, tile.n_tile, (int32_t)row0, tma_out, tma_act);
                } else if constexpr (MOK_SM90_FP8_EPI_TILE != 0) {
                    store_tile_staged(epi, mok_smem_u32(&s.epi[me.wg][0][0]), acc, tile.n_tile * BN, p.N, tma_out,
                                      [&](int32_t c) { return make_int4(c, (int32_t)row0, 0, -1); });
                } else {
#pragma unroll
                    for (int j = 0; j < BN / 64; ++j) {
                        const int32_t c = (int32_t)(tile.n_tile * BN + 64 * j);
                        if (c >= p.N) break;
                        const uint32_t buf = mok_sm90::epi_stage_acc(epi, acc, j);
                        mok_sm90::epi_store<true>(epi, buf, tma_out, c, (int32_t)row0, 0);
                    }
                }
                MOK_TIMING_ADD(mok_sm90::TIMING_EPILOGUE, t_epi);
            }
            if (!MOK_SM90_FP8_EPI_OVERLAP && !kHalfPipe && have && nkb > 0) issue(pos);
        }
        finish_epilogue(epi);
    }

    /* ------------------------------------------------------------------------------------------------
     * weight-gradient variant: one group per expert, K-blocks over the expert's rows
     * ---------------------------------------------------------------------------------------------- */

    /* K-blocks [kb0, kb0 + nkb) of expert e (the kernel has checked that the offsets are 128-aligned,
     * non-decreasing and within R). */
    static __device__ __forceinline__ void wgrad_kblocks(const params& p, int64_t e, int64_t& kb0, int64_t& nkb) {
        const int64_t lo = p.offsets[e], hi = p.offsets[e + 1];
        kb0 = lo / SCALE_BLOCK;
        nkb = (hi - lo) / SCALE_BLOCK;
    }

    template <bool kSbTiled>
    static __device__ __forceinline__ void produce_wgrad(smem_layout& s, const params& p, const CUtensorMap* tma_a,
                                                         const CUtensorMap* tma_b) {
        /* one thread: two tiles by TMA and two runs of scales by bulk copy per stage (the scales are
         * MN-major; v19: 256 four-byte cp.async per stage cost the kernel 11-16%); kSbTiled: the A run
         * and the tile's two B block scales by cp.async (4 bytes each, not 16-byte aligned), which
         * arrive on the full barrier as the barrier's second arrival */
        if (threadIdx.x != 0) return;
        uint32_t stage = 0, phase = 0;
        mok_tile_sched sched;
        mok_sched_init(&sched, p.E, p.num_m_tiles, p.num_n_tiles, BM, INT64_MAX);
        mok_tile tile;
        while (mok_sched_next_tile(&sched, &tile)) {
            int64_t kb0, nkb;
            wgrad_kblocks(p, tile.group, kb0, nkb);
            const int64_t n0 = tile.n_tile * BN;
            /* a partial last tile (BN > 128 only: N % 128 == 0) copies the scales of its columns below N;
             * the others stay stale and multiply B rows that TMA zero-filled, in columns never stored */
            const uint32_t sb_bytes = kSbTiled ? 0u : (uint32_t)((p.N - n0 < BN ? p.N - n0 : BN) * 4);
            const uint32_t scale_bytes = MOK_SM90_FP8_SKIP_SCALE_LOADS ? 0u : BM * 4 + sb_bytes;
            /* kSbTiled: the 128-column blocks of the tile's first column and of the next one (clamped to
             * the last block: a partial last tile stores no column past N) */
            const int64_t n_blocks = p.N / SCALE_BLOCK, blk0 = n0 / SCALE_BLOCK;
            const int64_t blk1 = blk0 + 1 < n_blocks ? blk0 + 1 : blk0;
            for (int64_t kb = kb0; kb < kb0 + nkb; ++kb) {
                mbarrier_wait_parity(&s.empty[stage], phase ^ 1);
                const int32_t k0 = (int32_t)(kb * BK);
                mbarrier_arrive_expect_tx(&s.full[stage], STAGE_A_BYTES + STAGE_B_BYTES + scale_bytes);
                tma_load_2d(&s.a[stage][0], tma_a, &s.full[stage], k0, (int32_t)tile.m0);
                tma_load_2d(&s.b[stage][0], tma_b, &s.full[stage], k0, (int32_t)n0);
                if (!MOK_SM90_FP8_SKIP_SCALE_LOADS) {
                    bulk_load(&s.wsa[phase][stage][0], p.sa + kb * p.M + tile.m0, BM * 4, &s.full[stage]);
                    if (!kSbTiled) bulk_load(&s.wsb[phase][stage][0], p.sb + kb * p.N + n0, sb_bytes, &s.full[stage]);
                }
                if (kSbTiled) {
                    cp_async_4(&s.wsb[phase][stage][0], p.sb + kb * n_blocks + blk0, 4u);
                    cp_async_4(&s.wsb[phase][stage][1], p.sb + kb * n_blocks + blk1, 4u);
                    cp_async_mbarrier_arrive_noinc(&s.full[stage]);
                }
                if (++stage == kStages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
    }

    /* FP32 promotion with a scale per column: acc += part * sa[row] * sb[column]. Registers 4g..4g+3
     * hold columns c = 8g + 2 (lane % 4) + {0, 1} of rows r_lo (4g, 4g + 1) and r_lo + 8 (4g + 2, 4g + 3).
     * kReg0, kRegs: as promote().
     * NOTE: as promote(), part's wgmma group must have retired. */
    template <int kReg0 = 0, int kRegs = BN / 2>
    static __device__ __forceinline__ void promote_cols(float (&acc)[BN / 2], float (&part)[kRegs], float sa0,
                                                        float sa1, const float* sb_cols, int lane) {
#pragma unroll
        for (int i = 0; i < kRegs; ++i) wgmma_fence_operand(part[i]);
#pragma unroll
        for (int i = 0; i < kRegs; i += 4) {
            const float2 sb = ld_shared_f32x2(sb_cols + 2 * (kReg0 + i) + 2 * (lane & 3));
            float* a = &acc[kReg0 + i];
            a[0] = fmaf(part[i], sa0 * sb.x, a[0]);
            a[1] = fmaf(part[i + 1], sa0 * sb.y, a[1]);
            a[2] = fmaf(part[i + 2], sa1 * sb.x, a[2]);
            a[3] = fmaf(part[i + 3], sa1 * sb.y, a[3]);
        }
    }

    /* kSbTiled: B's scales per 128 x 128 block, so the promotion is the forward's (promote(): one
     * factor per row and column block, 96 FFMA per 192-wide K-block instead of 96 FMUL + 96 FFMA); a
     * 192-wide tile's columns [0, 128 - n0 % 128) are in its first block (kSplit). */
    template <bool kSbTiled>
    static __device__ __forceinline__ void consume_wgrad(smem_layout& s, const params& p, const CUtensorMap* tma_out) {
        const consumer_thread me(s); /* its rows: me.r_lo, me.r_lo + 8 */
        ring_pos pos;
        float part[BN / 2], acc[BN / 2];
        constexpr bool kHalfPipe = MOK_SM90_FP8_HALF_PIPE_WGRAD && BN == 192;
        constexpr int kHalfRun = kHalfPipe ? MOK_SM90_FP8_HALF_PIPE_WGRAD : 1; /* K-blocks per run */
        float part_lo[BN / 4], part_hi[BN / 4]; /* kHalfPipe's halves of part */
        epi_stager epi = me.stager(s);

        mok_tile_sched sched;
        mok_sched_init(&sched, p.E, p.num_m_tiles, p.num_n_tiles, BM, INT64_MAX);
        mok_tile tile;
        while (mok_sched_next_tile(&sched, &tile)) {
            int64_t kb0, nkb64;
            wgrad_kblocks(p, tile.group, kb0, nkb64);
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
            /* NOTE: warp-uniform for ptxas (see consume()) */
            const int nkb = __shfl_sync(0xFFFFFFFFu, (int)nkb64, 0);
            /* promote registers [kReg0, kReg0 + kRegs) of the K-block at `at` (regs: part, or a kHalfPipe half)
             * from the stage's scale copies, which stay readable after the stage goes back (wsa's two copies) */
            auto promote_at = [&](auto split, auto reg0_c, auto& regs, const ring_pos& at) {
                constexpr int kReg0 = decltype(reg0_c)::value, kRegs = sizeof(regs) / sizeof(float);
                const float* sa = &s.wsa[at.phase][at.stage][0];
                const float* sb = &s.wsb[at.phase][at.stage][0];
                if (kSbTiled) {
                    kblock_scales sc;
                    sc.sb0 = ld_shared_f32(&sb[0]);
                    sc.sb1 = ld_shared_f32(&sb[1]);
                    promote<false, decltype(split)::value, 0, false, kReg0, kRegs>(
                        acc, regs, ld_shared_f32(&sa[me.r_lo]), ld_shared_f32(&sa[me.r_lo + 8]), sc);
                } else {
                    promote_cols<kReg0, kRegs>(acc, regs, ld_shared_f32(&sa[me.r_lo]), ld_shared_f32(&sa[me.r_lo + 8]),
                                               sb, me.lane);
                }
            };
            auto mainloop_halves = [&](auto split) {
                auto land = [&](const ring_pos& at) { mbarrier_wait_parity(&s.full[at.stage], at.phase); };
                auto promote_half = [&](auto h_c, float(&half)[BN / 4], int, const ring_pos& at) {
                    promote_at(split, int_c<decltype(h_c)::value * (BN / 4)>{}, half, at);
                };
                tile_halves<kHalfRun>(nkb, [&](auto, auto run_c) {
                    run_halves<decltype(run_c)::value, 1, false>(s, me, pos, part_lo, part_hi, land, promote_half);
                });
            };
            auto mainloop = [&](auto split) {
                for (int kb = 0; kb < nkb; ++kb) {
                    mbarrier_wait_parity(&s.full[pos.stage], pos.phase);
                    mma_kblock(part, me.a_base + pos.stage * STAGE_A_BYTES, me.b_base + pos.stage * STAGE_B_BYTES);
                    wgmma_wait_group<0>();
                    /* the tiles are read: release the stage before the promotion (its scales stay, see wsa) */
                    if (me.lane == 0) mbarrier_arrive(&s.empty[pos.stage]);
                    promote_at(split, int_c<0>{}, part, pos);
                    pos.advance();
                }
            };
            auto run = [&](auto split) {
                if constexpr (kHalfPipe) mainloop_halves(split);
                else mainloop(split);
            };
            if (kSbTiled && BN > SCALE_BLOCK && (tile.n_tile * BN) % SCALE_BLOCK != 0)
                run(int_c<(BN > SCALE_BLOCK ? BN - SCALE_BLOCK : BN)>{});
            else
                run(int_c<(BN < SCALE_BLOCK ? BN : SCALE_BLOCK)>{});
            /* ---- epilogue: out[e, m, n] in [64 x 64] chunks through the [E, M, N] map, or (split) the
             * chunk's 64 rows, which lie in one half, through plane half ^ split_flip of [2, E, M / 2, N] ---- */
            const int64_t m0 = tile.m0 + 64 * me.wg;
            const int32_t half = p.split_rows && m0 >= p.split_rows ? 1 : 0;
            const int32_t mm = (int32_t)(m0 - half * p.split_rows);
            const int32_t plane = p.split_rows ? half ^ p.split_flip : -1;
            if constexpr (MOK_SM90_FP8_EPI_TILE != 0) {
                store_tile_staged(epi, mok_smem_u32(&s.epi[me.wg][0][0]), acc, tile.n_tile * BN, p.N, tma_out,
                                  [&](int32_t c) { return make_int4(c, mm, (int32_t)tile.group, plane); });
            } else {
#pragma unroll
                for (int j = 0; j < BN / 64; ++j) {
                    const int32_t c = (int32_t)(tile.n_tile * BN + 64 * j);
                    if (c >= p.N) break;
                    const uint32_t buf = mok_sm90::epi_stage_acc(epi, acc, j);
                    mok_sm90::epi_store<true>(epi, buf, tma_out, c, mm, (int32_t)tile.group, plane);
                }
            }
        }
        finish_epilogue(epi);
    }

};  // struct fp8_tile

/* A plan the kernel cannot take: an offset not a multiple of 128 (both variants), or (wgrad, whose
 * scale reads follow the offsets) decreasing or past R. */
__device__ __forceinline__ bool bad_offset(const params& p, int64_t e, bool wgrad) {
    const int64_t off = p.offsets[e];
    if (off % BM != 0) return true;
    return wgrad && (off < 0 || off > p.R || (e > 0 && off < (int64_t)p.offsets[e - 1]));
}

/* Every thread of the CTA (a __syncthreads): true when some offset is one the kernel cannot take; CTA 0
 * then reports it in the error word, and the kernel computes nothing. */
__device__ __forceinline__ bool plan_rejected(const params& p, bool wgrad) {
    bool misaligned = false;
    for (int64_t e = threadIdx.x; e <= p.E; e += blockDim.x) misaligned |= bad_offset(p, e, wgrad);
    if (!__syncthreads_or(misaligned)) return false;
    if (blockIdx.x == 0 && threadIdx.x == 0 && p.error_flag != NULL) {
        /* NOTE: the plan kernel's protocol: read-OR-write of the host-mapped word, system fence */
        volatile int32_t* flag = p.error_flag;
        *flag = *flag | (int32_t)MOK_DEVICE_ERR_UNALIGNED_PLAN;
        __threadfence_system();
    }
    return true;
}

/* 128 x BN tiles. tma_b: B in boxes of BN rows; tma_b_half: in boxes of BN / 2 rows, the half a CTA
 * of a pair multicasts (kCluster = 2), or the gate and up halves of a SwiGLU tile; tma_act: the
 * SwiGLU variant's act [R, I] (others: unused). */
template <int BN, bool kWgrad, int kCluster, bool kSwiGLU, bool kSbTiled = false>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_fp8_nt_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                               const __grid_constant__ CUtensorMap tma_b_half,
                               const __grid_constant__ CUtensorMap tma_out,
                               const __grid_constant__ CUtensorMap tma_act, const params p) {
    static_assert(kCluster == 1 || (kCluster == 2 && !kWgrad), "pairs: the forward only");
    static_assert(!kSwiGLU || (kCluster == 1 && !kWgrad && (BN == 128 || BN == 192)),
                  "SwiGLU: the single-CTA forward, 64 + 64 or 96 + 96 gate and up rows");
    static_assert(!kSbTiled || kWgrad, "B scales per 128 x 128 block: the weight gradient's option");
    using tile = fp8_tile<BN>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    auto& s = *reinterpret_cast<typename tile::smem_layout*>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    if (threadIdx.x == 0) {
        for (int i = 0; i < tile::kStages; ++i) {
            /* the TMA thread's expect_tx, + 128 cp.async arrivals for the forward's row scales (the
             * weight gradient's scales come by bulk copy, counted in the expect_tx; with kSbTiled its two
             * B scales by cp.async, one more arrival) */
            mbarrier_init(&s.full[i], kWgrad ? (kSbTiled ? 2 : 1) : kFwdFullArrivals);
            mbarrier_init(&s.empty[i], 8 * kCluster); /* every consumer warp of the cluster */
        }
        fence_mbarrier_init();
        tma_prefetch_descriptor(&tma_a);
        tma_prefetch_descriptor((kCluster > 1 || kSwiGLU) ? &tma_b_half : &tma_b);
    }
    /* ---- v1 takes 128-aligned plans only: a misaligned one is reported, nothing computed ---- */
    if (plan_rejected(p, kWgrad)) return; /* (every CTA of a pair returns here: the plan is the same for all) */
    /* NOTE: in a pair the peer's first multicast and releases may reach this CTA's barriers before
     * its own producer starts: initialise them cluster-wide first */
    if (kCluster > 1) cluster_sync();
    const int64_t rows_used = mok_rows_in_use(p.offsets, p.E, p.R);
    if (threadIdx.x < 128) {
        setmaxnreg_dec<kProducerRegs>();
        if (kWgrad) {
            tile::template produce_wgrad<kSbTiled>(s, p, &tma_a, &tma_b);
        } else {
            tile::template produce<kCluster, kSwiGLU>(s, p, &tma_a, &tma_b, &tma_b_half, rows_used);
        }
    } else {
        setmaxnreg_inc<kConsumerRegs>();
        if (kWgrad) {
            tile::template consume_wgrad<kSbTiled>(s, p, &tma_out);
        } else {
            tile::template consume<kCluster, kSwiGLU>(s, p, rows_used, &tma_out, &tma_act);
        }
    }
    /* ---- a CTA's shared memory must outlive its peer's multicasts and remote arrivals (the
     * barrier is .aligned: reconverge the producer warps first) ---- */
    if (kCluster > 1) {
        __syncwarp();
        cluster_sync();
    }
}

}  // namespace mok_sm90_fp8

#endif /* MOK_CUDA_GEMM_GROUPED_GEMM_FP8_SM90_CUH */
