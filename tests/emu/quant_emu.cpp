/*
 * mok's bf16 FP8 tile kernels (csrc/cuda/quant/quantize_bf16_tile.cuh) run on the CPU through
 * cuda_emu.h and compared byte for byte with the C core: row-wise quantisation for the three
 * recipes and the fused row-wise + column-wise kernel against quantize(x) and quantize(x^T), on
 * random bf16 data with edge blocks (zeros, NaN, Inf, saturation, subnormals, quotients below
 * float's normal range, blocks below the division-free threshold), ragged shapes and misaligned
 * pointers; and the SwiGLU + quantisation kernels (quant/swiglu_quantize_tile.cuh, forward and
 * backward, row-wise / column-wise / both, with and without the bf16 result) against the same SwiGLU
 * arithmetic run element by element here, then the C core's quantisation; and the streamed SwiGLU
 * kernels (quant/swiglu_quantize_stream.cuh: persistent; the forward's loads one or two items ahead, the
 * backward's a ring of rows ahead per output tile) the same way; and the MXFP8 quantise-dequantise kernel
 * (quant/qdq_mxfp8.cuh: row-wise / column-wise / both, plans, gathered rows) and the BF16 GEMM's on-load
 * qdq of a K-major shared-memory tile (quant/qdq_mxfp8_smem.cuh) against the C core's mok_qdq_mxfp8_rows /
 * _cols. Built and run by tests/test_fp8_emu.py:
 *
 *     quant_emu SEED     prints one line per failure and "N passed, N failed"
 */
#include "cuda_emu.h"
#include "emu_check.h"

#include "quant/quantize_bf16_tile.cuh"
#include "quant/swiglu_quantize_tile.cuh"
#include "quant/swiglu_quantize_stream.cuh"
#include "quant/rowcol_stream.cuh"
#include "quant/qdq_mxfp8.cuh"
#include "quant/qdq_mxfp8_smem.cuh"
#include "common/vec.cuh"
#include "mok_core.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using emu::Rng;

/* bf16 bits: row r gets an exponent centre of its own (so blocks see very different scales), some
 * rows are special (all zero, tiny, subnormal), and single NaN / Inf / saturating values land in
 * random blocks. */
std::vector<uint16_t> make_input(Rng& rng, int64_t M, int64_t N) {
    std::vector<uint16_t> x((size_t)(M * N));
    for (int64_t r = 0; r < M; ++r) {
        const int kind = rng.below(16);
        const int centre = kind == 0 ? 1 : kind == 1 ? 20 : 100 + rng.below(80); /* subnormal-ish, tiny, normal */
        for (int64_t c = 0; c < N; ++c) {
            uint16_t v = 0;
            if (kind == 3) {
                /* quotients below float's normal range: +-(smallest subnormal) next to 1024 */
                v = c % 64 == 0 ? 0x4480 : (rng.below(2) ? 0x0001 : 0x8001);
            } else if (kind != 2 && rng.below(9) != 0) {
                int e = centre - 6 + rng.below(13);
                if (e < 0) e = 0;
                if (e > 254) e = 254;
                v = (uint16_t)((rng.next() & 0x807Fu) | ((unsigned)e << 7));
            } else if (rng.below(2)) {
                v = 0x8000; /* -0 */
            }
            x[(size_t)(r * N + c)] = v;
        }
    }
    const int64_t specials = (M * N) / 2000 + 2;
    for (int64_t i = 0; i < specials && M * N > 0; ++i) {
        const size_t at = (size_t)(rng.next() % (uint64_t)(M * N));
        const uint16_t pick[] = {0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x43E0, 0xC3E0, 0x7F7F, 0xFF7F, 0x0001, 0x3C00};
        x[at] = pick[rng.below(10)];
    }
    return x;
}

std::vector<uint16_t> transpose(const std::vector<uint16_t>& x, int64_t M, int64_t N) {
    std::vector<uint16_t> t((size_t)(M * N));
    for (int64_t r = 0; r < M; ++r)
        for (int64_t c = 0; c < N; ++c) t[(size_t)(c * M + r)] = x[(size_t)(r * N + c)];
    return t;
}

enum Recipe { k1x128, k128x128, kMx };
const char* name_of(Recipe r) { return r == k1x128 ? "blockwise_1x128" : r == k128x128 ? "blockwise_128x128" : "mxfp8"; }

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t scale_count(Recipe r, int64_t M, int64_t N) {
    if (r == k128x128) return cdiv(M, 128) * cdiv(N, 128);
    return M * cdiv(N, r == kMx ? 32 : 128);
}

size_t scale_size(Recipe r) { return r == kMx ? 1 : 4; }

/* The C core's quantisation of a bf16 [M, N] tensor. */
void core_quantize(Recipe r, const uint16_t* x, int64_t M, int64_t N, std::vector<uint8_t>& q,
                   std::vector<uint8_t>& s) {
    q.assign((size_t)(M * N), 0);
    s.assign((size_t)scale_count(r, M, N) * scale_size(r), 0);
    int st = MOK_OK;
    if (r == k1x128) st = mok_quantize_blockwise_1xb(x, MOK_BF16, M, N, 128, q.data(), (float*)s.data());
    if (r == k128x128) st = mok_quantize_blockwise_bxb(x, MOK_BF16, M, N, 128, q.data(), (float*)s.data());
    if (r == kMx) st = mok_quantize_mx_1xb(x, MOK_BF16, M, N, 32, q.data(), s.data());
    if (st != MOK_OK) throw std::runtime_error("core quantisation failed");
}

/* codes q and scales s of a kernel against the core's quantisation of x [M, N] (`what`: "" or
 * " transposed" in the labels). */
void expect_core_quantization(Recipe r, const std::vector<uint16_t>& x, int64_t M, int64_t N,
                              const std::vector<uint8_t>& q, const std::vector<uint8_t>& s, const std::string& label,
                              const char* what) {
    std::vector<uint8_t> wq, ws;
    core_quantize(r, x.data(), M, N, wq, ws);
    emu::expect_same(q, wq, label + what + " codes");
    emu::expect_same(s, ws, label + what + " scales");
}

/* Runs a kernel launch under the emulation; a failure (a divergent shuffle, a stuck barrier) is
 * counted and reported. */
bool launched(const char* label, unsigned grid, const std::function<void()>& kernel) {
    try {
        emu::launch(grid, mok_qtile::kThreads, kernel);
    } catch (const std::exception& e) {
        ++emu::failed();
        printf("FAIL %s: %s\n", label, e.what());
        return false;
    }
    return true;
}

/* [rows, cols] entries of `size` bytes, transposed. */
std::vector<uint8_t> transpose_bytes(const std::vector<uint8_t>& v, int64_t rows, int64_t cols, size_t size) {
    std::vector<uint8_t> t(v.size());
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) memcpy(&t[(size_t)(j * rows + i) * size], &v[(size_t)(i * cols + j) * size], size);
    return t;
}

/* Runs one kernel on x (placed `offset` elements into its buffer) and checks it against the core.
 * strip (rowcol): the experimental strip kernel with strips of 4 or 8 tiles (v43) instead; mn (rowcol,
 * per tile): scales_t written MN-major, [ceil(M / B), N], checked after transposing it back. */
/* stream > 0: the streamed 1 x 128 rowcol kernel (rowcol_stream.cuh) on a grid of at most `stream` CTAs */
void run_case(Rng& rng, Recipe r, bool rowcol, int64_t M, int64_t N, int offset, int strip = 0, bool mn = false,
              bool col_tile = false, unsigned stream = 0) {
    using namespace mok_qtile;
    const std::vector<uint16_t> x = make_input(rng, M, N);
    std::vector<uint16_t> buf(x.size() + 8);
    memcpy(buf.data() + offset, x.data(), x.size() * 2);
    const __nv_bfloat16* xp = reinterpret_cast<const __nv_bfloat16*>(buf.data() + offset);
    /* poisoned outputs: whatever the kernel does not write stays 0xA5 */
    std::vector<uint8_t> q((size_t)(M * N), 0xA5), s((size_t)scale_count(r, M, N) * scale_size(r), 0xA5);
    /* col_tile: the column-wise copy is quantize(x^T, 128x128) */
    const Recipe rt = col_tile ? k128x128 : r;
    std::vector<uint8_t> qt(rowcol ? (size_t)(M * N) : 0, 0xA5), st(rowcol ? (size_t)scale_count(rt, N, M) * scale_size(rt) : 0, 0xA5);
    tile_args a = tile_args_of(xp, M, N, q.data(), s.data(), rowcol ? qt.data() : nullptr, rowcol ? st.data() : nullptr);
    a.scales_t_mn = mn;
    a.col_tile = col_tile;
    const unsigned grid = stream ? std::min(stream, (unsigned)tile_count(M, N))
                                 : (unsigned)(strip ? strip_count(M, N, strip) : tile_count(M, N));
    char label[200];
    snprintf(label, sizeof label, "%s %s M=%lld N=%lld offset=%d vec=%d vec_t=%d strip=%d mn=%d col_tile=%d stream=%u",
             rowcol ? "rowcol" : "rows", name_of(r), (long long)M, (long long)N, offset, a.vec, a.vec_t, strip, mn,
             col_tile, stream);
    const bool ok = launched(label, grid, [&] {
        if (stream) quantize_rowcol_stream_kernel<false, 2>(a);
        else if (strip == 4 && r == kMx) quantize_rowcol_strip_bf16_kernel<32, true, 4>(a);
        else if (strip == 4) quantize_rowcol_strip_bf16_kernel<128, false, 4>(a);
        else if (strip == 8 && r == kMx) quantize_rowcol_strip_bf16_kernel<32, true, 8>(a);
        else if (strip == 8) quantize_rowcol_strip_bf16_kernel<128, false, 8>(a);
        else if (rowcol && r == kMx) quantize_rowcol_bf16_kernel<32, true>(a);
        else if (rowcol) quantize_rowcol_bf16_kernel<128, false>(a);
        else if (r == kMx) quantize_rows_bf16_kernel<32, true>(a);
        else if (r == k128x128) quantize_tile128_bf16_kernel(a);
        else quantize_rows_bf16_kernel<128, false>(a);
    });
    if (!ok) return;
    expect_core_quantization(r, x, M, N, q, s, label, "");
    if (mn) st = transpose_bytes(st, cdiv(M, r == kMx ? 32 : 128), col_tile ? cdiv(N, 128) : N, scale_size(rt));
    if (rowcol) expect_core_quantization(rt, transpose(x, M, N), N, M, qt, st, label, " transposed");
}

/* The expert weight kernel (quantize_tile128_rowcol_bf16_kernel, v66) on E experts of N x K (N a multiple of
 * 128): (q, s) against the core's 128 x 128 quantisation of the [E * N, K] rows, (qt, st) against each expert's
 * codes and scales transposed. pair: the rows of each expert from two [E, N / 2, K] halves (x_up), checked
 * against their concatenation. offset: x (and x_up) that many elements into their buffers. codes_only: no
 * transposed copy (qt and scales_t null: mok::quantize_fp8_weight). */
void run_weight_case(Rng& rng, int64_t E, int64_t N, int64_t K, int offset, bool pair, bool codes_only = false) {
    using namespace mok_qtile;
    const int64_t M = E * N;
    const std::vector<uint16_t> x = make_input(rng, M, K); /* the concatenation, when pair */
    std::vector<uint16_t> lo(x.size() + 8), hi(x.size() + 8);
    if (pair) { /* expert e's first N / 2 rows to lo, the rest to hi */
        const int64_t h = N / 2;
        for (int64_t e = 0; e < E; ++e) {
            memcpy(lo.data() + offset + e * h * K, x.data() + e * N * K, (size_t)(h * K) * 2);
            memcpy(hi.data() + offset + e * h * K, x.data() + (e * N + h) * K, (size_t)(h * K) * 2);
        }
    } else {
        memcpy(lo.data() + offset, x.data(), x.size() * 2);
    }
    std::vector<uint8_t> q((size_t)(M * K), 0xA5), s((size_t)scale_count(k128x128, M, K) * 4, 0xA5);
    std::vector<uint8_t> qt((size_t)(M * K), 0xA5), st(s.size(), 0xA5);
    tile_args a = tile_args_of(reinterpret_cast<const __nv_bfloat16*>(lo.data() + offset), M, K, q.data(), s.data(),
                               codes_only ? nullptr : qt.data(), codes_only ? nullptr : st.data());
    a.col_tile = 1;
    a.batch_rows = N;
    a.vec_t = 1; /* as the launcher: N is a multiple of 128 and the buffer aligned */
    if (pair) {
        a.x_up = reinterpret_cast<const __nv_bfloat16*>(hi.data() + offset);
        a.vec = a.vec && offset % 8 == 0;
    }
    char label[200];
    snprintf(label, sizeof label, "weight E=%lld N=%lld K=%lld offset=%d pair=%d vec=%d codes_only=%d", (long long)E,
             (long long)N, (long long)K, offset, pair, a.vec, codes_only);
    if (!launched(label, (unsigned)tile_count(M, K), [&] { quantize_tile128_rowcol_bf16_kernel(a); })) return;
    std::vector<uint8_t> wq, ws;
    core_quantize(k128x128, x.data(), M, K, wq, ws);
    emu::expect_same(q, wq, std::string(label) + " codes");
    emu::expect_same(s, ws, std::string(label) + " scales");
    if (codes_only) return; /* (qt and st stay poisoned, unread) */
    const int64_t kb = cdiv(K, 128), nb = N / 128;
    std::vector<uint8_t> wqt((size_t)(M * K)), wst(ws.size());
    for (int64_t e = 0; e < E; ++e) {
        const std::vector<uint8_t> qe(wq.begin() + e * N * K, wq.begin() + (e + 1) * N * K);
        const std::vector<uint8_t> se(ws.begin() + e * nb * kb * 4, ws.begin() + (e + 1) * nb * kb * 4);
        const std::vector<uint8_t> qet = transpose_bytes(qe, N, K, 1), set = transpose_bytes(se, nb, kb, 4);
        std::copy(qet.begin(), qet.end(), wqt.begin() + e * N * K);
        std::copy(set.begin(), set.end(), wst.begin() + e * nb * kb * 4);
    }
    emu::expect_same(qt, wqt, std::string(label) + " transposed codes");
    emu::expect_same(st, wst, std::string(label) + " transposed scales");
}

uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(mok_from_acc<__nv_bfloat16>(v)); }

/* bf16 values as bytes with every NaN as 0x7fc0: a NaN's sign and payload are not the kernels' to keep (when
 * both operands of a product are NaN, which one's payload the result carries is the compiler's choice of operand
 * order here, and the GPU's arithmetic makes the canonical NaN), so NaN matches NaN and nothing else. */
std::vector<uint8_t> bf16_bytes_nan_as_one(const std::vector<uint16_t>& v) {
    std::vector<uint8_t> b(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t x = (v[i] & 0x7fffu) > 0x7f80u ? (uint16_t)0x7fc0u : v[i];
        memcpy(&b[2 * i], &x, 2);
    }
    return b;
}

/* The rowcol kernel on gathered rows (kGather): x [T, N], row m of the result x[src[m] / K] (times
 * w[src[m]], rounded to bf16, when weighted), a zero row where src[m] is outside [0, T * K) (padding -1,
 * and entries past the end, as gather_rows on CUDA). */
/* A plan's gathered rows of x [T, N]: src [M] (sources t * K + k, -1 and entries past T * K for padding), the
 * routing weights w [T * K] (a zero, large ones that overflow to Inf, a NaN) and the rows x_rows [M, N] they
 * stand for (times w, rounded to bf16, when weighted): gather_rows(x, src, w, K). */
struct gathered {
    std::vector<int32_t> src;
    std::vector<float> w;
    std::vector<uint16_t> x_rows;
};

gathered make_gathered(Rng& rng, const std::vector<uint16_t>& x, int64_t T, int64_t K, int64_t M, int64_t N,
                       bool weighted) {
    gathered g;
    g.src.resize((size_t)M);
    g.w.resize((size_t)(T * K));
    for (size_t i = 0; i < g.w.size(); ++i)
        g.w[i] = i % 7 == 3 ? 0.f : i % 11 == 5 ? 3e38f : i % 13 == 6 ? NAN : (float)rng.below(4000) / 1000.f - 2.f;
    g.x_rows.assign((size_t)(M * N), 0);
    for (int64_t m = 0; m < M; ++m) {
        const int32_t sm = g.src[(size_t)m] = (int32_t)rng.below((int)(T * K + 3)) - 1;
        if (sm < 0 || sm >= T * K) continue;
        for (int64_t n = 0; n < N; ++n) {
            const uint16_t v = x[(size_t)(sm / K * N + n)];
            g.x_rows[(size_t)(m * N + n)] = weighted ? bf16_bits(g.w[(size_t)sm] * emu::float_of((uint32_t)v << 16)) : v;
        }
    }
    return g;
}

void run_gather_case(Rng& rng, Recipe r, int64_t T, int64_t K, int64_t M, int64_t N, int offset,
                     bool weighted = false, bool col_tile = false, int band = 0, unsigned stream = 0) {
    using namespace mok_qtile;
    const std::vector<uint16_t> x = make_input(rng, T, N);
    std::vector<uint16_t> buf(x.size() + 8);
    memcpy(buf.data() + offset, x.data(), x.size() * 2);
    const gathered g = make_gathered(rng, x, T, K, M, N, weighted);
    const std::vector<int32_t>& src = g.src;
    const std::vector<float>& w = g.w;
    const std::vector<uint16_t>& x_rows = g.x_rows;
    std::vector<uint8_t> q((size_t)(M * N), 0xA5), s((size_t)scale_count(r, M, N) * scale_size(r), 0xA5);
    const Recipe rt = col_tile ? k128x128 : r;
    std::vector<uint8_t> qt((size_t)(M * N), 0xA5), st((size_t)scale_count(rt, N, M) * scale_size(rt), 0xA5);
    tile_args a = tile_args_of(reinterpret_cast<const __nv_bfloat16*>(buf.data() + offset), M, N, q.data(), s.data(),
                               qt.data(), st.data());
    a.col_tile = col_tile;
    a.gather.src = src.data();
    a.gather.w = weighted ? w.data() : nullptr;
    a.gather.src_limit = T * K;
    a.gather.top_k = (int)K;
    if (band > 0) a.col_band = band; /* else tile_args_of's row-major walk */
    char label[200];
    snprintf(label, sizeof label,
             "rowcol gather %s T=%lld K=%lld M=%lld N=%lld offset=%d vec=%d weighted=%d col_tile=%d band=%d stream=%u",
             name_of(r), (long long)T, (long long)K, (long long)M, (long long)N, offset, a.vec, weighted, col_tile,
             band, stream);
    const bool ok = launched(label, stream ? std::min(stream, (unsigned)tile_count(M, N)) : (unsigned)tile_count(M, N), [&] {
        if (stream) quantize_rowcol_stream_kernel<true, 2>(a);
        else if (r == kMx) quantize_rowcol_bf16_kernel<32, true, true>(a);
        else quantize_rowcol_bf16_kernel<128, false, true>(a);
    });
    if (!ok) return;
    expect_core_quantization(r, x_rows, M, N, q, s, label, "");
    expect_core_quantization(rt, transpose(x_rows, M, N), N, M, qt, st, label, " transposed");
}


/* The MXFP8 quantise-dequantise kernel (quant/qdq_mxfp8.cuh, what mok_qdq_mxfp8_cuda launches) against the C
 * core's mok_qdq_mxfp8_rows / _cols: either copy or both; x placed `offset` elements into its buffer (1: the
 * element-wise loads and stores); `plan`: the column copy's segments restart at offsets (multiples of 32 with
 * empty segments, the last one may be M itself; rows outside [offsets[0], offsets[E]) are written as +0), or a
 * misaligned plan (the kernel must set the error word and write nothing); gather: the rows are gathered from x
 * [T, N] by a plan's sources (weighted or not, padding rows), the warp tiles walked in bands of `band` tile
 * columns (0: row-major). */
enum QdqPlan { kNoPlan, kPlan, kBadPlan };

void run_qdq_case(Rng& rng, bool rows, bool cols, int64_t M, int64_t N, int offset, QdqPlan plan = kNoPlan,
                  int64_t T = 0, int64_t K = 0, bool weighted = false, int band = 0) {
    using namespace mok_qdq;
    const bool gather = K > 0;
    /* the input: x [M, N], or x [T, N] and the gathered rows x_rows [M, N] it stands for */
    const std::vector<uint16_t> x = make_input(rng, gather ? T : M, N);
    std::vector<uint16_t> buf(x.size() + 8);
    memcpy(buf.data() + offset, x.data(), x.size() * 2);
    const gathered g = gather ? make_gathered(rng, x, T, K, M, N, weighted) : gathered{{}, {}, x};
    const std::vector<int32_t>& src = g.src;
    const std::vector<float>& w = g.w;
    const std::vector<uint16_t>& x_rows = g.x_rows;
    /* the plan: E segments, boundaries at multiples of 32 (some equal: empty experts), first and last inside */
    std::vector<int32_t> offsets;
    if (plan != kNoPlan) {
        const int E = 1 + rng.below(6);
        for (int e = 0; e <= E; ++e) offsets.push_back((int32_t)(32 * rng.below((int)(M / 32) + 1)));
        std::sort(offsets.begin(), offsets.end());
        if (rng.below(2)) offsets.back() = (int32_t)M; /* the last segment up to M, whatever M is */
        if (plan == kBadPlan) offsets[(size_t)rng.below(E + 1)] = (int32_t)(16 + 32 * rng.below((int)(M / 32))); /* < M */
    }
    const int64_t E = offsets.empty() ? 0 : (int64_t)offsets.size() - 1;
    std::vector<uint16_t> y_rows(rows ? (size_t)(M * N) : 0, 0xA5A5), y_cols(cols ? (size_t)(M * N) : 0, 0xA5A5);
    int32_t error_word = 0;
    params p;
    p.x = buf.data() + offset;
    p.M = M;
    p.N = N;
    p.rows = rows ? y_rows.data() : nullptr;
    p.cols = cols ? y_cols.data() : nullptr;
    p.offsets = offsets.empty() ? nullptr : offsets.data();
    p.E = E;
    p.error_flag = &error_word;
    const int64_t tiles_m = (M + kTileRows - 1) / kTileRows;
    p.tiles_n = (int)((N + kTileCols - 1) / kTileCols);
    p.tiles = (int)(tiles_m * p.tiles_n);
    p.gather.src = gather ? src.data() : nullptr;
    p.gather.w = gather && weighted ? w.data() : nullptr;
    p.gather.src_limit = gather ? T * K : 0;
    p.gather.top_k = gather ? (int)K : 1;
    p.col_band = band > 0 && band < p.tiles_n ? band : p.tiles_n;
    const bool vec = N % 8 == 0 && mok_aligned16(p.x, p.rows, p.cols); /* the launcher's choice */
    char label[200];
    snprintf(label, sizeof label, "qdq mxfp8 rows=%d cols=%d M=%lld N=%lld offset=%d vec=%d plan=%d E=%lld T=%lld K=%lld "
             "weighted=%d band=%d", rows, cols, (long long)M, (long long)N, offset, vec, (int)plan, (long long)E,
             (long long)T, (long long)K, weighted, band);
    const unsigned grid = (unsigned)((p.tiles + kWarps - 1) / kWarps);
    const bool ok = launched(label, grid, [&] {
        auto run = [&](auto rows_c, auto cols_c) {
            constexpr bool kR = decltype(rows_c)::value, kC = decltype(cols_c)::value;
            if (gather && vec) qdq_mxfp8_kernel<kR, kC, true, true>(p);
            else if (gather) qdq_mxfp8_kernel<kR, kC, false, true>(p);
            else if (vec) qdq_mxfp8_kernel<kR, kC, true, false>(p);
            else qdq_mxfp8_kernel<kR, kC, false, false>(p);
        };
        if (rows && cols) run(std::true_type{}, std::true_type{});
        else if (rows) run(std::true_type{}, std::false_type{});
        else run(std::false_type{}, std::true_type{});
    });
    if (!ok) return;
    auto bytes = [](const std::vector<uint16_t>& v) {
        return std::vector<uint8_t>((const uint8_t*)v.data(), (const uint8_t*)v.data() + v.size() * 2);
    };
    if (plan == kBadPlan && cols) { /* reported, nothing written (not the row-wise copy either) */
        emu::expect(error_word == (int32_t)MOK_DEVICE_ERR_UNALIGNED_PLAN, std::string(label) + " error word");
        std::vector<uint16_t> poison((size_t)(M * N), 0xA5A5);
        if (rows) emu::expect_same(bytes(y_rows), bytes(poison), std::string(label) + " rows untouched");
        emu::expect_same(bytes(y_cols), bytes(poison), std::string(label) + " cols untouched");
        return;
    }
    emu::expect(error_word == 0, std::string(label) + " error word");
    if (rows) {
        std::vector<uint16_t> want((size_t)(M * N));
        if (mok_qdq_mxfp8_rows(x_rows.data(), M, N, 0, M, want.data()) != MOK_OK) throw std::runtime_error("core qdq rows");
        emu::expect_same(bytes(y_rows), bytes(want), std::string(label) + " rows");
    }
    if (cols) {
        std::vector<uint16_t> want((size_t)(M * N));
        if (mok_qdq_mxfp8_cols(x_rows.data(), M, N, offsets.empty() ? nullptr : offsets.data(), E, 0, N, want.data()) !=
            MOK_OK)
            throw std::runtime_error("core qdq cols");
        emu::expect_same(bytes(y_cols), bytes(want), std::string(label) + " cols");
    }
}

/* The BF16 GEMM's on-load qdq of its A operand (quant/qdq_mxfp8_smem.cuh) against the C core's
 * mok_qdq_mxfp8_rows: a warpgroup's [64 rows][64 K] tile of random bf16 rows (make_input's edge blocks) laid
 * out K-major in the 128B swizzle, the 128 threads run one after the other (no thread reads another's
 * chunks), then read back through the swizzle. kd < 64: the K-block is the last, partial one, its columns
 * past kd zero as the loads fill them (the core sees a [64, kd] tensor, its last block partial); those
 * columns must come back 0 except in a NaN/Inf block (where the core's row is NaN in every real column
 * anyway). */
void run_qdq_smem_case(Rng& rng, int kd) {
    using namespace mok_qdq;
    const std::vector<uint16_t> x = make_input(rng, kSmemTileRows, kd);
    alignas(1024) static uint8_t tile[kSmemTileRows * kSmemRowBytes];
    auto at = [](int r, int c) { /* byte offset of element (r, c) in the swizzled tile */
        return r * kSmemRowBytes + ((((c * 2) >> 4) ^ (r & 7)) << 4) + (c * 2 & 15);
    };
    for (int r = 0; r < kSmemTileRows; ++r)
        for (int c = 0; c < 64; ++c) {
            const uint16_t v = c < kd ? x[(size_t)(r * kd + c)] : 0;
            memcpy(tile + at(r, c), &v, 2);
        }
    struct { /* 16-byte loads and stores at "shared addresses": offsets into the tile */
        uint4 load(uint32_t addr) const {
            uint4 v;
            memcpy(&v, tile + addr, 16);
            return v;
        }
        void store(uint32_t addr, const uint4& v) const { memcpy(tile + addr, &v, 16); }
    } mem;
    for (int t = 0; t < 128; ++t) qdq_rows_kmajor_sw128(mem, 0u, t);
    std::vector<uint16_t> got((size_t)(kSmemTileRows * kd)), want(got.size());
    bool tail_ok = true;
    for (int r = 0; r < kSmemTileRows; ++r)
        for (int c = 0; c < 64; ++c) {
            uint16_t v;
            memcpy(&v, tile + at(r, c), 2);
            if (c < kd) got[(size_t)(r * kd + c)] = v;
            else if (v != 0 && v != 0x7FC0) tail_ok = false;
        }
    if (mok_qdq_mxfp8_rows(x.data(), kSmemTileRows, kd, 0, kSmemTileRows, want.data()) != MOK_OK)
        throw std::runtime_error("core qdq rows");
    const std::string label = "qdq mxfp8 smem tile kd=" + std::to_string(kd);
    emu::expect_same(got, want, label);
    emu::expect(tail_ok, label + " columns past kd");
}

/* One SwiGLU + quantisation kernel (forward or backward; rows, cols, keep) on random h and d_act
 * against SwiGLU computed here with the same functions, then the C core's quantisations. */
/* mn / col_tile (v52, the one-node FP8 layer's column copies): scales_t MN-major, the column-wise copy in
 * 128 x 128 tiles, checked as run_case checks them. */
/* scaled (v53, the row-scaled form z = s * act): row scales with zeros, a negative and a large one; the
 * forward's column-wise copy is z = bf16(s * act)'s, the backward's d_act is s * d_z, and the d_gate tiles'
 * partial sums of d_z . act are checked bit for bit against the kernel's order (each piece of 8 columns in
 * increasing j, then the butterfly over the 16 pieces: at each step a piece adds its partner's sum to its
 * own), NaN against NaN. */
/* One SwiGLU kernel: stream 0 the per-tile kernel (one CTA per tile); for the forward 1 and 2 the streamed
 * one with its loads that many items ahead (on a grid of `grid` CTAs); for the backward (plain or row-scaled)
 * 3, 4, 5 and 6 the one streamed per output tile (swiglu_backward_split_stream_kernel, the library's since
 * v55, row-scaled v56) with its ring 6, 8, 3 and 4 (the library's) rows deep. */
template <bool kBackward, bool kRows, bool kCols, bool kScaled>
void swiglu_kernel(int stream, const mok_qtile::tile_args& a, const mok_qtile::swiglu_tile_args& sw) {
    using namespace mok_qtile;
    if (stream == 0) {
        swiglu_quantize_bf16_kernel<kBackward, kRows, kCols, 2, kScaled>(a, sw);
    } else if constexpr (!kBackward) {
        if (stream == 1) swiglu_quantize_stream_kernel<kRows, kCols, kScaled, 1, 2>(a, sw);
        else if (stream == 2) swiglu_quantize_stream_kernel<kRows, kCols, kScaled, 2, 1>(a, sw);
        else abort(); /* streams 3-5: the backward's */
    } else {
        if (stream == 3) swiglu_backward_split_stream_kernel<kRows, kCols, 2, 6, kScaled>(a, sw);
        else if (stream == 4) swiglu_backward_split_stream_kernel<kRows, kCols, 1, 8, kScaled>(a, sw);
        else if (stream == 5) swiglu_backward_split_stream_kernel<kRows, kCols, 2, 3, kScaled>(a, sw);
        else if (stream == 6) swiglu_backward_split_stream_kernel<kRows, kCols, 2, 4, kScaled>(a, sw);
        else abort(); /* streams 1-2: the forward's */
    }
}

void run_swiglu_case(Rng& rng, bool backward, bool rows, bool cols, bool keep, int64_t R, int64_t I, bool mn = false,
                     bool col_tile = false, bool scaled = false, int stream = 0, unsigned grid = 0) {
    using namespace mok_qtile;
    const int64_t N = backward ? 2 * I : I;
    std::vector<uint16_t> h = make_input(rng, R, 2 * I), da = make_input(rng, R, I);
    std::vector<float> sc((size_t)R + 4); /* + 4: a 16-byte load never reads past the vector */
    for (int64_t r = 0; r < R; ++r) {
        const int kind = rng.below(12);
        sc[(size_t)r] = kind == 0 ? 0.f : kind == 1 ? -0.75f : kind == 2 ? 300.f : (float)(rng.below(1 << 20)) / (1 << 20);
    }
    /* the reference: y = SwiGLU(h) or its gradient, rounded to bf16; z (scaled forward); the partial sums */
    std::vector<uint16_t> y((size_t)(R * N)), z(scaled && !backward ? (size_t)(R * N) : 0);
    std::vector<float> part_want(scaled && backward ? (size_t)(R * (I / 128)) : 0);
    for (int64_t r = 0; r < R; ++r) {
        float piece[16] = {0};
        for (int64_t j = 0; j < I; ++j) {
            const float g = emu::float_of((uint32_t)h[(size_t)(r * 2 * I + j)] << 16);
            const float u = emu::float_of((uint32_t)h[(size_t)(r * 2 * I + I + j)] << 16);
            if (!backward) {
                y[(size_t)(r * I + j)] = bf16_bits(mok_swiglu(g, u));
                if (scaled) z[(size_t)(r * I + j)] = bf16_bits(sc[(size_t)r] * emu::float_of((uint32_t)y[(size_t)(r * I + j)] << 16));
                continue;
            }
            const float dz = emu::float_of((uint32_t)da[(size_t)(r * I + j)] << 16);
            float d_gate, d_up;
            mok_swiglu_grad(g, u, scaled ? sc[(size_t)r] * dz : dz, d_gate, d_up);
            y[(size_t)(r * N + j)] = bf16_bits(d_gate);
            y[(size_t)(r * N + I + j)] = bf16_bits(d_up);
            if (!scaled) continue;
            const float act = emu::float_of((uint32_t)bf16_bits(mok_swiglu(g, u)) << 16);
            piece[(j % 128) / 8] = piece[(j % 128) / 8] + dz * act;
            if (j % 128 == 127) {
                for (int off = 1; off < 16; off *= 2) {
                    float next[16];
                    for (int p = 0; p < 16; ++p) next[p] = piece[p] + piece[p ^ off];
                    for (int p = 0; p < 16; ++p) piece[p] = next[p];
                }
                part_want[(size_t)((j / 128) * R + r)] = piece[0];
                for (float& v : piece) v = 0.f;
            }
        }
    }
    std::vector<uint8_t> q(rows ? (size_t)(R * N) : 0, 0xA5), s(rows ? (size_t)(R * (N / 128)) * 4 : 0, 0xA5);
    const Recipe rt = col_tile ? k128x128 : k1x128;
    std::vector<uint8_t> qt(cols ? (size_t)(R * N) : 0, 0xA5);
    std::vector<uint8_t> st(cols ? (size_t)scale_count(rt, N, R) * 4 : 0, 0xA5);
    std::vector<uint16_t> out(keep ? (size_t)(R * N) : 0, 0xA5A5);
    tile_args a = tile_args_of(nullptr, R, N, rows ? q.data() : nullptr, rows ? s.data() : nullptr,
                               cols ? qt.data() : nullptr, cols ? st.data() : nullptr);
    a.scales_t_mn = mn;
    a.col_tile = col_tile;
    swiglu_tile_args sw;
    sw.h = reinterpret_cast<const __nv_bfloat16*>(h.data());
    sw.d_act = backward ? reinterpret_cast<const __nv_bfloat16*>(da.data()) : nullptr;
    sw.out = keep ? reinterpret_cast<__nv_bfloat16*>(out.data()) : nullptr;
    sw.I = I;
    std::vector<float> part(scaled && backward ? (size_t)(R * (I / 128)) : 0, -12345.f);
    sw.row_scale = scaled ? sc.data() : nullptr;
    sw.d_s_part = scaled && backward ? part.data() : nullptr;
    sw.R = R;
    char label[200];
    snprintf(label, sizeof label,
             "swiglu %s rows=%d cols=%d keep=%d R=%lld I=%lld mn=%d col_tile=%d scaled=%d stream=%d grid=%u",
             backward ? "backward" : "forward", rows, cols, keep, (long long)R, (long long)I, mn, col_tile, scaled, stream,
             grid);
    const unsigned items = (unsigned)tile_count(R, stream >= 3 ? N : I); /* the streamed kernel's work items */
    const unsigned launch_grid = stream == 0 ? (unsigned)tile_count(R, N) : std::min(grid, items);
    const bool ok = launched(label, launch_grid, [&] {
        if (scaled && backward && rows && cols) swiglu_kernel<true, true, true, true>(stream, a, sw);
        else if (scaled && backward && rows) swiglu_kernel<true, true, false, true>(stream, a, sw);
        else if (scaled && backward) swiglu_kernel<true, false, true, true>(stream, a, sw);
        else if (scaled && rows) swiglu_kernel<false, true, true, true>(stream, a, sw);
        else if (scaled) swiglu_kernel<false, false, true, true>(stream, a, sw);
        else if (backward && rows && cols) swiglu_kernel<true, true, true, false>(stream, a, sw);
        else if (backward && rows) swiglu_kernel<true, true, false, false>(stream, a, sw);
        else if (backward) swiglu_kernel<true, false, true, false>(stream, a, sw);
        else if (rows && cols) swiglu_kernel<false, true, true, false>(stream, a, sw);
        else if (rows) swiglu_kernel<false, true, false, false>(stream, a, sw);
        else swiglu_kernel<false, false, true, false>(stream, a, sw);
    });
    if (!ok) return;
    if (keep) emu::expect_same(bf16_bytes_nan_as_one(out), bf16_bytes_nan_as_one(y), std::string(label) + " bf16 result");
    if (rows) expect_core_quantization(k1x128, y, R, N, q, s, label, "");
    if (cols && mn) st = transpose_bytes(st, cdiv(R, 128), col_tile ? cdiv(N, 128) : N, 4);
    const std::vector<uint16_t>& col_src = scaled && !backward ? z : y;
    if (cols) expect_core_quantization(rt, transpose(col_src, R, N), N, R, qt, st, label, " transposed");
    if (scaled && backward) {
        /* bitwise, NaN against NaN (any payload) */
        std::vector<uint8_t> got(part.size() * 4), want(part.size() * 4);
        for (size_t i = 0; i < part.size(); ++i) {
            const bool both_nan = part[i] != part[i] && part_want[i] != part_want[i];
            const float g = both_nan ? 0.f : part[i], w = both_nan ? 0.f : part_want[i];
            memcpy(&got[4 * i], &g, 4);
            memcpy(&want[4 * i], &w, 4);
        }
        emu::expect_same(got, want, std::string(label) + " d_s partial sums");
    }
}

}  // namespace

int main(int argc, char** argv) {
    Rng rng{argc > 1 ? strtoull(argv[1], nullptr, 10) : 1};
    /* ragged and aligned shapes; 1 x 8 and 0 rows; a few random ones */
    std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},    {1, 8},    {0, 64},   {3, 130},  {128, 128},
                                                       {129, 256}, {200, 77}, {130, 264}, {256, 136}, {64, 2048},
                                                       {16, 400}};
    for (int i = 0; i < 4; ++i) shapes.push_back({1 + rng.below(300), 1 + rng.below(300)});
    for (int i = 0; i < 2; ++i) shapes.push_back({8 * (1 + rng.below(40)), 8 * (1 + rng.below(40))});
    for (const auto& sh : shapes) {
        for (Recipe r : {k1x128, k128x128, kMx}) {
            run_case(rng, r, false, sh.first, sh.second, 0);
            if (r != k128x128) run_case(rng, r, true, sh.first, sh.second, 0);
        }
    }
    /* the experimental strip kernel (v43): strips of 4 and 8 tiles down M, ragged last strips and
     * edges, a misaligned x */
    for (const auto& sh : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {130, 264}, {1100, 136}, {520, 77}, {1025, 392}})
        for (Recipe r : {k1x128, kMx})
            for (int strip : {4, 8}) run_case(rng, r, true, sh.first, sh.second, 0, strip);
    run_case(rng, k1x128, true, 600, 96, 1, 8);
    /* column-wise scales MN-major (the FP8 weight gradient's operand layout): ragged edges, misaligned x */
    for (const auto& sh : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {130, 264}, {300, 77}, {256, 136}})
        for (Recipe r : {k1x128, kMx}) run_case(rng, r, true, sh.first, sh.second, 0, 0, true);
    run_case(rng, k1x128, true, 136, 96, 1, 0, true);
    /* the column-wise copy in 128 x 128 tiles (v50), scales both layouts: ragged edges, one row, misaligned x */
    for (const auto& sh : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {130, 264}, {300, 77}, {256, 136}, {129, 256}})
        for (bool mn : {false, true}) run_case(rng, k1x128, true, sh.first, sh.second, 0, 0, mn, true);
    run_case(rng, k1x128, true, 136, 96, 1, 0, true, true);
    run_gather_case(rng, k1x128, 37, 8, 300, 264, 0, false, true);
    run_gather_case(rng, k1x128, 50, 4, 260, 136, 1, true, true);
    /* gathered rows (the layer's x_rows, v45): K = 1 and 8, ragged M and N, one row, a misaligned x */
    for (Recipe r : {k1x128, kMx}) {
        run_gather_case(rng, r, 1, 1, 1, 8, 0);
        run_gather_case(rng, r, 37, 8, 300, 264, 0);
        run_gather_case(rng, r, 90, 2, 130, 77, 0);
        run_gather_case(rng, r, 50, 4, 260, 136, 1);
        run_gather_case(rng, r, 37, 8, 300, 264, 0, true);
        run_gather_case(rng, r, 50, 4, 260, 136, 1, true);
        /* the tiles walked in bands of tile columns (v51): one band, full bands, a narrower last band
         * (N = 264: 3 tile columns), a band wider than the grid */
        for (int band : {1, 2, 3, 8}) {
            run_gather_case(rng, r, 37, 8, 300, 264, 0, false, false, band);
            run_gather_case(rng, r, 50, 4, 260, 136, 1, true, false, band);
        }
        run_gather_case(rng, r, 1, 1, 1, 8, 0, false, false, 2);
    }
    run_gather_case(rng, k1x128, 37, 8, 300, 264, 0, true, true, 2);
    /* expert weights with both copies (v66): one and several experts of one and several tile rows, K ragged,
     * below one piece and not a multiple of 8; the (gate, up) pair; misaligned halves (element-wise loads) */
    for (const auto& sh : std::vector<std::array<int64_t, 3>>{{1, 128, 128}, {3, 256, 200}, {2, 128, 8}, {2, 384, 77},
                                                              {1, 256, 264}})
        for (bool pair : {false, true})
            if (!pair || sh[1] % 256 == 0) run_weight_case(rng, sh[0], sh[1], sh[2], 0, pair);
    run_weight_case(rng, 2, 256, 136, 1, false);
    run_weight_case(rng, 2, 256, 136, 3, true);
    run_weight_case(rng, 3, 256, 200, 0, true, true);
    run_weight_case(rng, 2, 128, 77, 1, false, true);
    /* unaligned x (element-wise loads) */
    run_case(rng, k1x128, false, 40, 256, 1);
    run_case(rng, kMx, true, 40, 256, 3);
    run_case(rng, k1x128, true, 136, 96, 1);
    run_case(rng, k128x128, false, 136, 96, 1);
    /* SwiGLU + quantisation: ragged R (the tile's rows past R), one and several 128-column blocks */
    const bool flags[][3] = {{true, true, false}, {true, false, true}, {false, true, true}, {true, true, true}};
    for (int64_t R : {(int64_t)1, (int64_t)16, (int64_t)130, 1 + rng.below(300)})
        for (int64_t I : {128, 256})
            for (bool backward : {false, true})
                for (const auto& f : flags) run_swiglu_case(rng, backward, f[0], f[1], f[2], R, I);
    /* the column copies as the one node asks for them: MN-major scales, 128 x 128 tiles, both */
    for (int64_t R : {1, 130, 256})
        for (int64_t I : {128, 384})
            for (bool backward : {false, true})
                for (const auto& mt : std::vector<std::pair<bool, bool>>{{true, false}, {false, true}, {true, true}})
                    run_swiglu_case(rng, backward, true, true, false, R, I, mt.first, mt.second);
    /* the row-scaled form (v53): forward with both copies or the column-wise one (the row-wise alone is the
     * plain kernel), backward every combination; ragged R, one and several column tiles, the one node's
     * layouts */
    for (int64_t R : {(int64_t)1, (int64_t)16, (int64_t)130, 1 + rng.below(300)})
        for (int64_t I : {128, 384}) {
            run_swiglu_case(rng, false, true, true, false, R, I, true, false, true);
            run_swiglu_case(rng, false, false, true, true, R, I, false, true, true);
            run_swiglu_case(rng, false, true, true, false, R, I, true, true, true);
            for (const auto& f : flags) run_swiglu_case(rng, true, f[0], f[1], f[2], R, I, true, R % 2 == 0, true);
        }
    /* the streamed rowcol kernel (EXPERIMENTAL, after v54), 1 x 128 with aligned rows: grids of 1-3 CTAs (several
     * tiles each), ragged M and N (rows and columns past the edge zero-filled), the one node's column layouts;
     * gathered rows with K = 1 and 8, padding, weights, column bands */
    for (unsigned grid : {1u, 2u, 3u}) {
        for (const auto& sh : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {130, 264}, {300, 128}, {256, 136}})
            run_case(rng, k1x128, true, sh.first, sh.second, 0, 0, false, false, grid);
        run_case(rng, k1x128, true, 200, 384, 0, 0, true, true, grid);
        run_case(rng, k1x128, true, 129, 256, 0, 0, true, false, grid);
        run_gather_case(rng, k1x128, 1, 1, 1, 8, 0, false, false, 0, grid);
        run_gather_case(rng, k1x128, 37, 8, 300, 264, 0, false, false, 0, grid);
        run_gather_case(rng, k1x128, 90, 2, 130, 136, 0, true, false, 0, grid);
        run_gather_case(rng, k1x128, 50, 4, 260, 384, 0, true, true, 2, grid);
        run_gather_case(rng, k1x128, 37, 8, 300, 264, 0, true, false, 1, grid);
    }
    /* the streamed forward (v54): loads one and two items ahead, grids of 1, 2 and 3 CTAs (several items
     * per CTA, a last CTA with fewer), ragged R (rows past R zero-filled), one and several column tiles,
     * every copy combination, the one node's layouts, the row-scaled form */
    for (int stream : {1, 2})
        for (unsigned grid : {1u, 2u, 3u})
            for (int64_t R : {(int64_t)1, (int64_t)130, 1 + rng.below(300)})
                for (int64_t I : {128, 384}) {
                    for (const auto& f : flags)
                        run_swiglu_case(rng, false, f[0], f[1], f[2], R, I, false, false, false, stream, grid);
                    run_swiglu_case(rng, false, true, true, false, R, I, true, true, false, stream, grid);
                    run_swiglu_case(rng, false, true, true, R % 2 == 0, R, I, true, R % 2 == 0, true, stream, grid);
                    run_swiglu_case(rng, false, false, true, true, R, I, false, true, true, stream, grid);
                }
    /* the backward streamed per output tile (v55), rings of 6, 8, 3 and 4 rows: grids of 1-5 CTAs (d_gate and
     * d_up items mixed in one CTA), ragged R, every copy combination, the one node's layouts; its row-scaled
     * form (v56: the row scales through the ring, the d_gate items' partial sums) */
    for (int stream : {3, 4, 5, 6})
        for (unsigned grid : {1u, 2u, 3u, 5u})
            for (int64_t R : {(int64_t)1, (int64_t)130, 1 + rng.below(300)})
                for (int64_t I : {128, 384}) {
                    for (const auto& f : flags)
                        run_swiglu_case(rng, true, f[0], f[1], f[2], R, I, false, false, false, stream, grid);
                    run_swiglu_case(rng, true, true, true, false, R, I, true, true, false, stream, grid);
                    run_swiglu_case(rng, true, true, true, R % 2 == 0, R, I, true, R % 2 == 0, true, stream, grid);
                    run_swiglu_case(rng, true, stream % 2 == 0, true, stream % 2 != 0, R, I, false, false, true, stream,
                                    grid);
                }
    /* MXFP8 quantise-dequantise (qdq_mxfp8.cuh): every copy combination on ragged shapes (rows and columns past
     * the tile edges, one row, a row of 8, N not a multiple of 8), vector and element-wise paths; the column
     * copy with plans (segments restarting at multiples of 32, empty ones, the last at M) and a misaligned plan;
     * gathered rows (weighted, padding, K = 1 and 8) walked row-major and in bands of 1-3 tile columns */
    for (const auto& sh : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {1, 1}, {32, 64}, {33, 72}, {130, 264},
                                                                  {100, 77}, {64, 136}, {1 + rng.below(200), 8 * (1 + rng.below(40))}})
        for (int offset : {0, 1}) {
            run_qdq_case(rng, true, false, sh.first, sh.second, offset);
            run_qdq_case(rng, false, true, sh.first, sh.second, offset);
            run_qdq_case(rng, true, true, sh.first, sh.second, offset);
            run_qdq_case(rng, false, true, sh.first, sh.second, offset, kPlan);
            run_qdq_case(rng, true, true, sh.first, sh.second, offset, kPlan);
        }
    /* the GEMM's on-load qdq of A (qdq_mxfp8_smem.cuh): whole K-blocks, and last K-blocks of 8-56 columns */
    for (int i = 0; i < 24; ++i) run_qdq_smem_case(rng, 64);
    for (int kd : {8, 24, 32, 40, 56}) run_qdq_smem_case(rng, kd);
    for (int64_t M : {40, 130, 256}) {
        run_qdq_case(rng, false, true, M, 136, 0, kBadPlan);
        run_qdq_case(rng, true, true, M, 72, 1, kBadPlan);
    }
    for (int band : {0, 1, 2, 3}) {
        run_qdq_case(rng, true, true, 1, 8, 0, kNoPlan, 1, 1, false, band);
        run_qdq_case(rng, true, true, 300, 264, 0, kNoPlan, 37, 8, false, band);
        run_qdq_case(rng, true, true, 130, 200, 0, kPlan, 90, 2, true, band);
        run_qdq_case(rng, false, true, 256, 136, 1, kPlan, 50, 4, true, band);
        run_qdq_case(rng, true, false, 96, 77, 0, kNoPlan, 20, 8, true, band);
    }
    return emu::finish();
}
