/*
 * BF16 grouped GEMM "NT" for sm_90a: out[r, n] = sum_k A[r, k] * B[e(r), n, k] over the plan's row
 * space, persistent and warp-specialised.
 *
 *   warpgroup 0      producer: TMA for B (and for A when rows are contiguous), or cp.async
 *                    gather-on-load of A rows (row r reads a[a_gather[r] / a_gather_div]);
 *   warpgroups 1, 2  consumers: wgmma m64n256k16 on 64 rows each, f32 accumulators in registers,
 *                    epilogue straight from registers (plain store, or fused SwiGLU).
 *
 * Tile 128 x 256 x 64, kStages-deep shared-memory ring; full/empty mbarriers per stage.
 * The SwiGLU variant reads gate rows [n0, n0 + 128) and up rows [I + n0, I + n0 + 128) of the
 * expert's [2I, K] weight into one 256-row B tile, so each thread holds a gate value and its up
 * value in the same registers and writes h = [gate | up] and act = silu(gate) * up itself.
 *
 * Tiles straddling experts (plans whose row tile is not a multiple of 128) are run once per
 * expert segment, each pass storing only the segment's rows; mok's own CUDA plans are 128-aligned,
 * so that is one pass per tile. Rows outside [offsets[0], offsets[E]) are written as 0.
 *
 * The weight-gradient variant (kWgrad) reuses the pipeline with one tile group per expert and the
 * expert's rows as the contraction: out[e] = A'[:, rows of e] B'[:, rows of e]^T over transposed
 * copies A' [M, R], B' [N, R], both read by TMA.
 */
#ifndef MOK_CUDA_GEMM_GROUPED_GEMM_SM90_CUH
#define MOK_CUDA_GEMM_GROUPED_GEMM_SM90_CUH

#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "../common/dtype.cuh"
#include "../common/swiglu.cuh"
#include "../ptx/mbarrier.cuh"
#include "../ptx/tma.cuh"
#include "../ptx/wgmma.cuh"
#include "scheduler.cuh"

namespace mok_sm90 {

enum {
    BM = 128,
    BN = 256,
    BK = 64,
    kStages = 4,
    kThreads = 384,
    kProducerRegs = 56,
    kConsumerRegs = 224,
    A_STAGE_BYTES = BM * BK * 2,
    B_HALF_BYTES = (BN / 2) * BK * 2,
    B_STAGE_BYTES = BN * BK * 2,
};

/* Shared memory of one CTA; the tile buffers come first so each is 1024-byte aligned (128B swizzle). */
struct smem_layout {
    __nv_bfloat16 a[kStages][BM * BK];
    __nv_bfloat16 b[kStages][BN * BK];
    uint64_t full[kStages];
    uint64_t empty[kStages];
};
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
    /* Weight-gradient variant: out [E, M, N] = per expert A'[:, rows of e] B'[:, rows of e]^T with
     * A' = a [M, R] and B' [N, R] (transposed copies, rows contiguous); K = the expert's rows. */
    int64_t M;
    const __nv_bfloat16* a_t; /* [M, R] (its TMA map is tma_a) */
    const __nv_bfloat16* b_t; /* [N, R] (its TMA map is tma_b) */
};

__device__ __forceinline__ void store_bf16x2(__nv_bfloat16* p, float x, float y) {
    __nv_bfloat162 v;
    v.x = mok_from_acc<__nv_bfloat16>(x);
    v.y = mok_from_acc<__nv_bfloat16>(y);
    *reinterpret_cast<__nv_bfloat162*>(p) = v;
}

/* Walk of the expert segments of a tile: experts whose rows intersect [m0, m0 + BM). */
struct segment_walk {
    int32_t e, e_last;
};

__device__ __forceinline__ segment_walk segments_of(const params& p, int64_t m0, int64_t rows_used) {
    segment_walk w;
    const int64_t off0 = p.offsets[0];
    const int64_t first = m0 < off0 ? off0 : m0;
    int64_t last = m0 + BM - 1;
    last = last >= rows_used ? rows_used - 1 : last;
    if (first > last) {
        w.e = 1;
        w.e_last = 0;
        return w;
    }
    w.e = (int32_t)mok_expert_of_row(p.offsets, p.E, first);
    w.e_last = (int32_t)mok_expert_of_row(p.offsets, p.E, last);
    return w;
}

/* ------------------------------------------------------------------------------------------------
 * producer
 * ---------------------------------------------------------------------------------------------- */
template <bool kSwiGLU, bool kGather>
__device__ __forceinline__ void produce(smem_layout& s, const params& p, const CUtensorMap* tma_a,
                                        const CUtensorMap* tma_b, int64_t rows_used) {
    const int tid = threadIdx.x; /* 0..127 */
    const int64_t num_kb = (p.Kd + BK - 1) / BK;
    uint32_t stage = 0, phase = 0;
    mok_tile_sched sched;
    mok_sched_init(&sched, 1, (p.R + BM - 1) / BM, p.num_n_tiles, BM, rows_used);
    mok_tile tile;
    while (mok_sched_next_tile(&sched, &tile)) {
        if (!tile.in_use) continue;
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
        for (segment_walk w = segments_of(p, tile.m0, rows_used); w.e <= w.e_last; ++w.e) {
            if (p.offsets[w.e] == p.offsets[w.e + 1]) continue;
            for (int64_t kb = 0; kb < num_kb; ++kb) {
                /* ---- wait until the consumers have released the stage ---- */
                mbarrier_wait_parity(&s.empty[stage], phase ^ 1);
                const int32_t k0 = (int32_t)(kb * BK);
                if (tid == 0) {
                    mbarrier_arrive_expect_tx(&s.full[stage], B_STAGE_BYTES + (kGather ? 0 : A_STAGE_BYTES));
                    /* ---- issue TMA for B: two 128-row boxes (gate | up, or n0 | n0 + 128) ---- */
                    if (kSwiGLU) {
                        tma_load_4d(&s.b[stage][0], tma_b, &s.full[stage], k0, n_coord, 0, w.e);
                        tma_load_4d(&s.b[stage][(BN / 2) * BK], tma_b, &s.full[stage], k0, n_coord, 1, w.e);
                    } else {
                        tma_load_4d(&s.b[stage][0], tma_b, &s.full[stage], k0, n_coord, 0, w.e);
                        tma_load_4d(&s.b[stage][(BN / 2) * BK], tma_b, &s.full[stage], k0, n_coord + BN / 2, 0, w.e);
                    }
                    /* ---- issue TMA for A (contiguous rows) ---- */
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

/* The mainloop of one tile: wait for each K-block's stage, 4 wgmma k16 steps on it; the stage of
 * the previous K-block is released once its wgmma group has retired (one group stays in flight). */
template <bool kGather>
__device__ __forceinline__ void consume_kblocks(smem_layout& s, float* acc, int64_t num_kb, uint32_t& stage,
                                                uint32_t& phase, int wg, int lane) {
    uint32_t prev_stage = 0;
    for (int64_t kb = 0; kb < num_kb; ++kb) {
        mbarrier_wait_parity(&s.full[stage], phase);
        /* NOTE: gathered A was written by cp.async (generic proxy); wgmma reads through the async
         * proxy, so order the two in this thread before the first wgmma. */
        if (kGather) fence_proxy_async_shared();
        const uint32_t a_addr = mok_smem_u32(&s.a[stage][wg * 64 * BK]);
        const uint32_t b_addr = mok_smem_u32(&s.b[stage][0]);
        wgmma_fence();
#pragma unroll
        for (int k16 = 0; k16 < BK / 16; ++k16) {
            /* NOTE: a K step of 16 bf16 is 32 bytes inside the 128-byte swizzled row. */
            const uint64_t da = wgmma_desc_kmajor_sw128(a_addr + k16 * 32);
            const uint64_t db = wgmma_desc_kmajor_sw128(b_addr + k16 * 32);
            wgmma_m64n256k16_f32_bf16(acc, da, db, (kb > 0 || k16 > 0) ? 1 : 0);
        }
        wgmma_commit_group();
        wgmma_wait_group<1>();
        /* ---- release the previous stage: one arrival per consumer warp ---- */
        if (kb > 0 && lane == 0) mbarrier_arrive(&s.empty[prev_stage]);
        prev_stage = stage;
        if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
        }
    }
    wgmma_wait_group<0>();
    if (num_kb > 0 && lane == 0) mbarrier_arrive(&s.empty[prev_stage]);
}

template <bool kSwiGLU, bool kGather>
__device__ __forceinline__ void consume(smem_layout& s, const params& p, int64_t rows_used) {
    const int wg = (threadIdx.x / 128) - 1; /* consumer warpgroup 0 or 1: rows wg * 64 .. + 64 */
    const int t = threadIdx.x & 127;
    const int warp = t >> 5, lane = t & 31;
    const int lane4 = lane & 3;
    /* Rows of this thread inside the tile (wgmma accumulator layout): r_lo and r_lo + 8. */
    const int r_lo = wg * 64 + warp * 16 + (lane >> 2);
    const int64_t num_kb = (p.Kd + BK - 1) / BK;
    const int64_t off0 = p.offsets[0];
    uint32_t stage = 0, phase = 0;
    float acc[BN / 2];

    mok_tile_sched sched;
    mok_sched_init(&sched, 1, (p.R + BM - 1) / BM, p.num_n_tiles, BM, rows_used);
    mok_tile tile;
    while (mok_sched_next_tile(&sched, &tile)) {
        /* ---- rows outside [offsets[0], rows in use) are zeros ---- */
        for (int h = 0; h < 2; ++h) {
            const int64_t row = tile.m0 + r_lo + 8 * h;
            if (row < p.R && (row < off0 || row >= rows_used)) store_zero_row<kSwiGLU>(p, row, tile.n_tile, lane4);
        }
        if (!tile.in_use) continue;
        for (segment_walk w = segments_of(p, tile.m0, rows_used); w.e <= w.e_last; ++w.e) {
            const int64_t seg_lo = p.offsets[w.e], seg_hi = p.offsets[w.e + 1];
            if (seg_lo == seg_hi) continue;
            consume_kblocks<kGather>(s, acc, num_kb, stage, phase, wg, lane);
            /* ---- epilogue: rows of this segment only ---- */
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
    }
}

/* ------------------------------------------------------------------------------------------------
 * weight-gradient variant: one group per expert, K = the expert's rows [offsets[e], offsets[e+1])
 * ---------------------------------------------------------------------------------------------- */

/* K-blocks of expert e on the wgmma path, or -1 when its rows are not 64-aligned (such a tile runs
 * on the consumers' FMA fallback: mok's CUDA plans are 128-aligned, user offsets may not be). */
__device__ __forceinline__ int64_t wgrad_kblocks(const params& p, int64_t e) {
    const int64_t lo = p.offsets[e], hi = p.offsets[e + 1];
    if (lo % BK || hi % BK || hi < lo || hi > p.R) return -1;
    return (hi - lo) / BK;
}

__device__ __forceinline__ void produce_wgrad(smem_layout& s, const params& p, const CUtensorMap* tma_a,
                                              const CUtensorMap* tma_b) {
    if (threadIdx.x != 0) return; /* TMA only: one thread issues everything */
    uint32_t stage = 0, phase = 0;
    mok_tile_sched sched;
    mok_sched_init(&sched, p.E, (p.M + BM - 1) / BM, p.num_n_tiles, BM, INT64_MAX);
    mok_tile tile;
    while (mok_sched_next_tile(&sched, &tile)) {
        const int64_t num_kb = wgrad_kblocks(p, tile.group);
        const int32_t lo = p.offsets[tile.group];
        const int32_t n0 = (int32_t)(tile.n_tile * BN);
        for (int64_t kb = 0; kb < num_kb; ++kb) {
            mbarrier_wait_parity(&s.empty[stage], phase ^ 1);
            const int32_t k0 = lo + (int32_t)(kb * BK);
            mbarrier_arrive_expect_tx(&s.full[stage], B_STAGE_BYTES + A_STAGE_BYTES);
            tma_load_4d(&s.b[stage][0], tma_b, &s.full[stage], k0, n0, 0, 0);
            tma_load_4d(&s.b[stage][(BN / 2) * BK], tma_b, &s.full[stage], k0, n0 + BN / 2, 0, 0);
            tma_load_2d(&s.a[stage][0], tma_a, &s.full[stage], k0, (int32_t)tile.m0);
            if (++stage == kStages) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
}

__device__ __forceinline__ void consume_wgrad(smem_layout& s, const params& p) {
    const int wg = (threadIdx.x / 128) - 1;
    const int t = threadIdx.x & 127;
    const int warp = t >> 5, lane = t & 31;
    const int lane4 = lane & 3;
    const int r_lo = wg * 64 + warp * 16 + (lane >> 2);
    uint32_t stage = 0, phase = 0;
    float acc[BN / 2];

    mok_tile_sched sched;
    mok_sched_init(&sched, p.E, (p.M + BM - 1) / BM, p.num_n_tiles, BM, INT64_MAX);
    mok_tile tile;
    while (mok_sched_next_tile(&sched, &tile)) {
        const int64_t num_kb = wgrad_kblocks(p, tile.group);
        if (num_kb > 0) {
            consume_kblocks<false>(s, acc, num_kb, stage, phase, wg, lane);
        } else {
            /* ---- no rows (zeros), or unaligned rows: one FMA chain per output, in row order ---- */
            int64_t lo = p.offsets[tile.group], hi = num_kb == 0 ? lo : p.offsets[tile.group + 1];
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
                                v = fmaf(__bfloat162float(p.a_t[m * p.R + r]), __bfloat162float(p.b_t[n * p.R + r]), v);
                        }
                        acc[i * 4 + 2 * h + c] = v;
                    }
                }
            }
        }
        /* ---- epilogue: out[e, m, n] ---- */
        __nv_bfloat16* out = p.out + tile.group * p.M * p.N;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t m = tile.m0 + r_lo + 8 * h;
            if (m >= p.M) continue;
#pragma unroll
            for (int i = 0; i < BN / 8; ++i) {
                const int64_t c = tile.n_tile * BN + i * 8 + lane4 * 2;
                if (c < p.N) store_bf16x2(out + m * p.N + c, acc[i * 4 + 2 * h], acc[i * 4 + 2 * h + 1]);
            }
        }
    }
}

template <bool kSwiGLU, bool kGather, bool kWgrad>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_bf16_nt_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                                const params p) {
    static_assert(!kWgrad || (!kSwiGLU && !kGather), "the weight-gradient variant reads both operands by TMA");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    /* NOTE: the 128B swizzle pattern is a function of address bits [9:4]: align the ring to 1024. */
    smem_layout& s = *reinterpret_cast<smem_layout*>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);

    /* ---- barriers: full waits for the producer's bytes (and cp.async arrivals), empty for
     * one arrival per consumer warp ---- */
    if (threadIdx.x == 0) {
        for (int i = 0; i < kStages; ++i) {
            mbarrier_init(&s.full[i], kGather ? 1 + 128 : 1);
            mbarrier_init(&s.empty[i], 8);
        }
        fence_mbarrier_init();
        tma_prefetch_descriptor(&tma_b);
        if (!kGather) tma_prefetch_descriptor(&tma_a);
    }
    __syncthreads();

    if (threadIdx.x < 128) {
        setmaxnreg_dec<kProducerRegs>();
        if (kWgrad) {
            produce_wgrad(s, p, &tma_a, &tma_b);
        } else {
            produce<kSwiGLU, kGather>(s, p, &tma_a, &tma_b, mok_rows_in_use(p.offsets, p.E, p.R));
        }
    } else {
        setmaxnreg_inc<kConsumerRegs>();
        if (kWgrad) {
            consume_wgrad(s, p);
        } else {
            consume<kSwiGLU, kGather>(s, p, mok_rows_in_use(p.offsets, p.E, p.R));
        }
    }
}

}  // namespace mok_sm90

#endif /* MOK_CUDA_GEMM_GROUPED_GEMM_SM90_CUH */
