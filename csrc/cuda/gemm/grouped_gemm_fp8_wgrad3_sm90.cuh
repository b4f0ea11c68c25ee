/*
 * FP8 weight gradient with three consumer warpgroups (performance log v38; opt-in, launcher:
 * grouped_gemm_fp8_sm90.cu, MOK_SM90_FP8_WGRAD_WARPGROUPS=3). The same GEMM as the kWgrad variant of
 * grouped_gemm_fp8_sm90.cuh, with the same K-blocks promoted in the same order (bitwise the same
 * outputs):
 *
 *   out[e, m, n] = sum_{kb of expert e's rows} sa[m, kb] * sb[n, kb] * sum_{r in block kb} A[m, r] B[n, r]
 *
 * Why a second kernel: the weight gradient's promotion has a scale per row and per column, so it costs
 * an FMUL and an FFMA per accumulator (282 SASS instructions per 192-wide K-block against the
 * forward's 162). With two consumer warpgroups one warpgroup's promotion (~550 cycles) outlasts the
 * other's wgmma (~385), and the tensor cores wait. Here the tile is 192 x 128: three warpgroups of
 * 64 rows, each promoting 64 accumulators per thread while the two others' wgmma runs.
 *
 *   warpgroup 0      producer: one thread, TMA for A (192 rows) and B (128 columns), bulk copies of
 *                    the K-block's 192 + 128 scales (MN-major, as the two-warpgroup kernel reads them);
 *   warpgroups 1-3   consumers: 64 rows each, wgmma m64n128k32 e4m3, 64 partial + 64 final fp32
 *                    accumulators per thread (160 registers: 4 x 128 x 32 + 12 x 128 x 160 = 64 Ki);
 *                    the BF16 kernel's epilogue stager, one per warpgroup.
 *
 * M-tiles of 192 rows: where M % 192 != 0 the last one reaches past M. TMA fills those A rows with
 * zeros and clips their stores; a warpgroup whose 64 rows all lie past M (M % 64 == 0, so a
 * warpgroup is wholly in or out) issues no wgmma: it only waits for the stages and releases them.
 */
#ifndef MOK_CUDA_GEMM_GROUPED_GEMM_FP8_WGRAD3_SM90_CUH
#define MOK_CUDA_GEMM_GROUPED_GEMM_FP8_WGRAD3_SM90_CUH

#include "grouped_gemm_fp8_sm90.cuh"

namespace mok_sm90_fp8 {

struct wgrad3 {
    using narrow = fp8_tile<128>; /* its wgmma K-block, column-wise promotion and K-block range */
    enum {
        BM = 192,
        BN = 128,
        kConsumers = 3,
        kThreads = 128 * (1 + kConsumers),
        kProducerRegs = 32,
        kConsumerRegs = 160,
        kStages = 4,
        STAGE_A_BYTES = BM * BK,
        STAGE_B_BYTES = BN * BK,
    };
    static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 64 * 1024, "the register file");

    struct smem_layout {
        uint8_t a[kStages][BM * BK];
        uint8_t b[kStages][BN * BK];
        __nv_bfloat16 epi[kConsumers][mok_sm90::kEpiBufs][64 * 64];
        /* the K-block's scales, two copies per stage selected by the ring phase (the stage goes back to
         * the producer once its wgmma has drained; its promotion still reads them: see fp8_tile::wsa) */
        float wsa[2][kStages][BM];
        float wsb[2][kStages][BN];
        uint64_t full[kStages];
        uint64_t empty[kStages];
    };
    static_assert(sizeof(smem_layout) + 1024 <= 227 * 1024, "shared memory budget of one CTA");
    static_assert(STAGE_A_BYTES % 1024 == 0 && STAGE_B_BYTES % 1024 == 0, "stage buffers keep 1024-byte alignment");

    static __device__ __forceinline__ void sched_init(mok_tile_sched* sched, const params& p) {
        mok_sched_init(sched, p.E, p.num_m_tiles, p.num_n_tiles, BM, INT64_MAX);
    }

    static __device__ __forceinline__ void produce(smem_layout& s, const params& p, const CUtensorMap* tma_a,
                                                   const CUtensorMap* tma_b) {
        if (threadIdx.x != 0) return;
        uint32_t stage = 0, phase = 0;
        mok_tile_sched sched;
        sched_init(&sched, p);
        mok_tile tile;
        while (mok_sched_next_tile(&sched, &tile)) {
            int64_t kb0, nkb;
            narrow::wgrad_kblocks(p, tile.group, kb0, nkb);
            const int64_t n0 = tile.n_tile * BN;
            /* a partial last M-tile copies the scales of its rows below M (a multiple of 64: whole
             * 256-byte runs); the others stay stale, in rows whose wgmma is skipped and never stored */
            const uint32_t sa_bytes = (uint32_t)((p.M - tile.m0 < BM ? p.M - tile.m0 : BM) * 4);
            const uint32_t scale_bytes = MOK_SM90_FP8_SKIP_SCALE_LOADS ? 0u : sa_bytes + BN * 4;
            for (int64_t kb = kb0; kb < kb0 + nkb; ++kb) {
                mbarrier_wait_parity(&s.empty[stage], phase ^ 1);
                const int32_t k0 = (int32_t)(kb * BK);
                mbarrier_arrive_expect_tx(&s.full[stage], STAGE_A_BYTES + STAGE_B_BYTES + scale_bytes);
                tma_load_2d(&s.a[stage][0], tma_a, &s.full[stage], k0, (int32_t)tile.m0);
                tma_load_2d(&s.b[stage][0], tma_b, &s.full[stage], k0, (int32_t)n0);
                if (!MOK_SM90_FP8_SKIP_SCALE_LOADS) {
                    bulk_load(&s.wsa[phase][stage][0], p.sa + kb * p.M + tile.m0, sa_bytes, &s.full[stage]);
                    bulk_load(&s.wsb[phase][stage][0], p.sb + kb * p.N + n0, BN * 4, &s.full[stage]);
                }
                if (++stage == kStages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
    }

    static __device__ __forceinline__ void consume(smem_layout& s, const params& p, const CUtensorMap* tma_out) {
        const int wg = consumer_wg(); /* 0..2, warp-uniform */
        const int t = threadIdx.x & 127, lane = t & 31;
        const int r_lo = wg * 64 + (t >> 5) * 16 + (lane >> 2); /* this thread's rows: r_lo, r_lo + 8 */
        const uint32_t a_base = mok_smem_u32(&s.a[0][wg * 64 * BK]), b_base = mok_smem_u32(&s.b[0][0]);
        mok_sm90::epi_stager epi = mok_sm90::make_epi_stager(mok_smem_u32(&s.epi[wg][0][0]), wg, t);
        uint32_t stage = 0, phase = 0;
        float part[BN / 2], acc[BN / 2];

        mok_tile_sched sched;
        sched_init(&sched, p);
        mok_tile tile;
        while (mok_sched_next_tile(&sched, &tile)) {
            int64_t kb0, nkb64;
            narrow::wgrad_kblocks(p, tile.group, kb0, nkb64);
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
            const int64_t m0 = tile.m0 + 64 * wg;
            /* NOTE: warp-uniform for ptxas (a shuffle from lane 0): the branches around the wgmma stay
             * non-divergent (see fp8_tile::consume) */
            const int nkb = __shfl_sync(0xFFFFFFFFu, (int)nkb64, 0);
            const bool rows_in = __shfl_sync(0xFFFFFFFFu, m0 < p.M ? 1 : 0, 0) != 0;
            for (int kb = 0; kb < nkb; ++kb) {
                mbarrier_wait_parity(&s.full[stage], phase);
                if (rows_in) {
                    narrow::mma_kblock(part, a_base + stage * STAGE_A_BYTES, b_base + stage * STAGE_B_BYTES);
                    wgmma_wait_group<0>();
                }
                /* the tiles are read: release the stage before the promotion (its scales stay) */
                if (lane == 0) mbarrier_arrive(&s.empty[stage]);
                if (rows_in && !MOK_SM90_FP8_NO_PROMOTE) {
                    const float* sa = &s.wsa[phase][stage][0];
                    narrow::promote_cols(acc, part, ld_shared_f32(&sa[r_lo]), ld_shared_f32(&sa[r_lo + 8]),
                                         &s.wsb[phase][stage][0], lane);
                }
                if (++stage == kStages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
            /* ---- epilogue: out[e, m, n] in [64 x 64] chunks through the [E, M, N] map ---- */
            if (rows_in) {
#pragma unroll
                for (int j = 0; j < BN / 64; ++j) {
                    const int32_t c = (int32_t)(tile.n_tile * BN + 64 * j);
                    const uint32_t buf = mok_sm90::epi_stage_acc(epi, acc, j);
                    mok_sm90::epi_store<true>(epi, buf, tma_out, c, (int32_t)m0, (int32_t)tile.group);
                }
            }
        }
        mok_sm90::epi_finish(epi);
    }
};

template <int kDummy = 0> /* a template, so that each translation unit that includes this emits it once */
__global__ void __launch_bounds__(wgrad3::kThreads, 1)
    grouped_gemm_fp8_wgrad3_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                                   const __grid_constant__ CUtensorMap tma_out, const params p) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    auto& s = *reinterpret_cast<wgrad3::smem_layout*>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    if (threadIdx.x == 0) {
        for (int i = 0; i < wgrad3::kStages; ++i) {
            mbarrier_init(&s.full[i], 1);                        /* expect_tx: tiles and scales */
            mbarrier_init(&s.empty[i], 4 * wgrad3::kConsumers); /* every consumer warp */
        }
        fence_mbarrier_init();
        tma_prefetch_descriptor(&tma_a);
        tma_prefetch_descriptor(&tma_b);
    }
    /* ---- 128-aligned, non-decreasing offsets within R only: another plan is reported, nothing computed ---- */
    if (plan_rejected(p, true)) return;
    if (threadIdx.x < 128) {
        setmaxnreg_dec<wgrad3::kProducerRegs>();
        wgrad3::produce(s, p, &tma_a, &tma_b);
    } else {
        setmaxnreg_inc<wgrad3::kConsumerRegs>();
        wgrad3::consume(s, p, &tma_out);
    }
}

}  // namespace mok_sm90_fp8

#endif /* MOK_CUDA_GEMM_GROUPED_GEMM_FP8_WGRAD3_SM90_CUH */
