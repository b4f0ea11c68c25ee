/*
 * The row-movement kernels (csrc/cuda/rows/rows.cuh: gather_rows, combine, combine_weight_grad, chosen as the
 * launcher chooses them) run on the CPU through cuda_emu.h and compared with the C core: gather and combine bit
 * for bit (the same arithmetic per element, k in order), combine_weight_grad within float rounding of the core's
 * serial sum (the kernel's fixed-shape reduction is another order) and bit for bit between two runs. Every dtype
 * (bf16 on its 16-byte path and, misaligned or H % 8 != 0, on the scalar one; f16, f32, f64), weighted and plain,
 * padding rows, indices past their tensors (a zero row / a skipped term on the GPU), the token walk of plain bf16
 * copies with the inverse map (K from 4 to 32; its result must not depend on what row_of holds), K = 1, one token,
 * and grids whose blocks take several rows or tokens. Built and run by tests/test_rows_emu.py:
 *
 *     rows_emu SEED     prints one line per failure and "N passed, N failed"
 */
#include "cuda_emu.h"
#include "emu_check.h"

#include "emu_ops.h"
#include "rows/rows.cuh"
#include "mok_core.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

namespace {

using emu::Rng;

using emu::acc_bytes;
using emu::acc_at;
using emu::emulated;
using emu::name_of;
using emu::ran;
using emu::size_of;

/* elements of dt in [-2, 2) */
std::vector<uint8_t> random_elements(Rng& rng, mok_dtype dt, int64_t n, size_t pad) {
    return emu::random_elements(rng, dt, n, pad, -2.0, 2.0);
}

/* weights in the accumulation type, in [-0.5, 1.5) */
std::vector<uint8_t> random_weights(Rng& rng, mok_dtype dt, int64_t n) {
    std::vector<double> v((size_t)n);
    for (auto& x : v) x = rng.uniform() * 2.0 - 0.5;
    return acc_bytes(v, dt);
}

/* gather: R rows of x [T, H] by src_of_row (padding -1, some past T * K), weighted or not; with_row_of: the
 * inverse map given as the layers give it (consistent) or as garbage (the result must be the same) */
void gather_case(Rng& rng, mok_dtype dt, int64_t T, int64_t H, int64_t K, int64_t R, bool weighted, int row_of_kind,
                 size_t misalign) {
    const int64_t TK = T * K;
    std::vector<uint8_t> x = random_elements(rng, dt, T * H, misalign);
    std::vector<uint8_t> w = random_weights(rng, dt, TK);
    std::vector<int32_t> src((size_t)R, -1), src_core((size_t)R), row_of((size_t)TK, -1);
    /* a permutation of the pairs into the first rows (a plan's), padding after; a few past T * K */
    std::vector<int32_t> pairs((size_t)TK);
    for (int64_t i = 0; i < TK; ++i) pairs[(size_t)i] = (int32_t)i;
    for (int64_t i = TK - 1; i > 0; --i) std::swap(pairs[(size_t)i], pairs[(size_t)rng.below(i + 1)]);
    for (int64_t r = 0; r < R; ++r) {
        const int64_t kind = rng.below(10);
        if (r < TK && kind < 8) src[(size_t)r] = pairs[(size_t)r];
        else if (kind == 8) src[(size_t)r] = (int32_t)(TK + rng.below(5)); /* past T * K: a zero row */
        if (src[(size_t)r] >= 0 && src[(size_t)r] < TK) row_of[(size_t)src[(size_t)r]] = (int32_t)r;
        src_core[(size_t)r] = src[(size_t)r] < TK ? src[(size_t)r] : -1;
    }
    if (row_of_kind == 2)
        for (auto& v : row_of) v = (int32_t)rng.below(R + 3) - 2; /* garbage: only a hint */
    const size_t es = size_of(dt);
    std::vector<uint8_t> want((size_t)(R * H) * es), got((size_t)(R * H) * es + misalign, 0xA5);
    if (mok_gather_rows(x.data() + misalign, dt, T, H, K, src_core.data(), weighted ? w.data() : nullptr, 0, R,
                        want.data()) != MOK_OK)
        throw std::runtime_error("core gather_rows");
    mok_gather_rows_args a;
    a.x = x.data() + misalign;
    a.dtype = dt;
    a.T = T;
    a.H = H;
    a.K = K;
    a.R = R;
    a.src_of_row = src.data();
    a.w = weighted ? w.data() : nullptr;
    a.out = got.data() + misalign;
    a.row_of = row_of_kind ? row_of.data() : nullptr;
    char label[200];
    snprintf(label, sizeof label, "gather %s T=%lld H=%lld K=%lld R=%lld weighted=%d row_of=%d misalign=%zu device=%d",
             name_of(dt), (long long)T, (long long)H, (long long)K, (long long)R, weighted, row_of_kind, misalign,
             emu::device());
    if (!ran(label, [&] { return mok_rows::gather_rows_run(&a, emulated()); })) return;
    emu::expect_same_bytes(got.data() + misalign, want.data(), want.size(), std::string(label) + " out");
}

/* row_of [n] for combine and its weight gradient: rows of [0, R), some -1 and some past R (skipped on the GPU);
 * core: the same with past-R entries as -1 (the core refuses them) */
void random_row_of(Rng& rng, int64_t n, int64_t R, std::vector<int32_t>& row_of, std::vector<int32_t>& core) {
    row_of.resize((size_t)n);
    core.resize((size_t)n);
    for (size_t i = 0; i < row_of.size(); ++i) {
        const int64_t kind = rng.below(10);
        row_of[i] = kind == 0 ? -1 : kind == 1 ? (int32_t)(R + rng.below(4)) : R > 0 ? (int32_t)rng.below(R) : -1;
        core[i] = row_of[i] < R ? row_of[i] : -1;
    }
}

/* combine: y [T, H] from rows [R, H] by row_of (-1 and past-R entries skipped), weighted or not */
void combine_case(Rng& rng, mok_dtype dt, int64_t T, int64_t H, int64_t K, int64_t R, bool weighted, size_t misalign) {
    std::vector<uint8_t> rows = random_elements(rng, dt, R * H, misalign);
    std::vector<uint8_t> w = random_weights(rng, dt, T * K);
    std::vector<int32_t> row_of, row_of_core;
    random_row_of(rng, T * K, R, row_of, row_of_core);
    const size_t es = size_of(dt);
    std::vector<uint8_t> want((size_t)(T * H) * es), got((size_t)(T * H) * es + misalign, 0xA5);
    if (mok_combine(rows.data() + misalign, dt, R, H, row_of_core.data(), weighted ? w.data() : nullptr, K, 0, T,
                    want.data()) != MOK_OK)
        throw std::runtime_error("core combine");
    mok_combine_args a;
    a.rows = rows.data() + misalign;
    a.dtype = dt;
    a.R = R;
    a.H = H;
    a.T = T;
    a.K = K;
    a.row_of = row_of.data();
    a.w = weighted ? w.data() : nullptr;
    a.y = got.data() + misalign;
    char label[200];
    snprintf(label, sizeof label, "combine %s T=%lld H=%lld K=%lld R=%lld weighted=%d misalign=%zu device=%d",
             name_of(dt), (long long)T, (long long)H, (long long)K, (long long)R, weighted, misalign, emu::device());
    if (!ran(label, [&] { return mok_rows::combine_run(&a, emulated()); })) return;
    emu::expect_same_bytes(got.data() + misalign, want.data(), want.size(), std::string(label) + " y");
}

/* combine_weight_grad: d_w [T, K] = dy[t] . rows[row_of[t, k]] */
void weight_grad_case(Rng& rng, mok_dtype dt, int64_t T, int64_t H, int64_t K, int64_t R, size_t misalign) {
    std::vector<uint8_t> dy = random_elements(rng, dt, T * H, misalign), rows = random_elements(rng, dt, R * H, misalign);
    std::vector<int32_t> row_of, row_of_core;
    random_row_of(rng, T * K, R, row_of, row_of_core);
    const bool f64 = dt == MOK_F64;
    const size_t ws = f64 ? 8 : 4;
    std::vector<uint8_t> want((size_t)(T * K) * ws), got1(want.size(), 0xA5), got2(want.size(), 0x5A);
    if (mok_combine_weight_grad(dy.data() + misalign, rows.data() + misalign, dt, H, row_of_core.data(), K, 0, T,
                                want.data()) != MOK_OK)
        throw std::runtime_error("core combine_weight_grad");
    mok_combine_weight_grad_args a;
    a.dy = dy.data() + misalign;
    a.rows = rows.data() + misalign;
    a.dtype = dt;
    a.R = R;
    a.H = H;
    a.T = T;
    a.K = K;
    a.row_of = row_of.data();
    char label[200];
    snprintf(label, sizeof label, "combine_weight_grad %s T=%lld H=%lld K=%lld R=%lld misalign=%zu device=%d",
             name_of(dt), (long long)T, (long long)H, (long long)K, (long long)R, misalign, emu::device());
    a.d_w = got1.data();
    if (!ran(label, [&] { return mok_rows::combine_weight_grad_run(&a, emulated()); })) return;
    a.d_w = got2.data();
    if (!ran(std::string(label) + " again", [&] { return mok_rows::combine_weight_grad_run(&a, emulated()); })) return;
    emu::expect(got1 == got2, std::string(label) + " deterministic");
    /* within rounding of the serial sum: |got - want| <= 2 H eps sum |dy| |rows| (H <= a few hundred here) */
    bool close = true;
    for (int64_t i = 0; i < T * K; ++i) {
        const double g = acc_at(got1, dt, i), v = acc_at(want, dt, i);
        const double eps = f64 ? 2.2e-16 : 1.2e-7;
        close = close && std::fabs(g - v) <= 2.0 * (double)H * eps * 4.0 * (double)H + 1e-30;
        if (row_of_core[(size_t)i] < 0) close = close && g == 0.0;
    }
    emu::expect(close, std::string(label) + " d_w");
}

}  // namespace

int main(int argc, char** argv) {
    Rng rng{argc > 1 ? strtoull(argv[1], nullptr, 10) : 1};
    for (int device : {0, 1}) { /* 132 SMs: a block per row / token; one SM: blocks take several */
        emu::device() = device;
        for (mok_dtype dt : {MOK_BF16, MOK_F16, MOK_F32, MOK_F64}) {
            for (size_t misalign : {(size_t)0, size_of(dt)}) {
                for (const auto& s : std::vector<std::array<int64_t, 4>>{
                         {1, 8, 1, 1}, {5, 64, 2, 16}, {37, 40, 8, 300}, {20, 12, 4, 90}, {60, 264, 6, 400}}) {
                    const int64_t T = s[0], H = s[1], K = s[2], R = s[3];
                    for (bool weighted : {false, true}) {
                        gather_case(rng, dt, T, H, K, R, weighted, 0, misalign);
                        combine_case(rng, dt, T, H, K, std::max<int64_t>(R, 1), weighted, misalign);
                    }
                    for (int row_of_kind : {1, 2}) gather_case(rng, dt, T, H, K, R, false, row_of_kind, misalign);
                    weight_grad_case(rng, dt, T, H, K, std::max<int64_t>(R, 1), misalign);
                }
            }
        }
        /* the token walk at its bounds (K = 4 and 32) and past them (3, 33: the row-per-block kernel) */
        for (int64_t K : {3, 4, 32, 33}) {
            gather_case(rng, MOK_BF16, 21, 24, K, 21 * K + 40, false, 1, 0);
            gather_case(rng, MOK_BF16, 21, 24, K, 21 * K + 40, false, 2, 0);
        }
    }
    return emu::finish();
}
