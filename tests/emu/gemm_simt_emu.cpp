/*
 * The SIMT grouped GEMMs (csrc/cuda/gemm/grouped_gemm_simt.cuh: NT and NN over the plan's rows with gather-on-load,
 * and the weight gradient with a ragged contraction), run on the CPU through cuda_emu.h as the launchers run them
 * (grouped_gemm_simt_run / grouped_gemm_wgrad_simt_run). Two comparisons per case:
 *   - bit for bit with the kernels' documented arithmetic: one accumulator per output element, fused multiply-adds
 *     in increasing k (or r) from +0, rounded once (the model below, written from mok_core.h's definition, not from
 *     the kernel's tiling);
 *   - with the C core (mok_grouped_gemm / _wgrad, products and sums rounded separately) within the rounding that
 *     difference allows, which pins the model's meaning: gather rule, layouts, zero rows, empty experts.
 * Cases: every dtype, NT and NN, gathered rows (a divisor, rows of zeros), plans with empty experts, one expert
 * taking every row, rows before offsets[0] and past offsets[E], plan tiles that split a 64-row tile between
 * experts, K = 0, sizes not multiples of 64 or 16, and grids smaller than the tile count (device 1, num_sms = 1).
 * Built and run by tests/test_gemm_simt_emu.py:
 *
 *     gemm_simt_emu SEED     prints one line per failure and "N passed, N failed"
 */
#include "cuda_emu.h"
#include "emu_check.h"

#include "emu_ops.h"
#include "gemm/grouped_gemm_simt.cuh"
#include "mok_core.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace {

using emu::Rng;

using emu::emulated;
using emu::name_of;
using emu::ran;
using emu::size_of;

/* element i of a dt buffer as the accumulation type would hold it (exact: every dt widens exactly to double) */
double element(const std::vector<uint8_t>& b, mok_dtype dt, int64_t i) {
    const uint8_t* at = b.data() + (size_t)i * size_of(dt);
    if (dt == MOK_F64) {
        double v;
        memcpy(&v, at, 8);
        return v;
    }
    if (dt == MOK_F32) {
        float v;
        memcpy(&v, at, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, at, 2);
    return dt == MOK_BF16 ? (double)__bfloat162float(__ushort_as_bfloat16(h))
                          : (double)__half2float(__ushort_as_half(h));
}

/* The documented arithmetic of one output element: fma over (x[k], y[k]) in order from +0 in the accumulation type,
 * rounded once to dt (round to nearest even), as bytes at out + i. */
void model_element(mok_dtype dt, const std::vector<double>& x, const std::vector<double>& y, std::vector<uint8_t>& out,
                   int64_t i) {
    uint8_t* at = out.data() + (size_t)i * size_of(dt);
    if (dt == MOK_F64) {
        double acc = 0.0;
        for (size_t k = 0; k < x.size(); ++k) acc = std::fma(x[k], y[k], acc);
        memcpy(at, &acc, 8);
        return;
    }
    float acc = 0.0f;
    for (size_t k = 0; k < x.size(); ++k) acc = std::fmaf((float)x[k], (float)y[k], acc);
    if (dt == MOK_F32) {
        memcpy(at, &acc, 4);
        return;
    }
    const uint16_t h =
        dt == MOK_BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(acc)) : __half_as_ushort(__float2half_rn(acc));
    memcpy(at, &h, 2);
}

/* got (the kernel) within rounding of core (the C core): |got - core| <= 2 K u_acc S + 2 u_dt |core| + the smallest
 * normal's ulp of dt, S the sum of |products| of the element (each side's sum errs by at most K u_acc S, each
 * rounding to dt by half an ulp). */
bool within_rounding(mok_dtype dt, const std::vector<uint8_t>& got, const std::vector<uint8_t>& core,
                     const std::vector<double>& abs_sums, int64_t K, const std::string& what) {
    const double u_acc = dt == MOK_F64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
    const double u_dt = dt == MOK_F64    ? std::ldexp(1.0, -53)
                        : dt == MOK_F32  ? std::ldexp(1.0, -24)
                        : dt == MOK_BF16 ? std::ldexp(1.0, -8)
                                         : std::ldexp(1.0, -11);
    const double tiny = dt == MOK_F16 ? std::ldexp(1.0, -24) : dt == MOK_BF16 ? std::ldexp(1.0, -133) : 0.0;
    for (size_t i = 0; i < abs_sums.size(); ++i) {
        const double g = element(got, dt, (int64_t)i), c = element(core, dt, (int64_t)i);
        const double tol = 2.0 * (double)K * u_acc * abs_sums[i] + 2.0 * u_dt * std::fabs(c) + tiny;
        if (!(std::fabs(g - c) <= tol)) {
            char detail[160];
            snprintf(detail, sizeof detail, ": element %zu got %.9g, core %.9g (tolerance %.3g)", i, g, c, tol);
            return emu::expect(false, what + detail);
        }
    }
    return emu::expect(true, what);
}

/* A plan over R rows for E experts: offsets[0] >= 0, non-decreasing, offsets[E] <= R, in multiples of `tile`
 * where the shape says so; kinds: 0 random, 1 one expert takes everything, 2 rows before offsets[0] and past
 * offsets[E] unused. */
std::vector<int32_t> random_plan(Rng& rng, int64_t R, int64_t E, int64_t tile, int kind) {
    std::vector<int32_t> off((size_t)E + 1, 0);
    if (kind == 1) {
        const int64_t e = rng.below(E);
        for (int64_t i = e + 1; i <= E; ++i) off[(size_t)i] = (int32_t)R;
        return off;
    }
    const int64_t lo = kind == 2 ? std::min<int64_t>(R, tile * rng.below(2)) : 0;
    const int64_t hi = kind == 2 ? std::max<int64_t>(lo, R - rng.below(tile + 1)) : R;
    std::vector<int64_t> cuts;
    for (int64_t i = 0; i + 1 < E; ++i) {
        int64_t c = lo + rng.below(hi - lo + 1);
        if (rng.below(3) != 0) c = std::min(hi, lo + (c - lo) / tile * tile); /* mostly plan-tile multiples */
        cuts.push_back(c);
    }
    std::sort(cuts.begin(), cuts.end());
    off[0] = (int32_t)lo;
    for (int64_t i = 1; i < E; ++i) off[(size_t)i] = (int32_t)cuts[(size_t)i - 1];
    off[(size_t)E] = (int32_t)hi;
    return off;
}

/* the row a gather-on-load reads for row r (mok_core.h's rule): r, gather[r] / div, or -1 for zeros */
int64_t source_row(const std::vector<int32_t>& gather, int64_t div, int64_t r) {
    return gather.empty() ? r : gather[(size_t)r] < 0 ? -1 : gather[(size_t)r] / div;
}

/* a gather of R entries into `rows` source rows with divisor div: every sixth or so -1 (a row of zeros) */
std::vector<int32_t> random_gather(Rng& rng, int64_t R, int64_t rows, int64_t div) {
    std::vector<int32_t> gather((size_t)R);
    for (auto& g : gather) g = rng.below(6) == 0 ? -1 : (int32_t)rng.below(rows * div);
    return gather;
}

/* NT / NN: out [R, N] = A [R, Kd] times expert e's b, A's rows gathered or not */
void gemm_case(Rng& rng, mok_dtype dt, int64_t R, int64_t E, int64_t N, int64_t Kd, bool trans_b, bool gathered,
               int plan_kind, int num_sms) {
    const int64_t div = gathered ? 1 + rng.below(3) : 1;
    const int64_t Ra = gathered ? std::max<int64_t>(1, R / 2 + 3) : R;
    std::vector<uint8_t> a = emu::random_elements(rng, dt, std::max<int64_t>(Ra * Kd, 1), 0, -2.0, 2.0);
    std::vector<uint8_t> b = emu::random_elements(rng, dt, std::max<int64_t>(E * N * Kd, 1), 0, -2.0, 2.0);
    const std::vector<int32_t> gather = gathered ? random_gather(rng, R, Ra, div) : std::vector<int32_t>();
    const std::vector<int32_t> off =
        random_plan(rng, R, E, rng.below(3) == 0 ? 64 : 8 * (1 + rng.below(12)), plan_kind);
    const size_t es = size_of(dt);

    /* the model, the core's answer and each element's sum of |products| */
    std::vector<uint8_t> model((size_t)(R * N) * es, 0), core((size_t)(R * N) * es, 0xEE);
    std::vector<double> abs_sums((size_t)(R * N), 0.0);
    std::vector<double> x((size_t)Kd), y((size_t)Kd);
    for (int64_t r = 0; r < R; ++r) {
        int64_t e = -1;
        for (int64_t i = 0; i < E; ++i)
            if (off[(size_t)i] <= r && r < off[(size_t)i + 1]) e = i;
        const int64_t src = source_row(gather, div, r);
        for (int64_t n = 0; n < N; ++n) {
            if (e < 0) { /* a row of no expert: zeros (model already zero-filled) */
                continue;
            }
            double s = 0.0;
            for (int64_t k = 0; k < Kd; ++k) {
                x[(size_t)k] = src < 0 ? 0.0 : element(a, dt, src * Kd + k);
                y[(size_t)k] = element(b, dt, trans_b ? (e * N + n) * Kd + k : (e * Kd + k) * N + n);
                s += std::fabs(x[(size_t)k] * y[(size_t)k]);
            }
            model_element(dt, x, y, model, r * N + n);
            abs_sums[(size_t)(r * N + n)] = s;
        }
    }
    if (mok_grouped_gemm(a.data(), gathered ? gather.data() : nullptr, div, b.data(), dt, off.data(), E, N, Kd,
                         trans_b ? 1 : 0, 0, R, core.data()) != MOK_OK)
        throw std::runtime_error("core grouped_gemm");

    std::vector<uint8_t> got((size_t)(R * N) * es, 0xA5);
    mok_grouped_gemm_args args;
    memset(&args, 0, sizeof args);
    args.a = a.data();
    args.a_gather = gathered ? gather.data() : nullptr;
    args.a_gather_div = div;
    args.b = b.data();
    args.dtype = dt;
    args.offsets = off.data();
    args.R = R;
    args.E = E;
    args.N = N;
    args.Kd = Kd;
    args.trans_b = trans_b ? 1 : 0;
    args.out = got.data();
    args.num_sms = num_sms;
    char label[240];
    snprintf(label, sizeof label,
             "gemm %s %s R=%lld E=%lld N=%lld K=%lld gather=%lld plan=%d [%d..%d] num_sms=%d device=%d", name_of(dt),
             trans_b ? "NT" : "NN", (long long)R, (long long)E, (long long)N, (long long)Kd,
             gathered ? (long long)div : 0LL, plan_kind, off[0], off[(size_t)E], num_sms, emu::device());
    if (!ran(label, [&] { return mok_gemm_simt::grouped_gemm_simt_run(&args, emulated()); })) return;
    emu::expect_same_bytes(got.data(), model.data(), model.size(), std::string(label) + " out against the model");
    within_rounding(dt, got, core, abs_sums, Kd, std::string(label) + " out against the core");
}

/* weight gradient: out [E, M, N], expert e's rows r of a [R, M] against B[r] = b [Rb, N] gathered or not; `past_r`
 * makes the last expert's rows run past R (a malformed plan: the kernel clamps, the core is not asked) */
void wgrad_case(Rng& rng, mok_dtype dt, int64_t R, int64_t E, int64_t M, int64_t N, bool gathered, int plan_kind,
                bool past_r, int num_sms) {
    const int64_t div = gathered ? 1 + rng.below(3) : 1;
    const int64_t Rb = gathered ? std::max<int64_t>(1, R / 2 + 2) : R;
    std::vector<uint8_t> a = emu::random_elements(rng, dt, std::max<int64_t>(R * M, 1), 0, -2.0, 2.0);
    std::vector<uint8_t> b = emu::random_elements(rng, dt, std::max<int64_t>(Rb * N, 1), 0, -2.0, 2.0);
    const std::vector<int32_t> gather = gathered ? random_gather(rng, R, Rb, div) : std::vector<int32_t>();
    std::vector<int32_t> off = random_plan(rng, R, E, 8 * (1 + rng.below(8)), plan_kind);
    if (past_r) off[(size_t)E] = (int32_t)(R + 1 + rng.below(20));
    const size_t es = size_of(dt);

    std::vector<uint8_t> model((size_t)(E * M * N) * es, 0), core((size_t)(E * M * N) * es, 0xEE);
    std::vector<double> abs_sums((size_t)(E * M * N), 0.0);
    std::vector<double> x, y;
    int64_t longest = 0;
    for (int64_t e = 0; e < E; ++e) {
        const int64_t rb = std::min<int64_t>(std::max<int64_t>(off[(size_t)e], 0), R);
        const int64_t re = std::min<int64_t>(std::max<int64_t>(off[(size_t)e + 1], rb), R);
        longest = std::max(longest, re - rb);
        x.assign((size_t)(re - rb), 0.0);
        y.assign((size_t)(re - rb), 0.0);
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
                double s = 0.0;
                for (int64_t r = rb; r < re; ++r) {
                    const int64_t src = source_row(gather, div, r);
                    x[(size_t)(r - rb)] = element(a, dt, r * M + m);
                    y[(size_t)(r - rb)] = src < 0 ? 0.0 : element(b, dt, src * N + n);
                    s += std::fabs(x[(size_t)(r - rb)] * y[(size_t)(r - rb)]);
                }
                model_element(dt, x, y, model, (e * M + m) * N + n);
                abs_sums[(size_t)((e * M + m) * N + n)] = s;
            }
    }

    std::vector<uint8_t> got((size_t)(E * M * N) * es, 0xA5);
    mok_grouped_gemm_wgrad_args args;
    memset(&args, 0, sizeof args);
    args.a = a.data();
    args.b = b.data();
    args.b_gather = gathered ? gather.data() : nullptr;
    args.b_gather_div = div;
    args.dtype = dt;
    args.offsets = off.data();
    args.R = R;
    args.E = E;
    args.M = M;
    args.N = N;
    args.out = got.data();
    args.num_sms = num_sms;
    char label[240];
    snprintf(label, sizeof label, "wgrad %s R=%lld E=%lld M=%lld N=%lld gather=%lld plan=%d%s num_sms=%d device=%d",
             name_of(dt), (long long)R, (long long)E, (long long)M, (long long)N, gathered ? (long long)div : 0LL,
             plan_kind, past_r ? " past R" : "", num_sms, emu::device());
    if (!ran(label, [&] { return mok_gemm_simt::grouped_gemm_wgrad_simt_run(&args, emulated()); })) return;
    emu::expect_same_bytes(got.data(), model.data(), model.size(), std::string(label) + " out against the model");
    if (past_r) return;
    if (mok_grouped_gemm_wgrad(a.data(), b.data(), gathered ? gather.data() : nullptr, div, dt, off.data(), M, N, 0, E,
                               core.data()) != MOK_OK)
        throw std::runtime_error("core grouped_gemm_wgrad");
    within_rounding(dt, got, core, abs_sums, longest, std::string(label) + " out against the core");
}

}  // namespace

int main(int argc, char** argv) {
    Rng rng{argc > 1 ? strtoull(argv[1], nullptr, 10) : 1};
    for (int device : {0, 1}) { /* 132 SMs, or one: persistent CTAs walking several tiles */
        emu::device() = device;
        for (mok_dtype dt : {MOK_BF16, MOK_F16, MOK_F32, MOK_F64}) {
            /* R E N Kd: one row, K = 0, one expert, sizes off the 64 / 16 grid, several 64-row tiles */
            for (const auto& s : std::vector<std::vector<int64_t>>{
                     {1, 1, 5, 7}, {37, 3, 64, 0}, {70, 1, 33, 16}, {150, 4, 70, 37}, {200, 6, 129, 20}})
                for (bool trans_b : {true, false})
                    for (bool gathered : {false, true}) {
                        const int plan_kind = (int)rng.below(3);
                        gemm_case(rng, dt, s[0], s[1], s[2], s[3], trans_b, gathered, plan_kind,
                                  device == 0 && gathered ? 2 : 0);
                    }
            /* R E M N: an expert with no rows, one taking everything, M and N off the 64 grid */
            for (const auto& s :
                 std::vector<std::vector<int64_t>>{{0, 2, 5, 9}, {1, 1, 3, 70}, {45, 3, 65, 17}, {130, 4, 40, 66}})
                for (bool gathered : {false, true})
                    for (int plan_kind : {0, 1}) {
                        wgrad_case(rng, dt, s[0], s[1], s[2], s[3], gathered, plan_kind, false,
                                   device == 0 && gathered ? 1 : 0);
                    }
            wgrad_case(rng, dt, 50, 3, 20, 30, true, 2, true, 0);
        }
    }
    return emu::finish();
}
