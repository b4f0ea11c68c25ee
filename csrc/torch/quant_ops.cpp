// FP8 quantisation ops: the numerics of mok's FP8 recipes, on the C core (CPU) and on the CUDA
// kernels of csrc/cuda/quantize_fp8.cu, bit-exact with each other. Recipes: "blockwise_1x128"
// (activations), "blockwise_128x128" (weights), both E4M3 with fp32 scales (DeepSeek-V3), and
// "mxfp8" (E4M3, 1x32 blocks, E8M0 scales, RCEIL). Each quantises along the last dimension (the
// GEMM's K); a column-wise copy is the quantisation of the transposed tensor.
// quantize_fp8_rowcol returns both copies: backward needs the column-wise one quantised from the
// bf16 values (DESIGN.md), and on the GPU one kernel makes both from a single read of x. With
// scales_t_mn_major the column-wise copy's scales come transposed, [ceil(M / B), N], the layout the FP8
// weight-gradient GEMM reads (the kernel writes them so: no transpose pass). col_recipe (default: recipe)
// "blockwise_128x128" with recipe "blockwise_1x128" quantises the column-wise copy in 128 x 128 tiles
// instead ((qt, scales_t) = quantize_fp8(x^T, "blockwise_128x128"), the same kernel and pass): the FP8
// weight gradient's cheaper operand for activations (mok.fp8_gemm.grouped_mm_wgrad_blockwise).
//
// qdq_mxfp8 is the MXFP8 quantise-dequantise of bf16 tensors (recipe="mxfp8" of the layers on
// Hopper: mok/_mxfp8_experts.py): bf16 copies holding the values of the MXFP8 encoding, row-wise
// and/or column-wise with expert segments (mok_qdq_mxfp8_rows / _cols in csrc/core/mok_core.h;
// CUDA: csrc/cuda/qdq_mxfp8.cu, which needs 32-aligned offsets and reports others through the
// device error word, as the FP8 GEMM does); qdq_mxfp8_gather, the same of the plan's gathered rows of x.
//
// transpose_fp8_codes(q [B, R, C]) -> [B, C, R]: each matrix of 1-byte codes transposed (the FP8 dgrad's
// W^T codes per expert). CUDA: csrc/cuda/transpose_bytes.cu (R and C multiples of 16, at the copy's speed);
// otherwise, and on the CPU, torch's strided copy.
//
// quantize_fp8_weight_rowcol(w [E, N, K]) -> (q, scales, qt, scales_t): an expert weight's 128 x 128 blockwise
// codes for the forward, (q, scales) = quantize_fp8(w as [E * N, K], "blockwise_128x128") as [E, N, K] and
// [E, N / 128, ceil(K / 128)], and those of each expert's W^T for the FP8 dgrad, qt [E, K, N] = q^T and
// scales_t [E, ceil(K / 128), N / 128] = scales^T per expert (a tile has one scale both ways). CUDA bf16: one
// kernel reads w once and writes both (csrc/cuda/quant/quantize_bf16_tile.cuh); otherwise the quantisation,
// then the transposes (the definition). With up (torchtitan's (w1, w3) pair: w the gate [E, I, K], up the same
// shape), the copies of cat([w, up], 1) [E, 2I, K], which the kernel never makes. quantize_fp8_weight(w[, up]):
// (q, scales) alone, the same kernel without the transposed copy (the pair's forward codes).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <string>

#ifdef MOK_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda/mok_cuda.h"
#include "backend.h"
#endif

#include "checks.h"

namespace mok {
namespace {

// Values match mok_fp8_recipe (csrc/cuda/mok_cuda.h).
enum class Recipe { kBlock1x128 = 0, kBlock128x128 = 1, kMx = 2 };

Recipe parse_recipe(const std::string& r, const char* op) {
    if (r == "blockwise_1x128") return Recipe::kBlock1x128;
    if (r == "blockwise_128x128") return Recipe::kBlock128x128;
    if (r == "mxfp8") return Recipe::kMx;
    TORCH_CHECK_VALUE(false, op, ": recipe must be 'blockwise_1x128', 'blockwise_128x128' or 'mxfp8', got '", r, "'");
}

int64_t block_of(Recipe r) { return r == Recipe::kMx ? 32 : 128; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<int64_t> scale_shape(Recipe r, int64_t M, int64_t N) {
    const int64_t B = block_of(r);
    if (r == Recipe::kBlock128x128) return {ceil_div(M, B), ceil_div(N, B)};
    return {M, ceil_div(N, B)};
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8(const at::Tensor& x, c10::string_view recipe_name) {
    const char* op = "mok.quantize_fp8";
    const Recipe r = parse_recipe(std::string(recipe_name), op);
    check_dim(x, 2, op, "x", "[M, N]");
    check_contiguous(x, op, "x");
    const mok_dtype dt = to_mok_dtype(x, op, "x");
    const int64_t M = x.size(0), N = x.size(1), B = block_of(r);
    auto q = at::empty({M, N}, x.options().dtype(at::kFloat8_e4m3fn));
    auto scales = at::empty(scale_shape(r, M, N), x.options().dtype(r == Recipe::kMx ? at::kByte : at::kFloat));
    if (x.numel() == 0) return {q, scales};
    auto* qp = static_cast<uint8_t*>(q.data_ptr());
    int st = MOK_OK;
#ifdef MOK_WITH_CUDA
    if (x.is_cuda()) {
        c10::cuda::CUDAGuard guard(x.device());
        mok_quantize_fp8_args a{};
        a.x = x.data_ptr();
        a.dtype = dt;
        a.M = M;
        a.N = N;
        a.recipe = static_cast<int>(r);
        a.q = qp;
        a.scales = scales.data_ptr();
        check_status(mok_quantize_fp8_cuda(&a, at::cuda::getCurrentCUDAStream(x.device().index()).stream()), op);
        return {q, scales};
    }
#endif
    switch (r) {
        case Recipe::kBlock1x128:
            st = mok_quantize_blockwise_1xb(x.data_ptr(), dt, M, N, B, qp, scales.data_ptr<float>());
            break;
        case Recipe::kBlock128x128:
            st = mok_quantize_blockwise_bxb(x.data_ptr(), dt, M, N, B, qp, scales.data_ptr<float>());
            break;
        case Recipe::kMx:
            st = mok_quantize_mx_1xb(x.data_ptr(), dt, M, N, B, qp, scales.data_ptr<uint8_t>());
            break;
    }
    check_status(st, op);
    return {q, scales};
}

using RowColTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Shape of a rowcol result's scales_t for x [M, N]: those of quantize(x^T), [N, ceil(M / B)], or with
// mn_major their transpose [ceil(M / B), N] (the layout mok::grouped_mm_fp8_wgrad reads).
std::vector<int64_t> scales_t_shape(Recipe r, int64_t M, int64_t N, bool mn_major) {
    auto shape = scale_shape(r, N, M); // (128x128: [ceil(N / 128), ceil(M / 128)])
    if (mn_major) std::swap(shape[0], shape[1]);
    return shape;
}

// The CPU composition's scales_t in the asked layout.
RowColTensors with_scales_t_layout(RowColTensors t, bool mn_major) {
    // (a fresh tensor: .contiguous() would keep a [k, 1] transpose's stride of k in its last dimension)
    if (mn_major) {
        const at::Tensor st = std::get<3>(t).t();
        std::get<3>(t) = at::empty(st.sizes(), st.options()).copy_(st);
    }
    return t;
}

#ifdef MOK_WITH_CUDA
// The CUDA rowcol kernel on a bf16 x: the copies of x itself (src_of_row null), or of its rows gathered
// by the plan (gather_rows(x, *src_of_row, w, top_k), never written).
RowColTensors rowcol_cuda(const at::Tensor& x, Recipe r, Recipe col, const char* op, bool mn_major,
                          const at::Tensor* src_of_row = nullptr, const c10::optional<at::Tensor>& w = c10::nullopt,
                          int64_t top_k = 1) {
    const int64_t M = src_of_row ? src_of_row->size(0) : x.size(0), N = x.size(1);
    const auto sdt = x.options().dtype(r == Recipe::kMx ? at::kByte : at::kFloat);
    auto q = at::empty({M, N}, x.options().dtype(at::kFloat8_e4m3fn));
    auto qt = at::empty({N, M}, x.options().dtype(at::kFloat8_e4m3fn));
    auto scales = at::empty(scale_shape(r, M, N), sdt);
    auto scales_t = at::empty(scales_t_shape(col, M, N, mn_major), sdt);
    if (M == 0 || N == 0) return {q, scales, qt, scales_t};
    c10::cuda::CUDAGuard guard(x.device());
    mok_quantize_fp8_rowcol_args a{};
    a.x = x.data_ptr();
    a.dtype = MOK_BF16;
    a.M = M;
    a.N = N;
    a.recipe = static_cast<int>(r);
    a.q = static_cast<uint8_t*>(q.data_ptr());
    a.scales = scales.data_ptr();
    a.qt = static_cast<uint8_t*>(qt.data_ptr());
    a.scales_t = scales_t.data_ptr();
    a.scales_t_mn_major = mn_major;
    a.col_tile = col == Recipe::kBlock128x128;
    if (src_of_row) {
        a.src_of_row = src_of_row->data_ptr<int32_t>();
        a.w = w.has_value() ? w->data_ptr<float>() : nullptr;
        a.T = x.size(0);
        a.K = top_k;
    }
    check_status(mok_quantize_fp8_rowcol_cuda(&a, at::cuda::getCurrentCUDAStream(x.device().index()).stream()), op);
    return {q, scales, qt, scales_t};
}
#endif

// (q, scales) = quantize_fp8(x), (qt, scales_t) = quantize_fp8(x^T contiguous). CUDA bf16: the fused
// kernel; other dtypes and the CPU: the two quantisations (the C core is the definition).
// The column-wise copy's recipe: recipe itself, or (blockwise_1x128 only) blockwise_128x128.
Recipe col_recipe_of(Recipe r, const c10::optional<c10::string_view>& col_recipe, const char* op) {
    if (!col_recipe.has_value()) return r;
    const std::string col_name(*col_recipe);
    const bool known = col_name == "blockwise_1x128" || col_name == "blockwise_128x128" || col_name == "mxfp8";
    const Recipe col = known ? parse_recipe(col_name, op) : r;
    TORCH_CHECK_VALUE(known && (col == r || (r == Recipe::kBlock1x128 && col == Recipe::kBlock128x128)), op,
                      ": col_recipe must be the recipe or, with recipe='blockwise_1x128', 'blockwise_128x128', got '",
                      col_name, "'");
    return col;
}

const char* name_of(Recipe r) {
    return r == Recipe::kBlock1x128 ? "blockwise_1x128" : r == Recipe::kBlock128x128 ? "blockwise_128x128" : "mxfp8";
}

RowColTensors quantize_fp8_rowcol(const at::Tensor& x, c10::string_view recipe_name, bool scales_t_mn_major,
                                  const c10::optional<c10::string_view>& col_recipe) {
    const char* op = "mok.quantize_fp8_rowcol";
    const std::string name(recipe_name);
    const Recipe r = parse_recipe(name, op);
    TORCH_CHECK_VALUE(r != Recipe::kBlock128x128, op, ": recipe must be 'blockwise_1x128' or 'mxfp8', got '", name,
                      "' (a 128x128 tile has the same scale both ways: its column-wise copy is q.t())");
    const Recipe col = col_recipe_of(r, col_recipe, op);
    check_dim(x, 2, op, "x", "[M, N]");
    check_contiguous(x, op, "x");
    const mok_dtype dt = to_mok_dtype(x, op, "x");
#ifdef MOK_WITH_CUDA
    if (x.is_cuda() && dt == MOK_BF16) return rowcol_cuda(x, r, col, op, scales_t_mn_major);
#endif
    auto [q, scales] = quantize_fp8(x, recipe_name);
    auto [qt, scales_t] = quantize_fp8(x.t().contiguous(), name_of(col));
    return with_scales_t_layout({q, scales, qt, scales_t}, scales_t_mn_major);
}

// quantize_fp8_rowcol(gather_rows(x, src_of_row, w, top_k)): the FP8 copies of the layer's gathered
// rows without the bf16 gathered tensor (x_rows in the forward; d_rows, weighted, in the backward). CUDA
// bf16: one kernel reads each gathered row of x once (the gathered tensor is never written: 4 bytes moved
// per element of it against up to 8 for the gather then the rowcol pass); otherwise the two ops (the
// definition).
RowColTensors quantize_fp8_rowcol_gather(const at::Tensor& x, const at::Tensor& src_of_row,
                                         const c10::optional<at::Tensor>& w, int64_t top_k,
                                         c10::string_view recipe_name, bool scales_t_mn_major,
                                         const c10::optional<c10::string_view>& col_recipe) {
    const char* op = "mok.quantize_fp8_rowcol_gather";
    const std::string name(recipe_name);
    const Recipe r = parse_recipe(name, op);
    TORCH_CHECK_VALUE(r != Recipe::kBlock128x128, op, ": recipe must be 'blockwise_1x128' or 'mxfp8', got '", name, "'");
    const Recipe col = col_recipe_of(r, col_recipe, op);
    check_dim(x, 2, op, "x", "[T, N]");
    check_contiguous(x, op, "x");
    const mok_dtype dt = to_mok_dtype(x, op, "x");
    check_dim(src_of_row, 1, op, "src_of_row", "[rows]");
    check_index(src_of_row, x, op, "src_of_row");
    TORCH_CHECK_VALUE(top_k >= 1, op, ": top_k must be >= 1, got ", top_k);
    check_weights(w, x, x.size(0), top_k, op);
#ifdef MOK_WITH_CUDA
    if (x.is_cuda() && dt == MOK_BF16) return rowcol_cuda(x, r, col, op, scales_t_mn_major, &src_of_row, w, top_k);
#endif
    static auto gather = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mok::gather_rows", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                                               int64_t, const c10::optional<at::Tensor>&)>();
    return quantize_fp8_rowcol(gather.call(x, src_of_row, w, top_k, c10::nullopt), recipe_name, scales_t_mn_major,
                               col_recipe);
}

at::Tensor dequantize_fp8(const at::Tensor& q, const at::Tensor& scales, c10::string_view recipe_name) {
    const char* op = "mok.dequantize_fp8";
    const Recipe r = parse_recipe(std::string(recipe_name), op);
    check_dim(q, 2, op, "q", "[M, N]");
    check_dtype(q, at::kFloat8_e4m3fn, op, "q");
    check_contiguous(q, op, "q");
    check_contiguous(scales, op, "scales");
    check_dtype(scales, r == Recipe::kMx ? at::kByte : at::kFloat, op, "scales");
    const int64_t M = q.size(0), N = q.size(1), B = block_of(r);
    const auto want = scale_shape(r, M, N);
    TORCH_CHECK_VALUE(scales.sizes() == at::IntArrayRef(want), op, ": scales must have shape ", at::IntArrayRef(want),
                      " for q of shape ", shape_str(q), " and recipe '", std::string(recipe_name), "', got ",
                      shape_str(scales));
    auto y = at::empty({M, N}, q.options().dtype(at::kFloat));
    if (q.numel() == 0) return y;
    const auto* qp = static_cast<const uint8_t*>(q.data_ptr());
    int st = MOK_OK;
#ifdef MOK_WITH_CUDA
    if (q.is_cuda()) {
        check_same_device(scales, q, op, "scales", "q");
        c10::cuda::CUDAGuard guard(q.device());
        mok_dequantize_fp8_args a{};
        a.q = qp;
        a.scales = scales.data_ptr();
        a.M = M;
        a.N = N;
        a.recipe = static_cast<int>(r);
        a.y = y.data_ptr<float>();
        check_status(mok_dequantize_fp8_cuda(&a, at::cuda::getCurrentCUDAStream(q.device().index()).stream()), op);
        return y;
    }
#endif
    switch (r) {
        case Recipe::kBlock1x128:
            st = mok_dequantize_blockwise_1xb(qp, scales.data_ptr<float>(), M, N, B, y.data_ptr<float>());
            break;
        case Recipe::kBlock128x128:
            st = mok_dequantize_blockwise_bxb(qp, scales.data_ptr<float>(), M, N, B, y.data_ptr<float>());
            break;
        case Recipe::kMx:
            st = mok_dequantize_mx_1xb(qp, scales.data_ptr<uint8_t>(), M, N, B, y.data_ptr<float>());
            break;
    }
    check_status(st, op);
    return y;
}

// E of an optional expert offsets tensor [E + 1] (0 without one), checked against the data x.
int64_t checked_offsets(const c10::optional<at::Tensor>& offsets, const at::Tensor& x, const char* op) {
    if (!offsets.has_value()) return 0;
    check_dim(*offsets, 1, op, "offsets", "[E + 1]");
    check_same_device(*offsets, x, op, "offsets", "x");
    check_index(*offsets, x, op, "offsets");
    TORCH_CHECK_VALUE(offsets->size(0) >= 1, op, ": offsets must hold E + 1 >= 1 entries, got shape ",
                      shape_str(*offsets));
    return offsets->size(0) - 1;
}

// (rows, cols) of bf16 x [M, N]: the row-wise qdq (1 x 32 blocks along N) when `rows`, the
// column-wise qdq (32 x 1 blocks along M, restarting at each offsets[e]; rows outside
// [offsets[0], offsets[E]) are +0; no offsets: one segment [0, M)) when `cols`. A copy not asked
// for is returned as an empty [0, N] tensor.
std::tuple<at::Tensor, at::Tensor> qdq_mxfp8(const at::Tensor& x, const c10::optional<at::Tensor>& offsets, bool rows,
                                             bool cols) {
    const char* op = "mok.qdq_mxfp8";
    TORCH_CHECK_VALUE(rows || cols, op, ": at least one of rows and cols must be true");
    check_dim(x, 2, op, "x", "[M, N]");
    check_dtype(x, at::kBFloat16, op, "x");
    check_contiguous(x, op, "x");
    const int64_t M = x.size(0), N = x.size(1);
    const int64_t E = checked_offsets(offsets, x, op);
#ifdef MOK_WITH_CUDA
    if (x.is_cuda()) return cuda::qdq_mxfp8(x, M, offsets, E, rows, cols, op);
#endif
    auto y_rows = at::empty({rows ? M : 0, N}, x.options());
    auto y_cols = at::empty({cols ? M : 0, N}, x.options());
    if (M == 0 || N == 0) return {y_rows, y_cols};
    const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
    uint16_t* rp = rows ? reinterpret_cast<uint16_t*>(y_rows.data_ptr()) : nullptr;
    uint16_t* cp = cols ? reinterpret_cast<uint16_t*>(y_cols.data_ptr()) : nullptr;
    const int32_t* offp = offsets.has_value() ? offsets->data_ptr<int32_t>() : nullptr;
    if (cols && offp != nullptr) {
        // The offsets are on the host here, so their values can be checked for free (the core would
        // only say "invalid argument").
        for (int64_t e = 0; e <= E; ++e) {
            const int32_t prev = e ? offp[e - 1] : 0;
            TORCH_CHECK_VALUE(offp[e] >= prev, op, ": offsets must be non-negative and non-decreasing (a plan's ",
                              "expert row offsets), got offsets[", e, "] = ", offp[e], e ? " after " : "",
                              e ? std::to_string(prev) : "");
        }
        TORCH_CHECK_VALUE(offp[E] <= M, op, ": offsets[E] must be at most the rows of x (", M, "), got ", offp[E]);
    }
    // Blocks are independent: any split gives the same bits. About 64k elements per task.
    const int64_t grain_rows = std::max<int64_t>(1, (int64_t{1} << 16) / N);
    const int64_t grain_cols = std::max<int64_t>(1, (int64_t{1} << 16) / M);
    if (rows) {
        at::parallel_for(0, M, grain_rows, [&](int64_t r0, int64_t r1) {
            check_status(mok_qdq_mxfp8_rows(xp, M, N, r0, r1, rp), op);
        });
    }
    if (cols) {
        at::parallel_for(0, N, grain_cols, [&](int64_t c0, int64_t c1) {
            check_status(mok_qdq_mxfp8_cols(xp, M, N, offp, E, c0, c1, cp), op);
        });
    }
    return {y_rows, y_cols};
}

// qdq_mxfp8(gather_rows(x, src_of_row, w, top_k), offsets, rows, cols): recipe="mxfp8"'s copies of the
// layer's gathered rows (x_rows in the forward; d_rows, weighted, in the backward) without the bf16
// gathered tensor. CUDA: one kernel reads each gathered row of x once; the CPU: the two ops (the
// definition).
std::tuple<at::Tensor, at::Tensor> qdq_mxfp8_gather(const at::Tensor& x, const at::Tensor& src_of_row,
                                                    const c10::optional<at::Tensor>& w, int64_t top_k,
                                                    const c10::optional<at::Tensor>& offsets, bool rows, bool cols) {
    const char* op = "mok.qdq_mxfp8_gather";
    TORCH_CHECK_VALUE(rows || cols, op, ": at least one of rows and cols must be true");
    check_dim(x, 2, op, "x", "[T, N]");
    check_dtype(x, at::kBFloat16, op, "x");
    check_contiguous(x, op, "x");
    check_dim(src_of_row, 1, op, "src_of_row", "[rows]");
    check_index(src_of_row, x, op, "src_of_row");
    TORCH_CHECK_VALUE(top_k >= 1, op, ": top_k must be >= 1, got ", top_k);
    check_weights(w, x, x.size(0), top_k, op);
    const int64_t E = checked_offsets(offsets, x, op);
#ifdef MOK_WITH_CUDA
    if (x.is_cuda()) return cuda::qdq_mxfp8(x, src_of_row.size(0), offsets, E, rows, cols, op, &src_of_row, w, top_k);
#endif
    (void)E;
    static auto gather = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mok::gather_rows", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                                               int64_t, const c10::optional<at::Tensor>&)>();
    return qdq_mxfp8(gather.call(x, src_of_row, w, top_k, c10::nullopt), offsets, rows, cols);
}

// The expert weight's codes (and, with transposed, its W^T codes per expert; else qt and scales_t undefined) for
// quantize_fp8_weight and quantize_fp8_weight_rowcol (op: the caller's name, for errors).
RowColTensors weight_codes(const at::Tensor& w, const c10::optional<at::Tensor>& up, bool transposed, const char* op) {
    check_dim(w, 3, op, "w", "[E, N, K]");
    check_contiguous(w, op, "w");
    const mok_dtype dt = to_mok_dtype(w, op, "w");
    const int64_t B = 128;
    TORCH_CHECK_VALUE(w.size(1) % B == 0, op, ": w.shape[1] (N) must be a multiple of ", B,
                      " so that no 128 x 128 tile spans two experts (or the two halves of a pair), got ", w.size(1));
    if (up.has_value()) check_up(*up, w, op, "w");
    const int64_t E = w.size(0), N = up.has_value() ? 2 * w.size(1) : w.size(1), K = w.size(2);
#ifdef MOK_WITH_CUDA
    if (w.is_cuda() && dt == MOK_BF16) {
        const auto codes = w.options().dtype(at::kFloat8_e4m3fn), fp32 = w.options().dtype(at::kFloat);
        auto q = at::empty({E, N, K}, codes);
        auto scales = at::empty({E, N / B, ceil_div(K, B)}, fp32);
        at::Tensor qt, scales_t;
        if (transposed) {
            qt = at::empty({E, K, N}, codes);
            scales_t = at::empty({E, ceil_div(K, B), N / B}, fp32);
        }
        if (w.numel() == 0) return {q, scales, qt, scales_t};
        c10::cuda::CUDAGuard guard(w.device());
        mok_quantize_fp8_rowcol_args a{};
        a.x = w.data_ptr();
        a.dtype = MOK_BF16;
        a.M = E * N;
        a.N = K;
        a.recipe = static_cast<int>(Recipe::kBlock128x128);
        a.q = static_cast<uint8_t*>(q.data_ptr());
        a.scales = scales.data_ptr();
        a.qt = transposed ? static_cast<uint8_t*>(qt.data_ptr()) : nullptr;
        a.scales_t = transposed ? scales_t.data_ptr() : nullptr;
        a.col_tile = 1;
        a.batch_rows = N;
        a.x_up = up.has_value() ? up->data_ptr() : nullptr;
        check_status(mok_quantize_fp8_rowcol_cuda(&a, at::cuda::getCurrentCUDAStream(w.device().index()).stream()), op);
        return {q, scales, qt, scales_t};
    }
#endif
    (void)dt;
    const at::Tensor whole = up.has_value() ? at::cat({w, *up}, 1) : w;
    auto [q, scales] = quantize_fp8(whole.reshape({E * N, K}), "blockwise_128x128");
    q = q.view({E, N, K});
    scales = scales.view({E, N / B, scales.size(1)});
    if (!transposed) return {q, scales, at::Tensor(), at::Tensor()};
    // (clones: with a dimension of 1 the transpose is already contiguous, and .contiguous() would return an
    // output aliasing another, which custom ops may not)
    return {q, scales, q.transpose(1, 2).clone(at::MemoryFormat::Contiguous),
            scales.transpose(1, 2).clone(at::MemoryFormat::Contiguous)};
}

RowColTensors quantize_fp8_weight_rowcol(const at::Tensor& w, const c10::optional<at::Tensor>& up) {
    return weight_codes(w, up, true, "mok.quantize_fp8_weight_rowcol");
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_weight(const at::Tensor& w, const c10::optional<at::Tensor>& up) {
    auto codes = weight_codes(w, up, false, "mok.quantize_fp8_weight");
    return {std::get<0>(codes), std::get<1>(codes)};
}

at::Tensor transpose_fp8_codes(const at::Tensor& q) {
    const char* op = "mok.transpose_fp8_codes";
    TORCH_CHECK_VALUE(q.dim() == 3, op, ": q must be 3-D [B, R, C], got shape ", shape_str(q));
    TORCH_CHECK_VALUE(q.element_size() == 1 && !q.is_complex(), op,
                      ": q must hold 1-byte codes (float8_e4m3fn, float8_e5m2, uint8 or int8), got ", q.scalar_type());
    const int64_t B = q.size(0), R = q.size(1), C = q.size(2);
#ifdef MOK_WITH_CUDA
    if (q.is_cuda() && R % 16 == 0 && C % 16 == 0) {
        const at::Tensor in = q.contiguous();
        auto out = at::empty({B, C, R}, q.options());
        if (out.numel() == 0) return out;
        if ((reinterpret_cast<uintptr_t>(in.data_ptr()) | reinterpret_cast<uintptr_t>(out.data_ptr())) % 16 == 0) {
            c10::cuda::CUDAGuard guard(q.device());
            check_status(mok_transpose_bytes_cuda(in.data_ptr(), out.data_ptr(), B, R, C,
                                                  at::cuda::getCurrentCUDAStream(q.device().index()).stream()),
                         op);
            return out;
        }
    }
#endif
    return q.transpose(1, 2).clone(at::MemoryFormat::Contiguous); // (never the input itself: R or C may be 1)
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
    m.def("transpose_fp8_codes(Tensor q) -> Tensor");
    m.def("quantize_fp8_weight_rowcol(Tensor w, Tensor? up=None) -> (Tensor q, Tensor scales, Tensor qt, "
          "Tensor scales_t)");
    m.def("quantize_fp8_weight(Tensor w, Tensor? up=None) -> (Tensor q, Tensor scales)");
    m.def("quantize_fp8(Tensor x, str recipe) -> (Tensor q, Tensor scales)");
    m.def("dequantize_fp8(Tensor q, Tensor scales, str recipe) -> Tensor");
    m.def("quantize_fp8_rowcol(Tensor x, str recipe, bool scales_t_mn_major=False, str? col_recipe=None) -> "
          "(Tensor q, Tensor scales, Tensor qt, Tensor scales_t)");
    m.def("quantize_fp8_rowcol_gather(Tensor x, Tensor src_of_row, Tensor? w, int top_k, str recipe, "
          "bool scales_t_mn_major=False, str? col_recipe=None) -> (Tensor q, Tensor scales, Tensor qt, Tensor scales_t)");
    m.def("qdq_mxfp8(Tensor x, Tensor? offsets, bool rows, bool cols) -> (Tensor row_qdq, Tensor col_qdq)");
    m.def("qdq_mxfp8_gather(Tensor x, Tensor src_of_row, Tensor? w, int top_k, Tensor? offsets, bool rows, bool cols) "
          "-> (Tensor row_qdq, Tensor col_qdq)");
}

TORCH_LIBRARY_IMPL(mok, CPU, m) {
    m.impl("transpose_fp8_codes", &transpose_fp8_codes);
    m.impl("quantize_fp8_weight_rowcol", &quantize_fp8_weight_rowcol);
    m.impl("quantize_fp8_weight", &quantize_fp8_weight);
    m.impl("quantize_fp8", &quantize_fp8);
    m.impl("dequantize_fp8", &dequantize_fp8);
    m.impl("quantize_fp8_rowcol", &quantize_fp8_rowcol);
    m.impl("quantize_fp8_rowcol_gather", &quantize_fp8_rowcol_gather);
    m.impl("qdq_mxfp8", &qdq_mxfp8);
    m.impl("qdq_mxfp8_gather", &qdq_mxfp8_gather);
}

#ifdef MOK_WITH_CUDA
TORCH_LIBRARY_IMPL(mok, CUDA, m) {
    m.impl("transpose_fp8_codes", &transpose_fp8_codes);
    m.impl("quantize_fp8_weight_rowcol", &quantize_fp8_weight_rowcol);
    m.impl("quantize_fp8_weight", &quantize_fp8_weight);
    m.impl("quantize_fp8", &quantize_fp8);
    m.impl("dequantize_fp8", &dequantize_fp8);
    m.impl("quantize_fp8_rowcol", &quantize_fp8_rowcol);
    m.impl("quantize_fp8_rowcol_gather", &quantize_fp8_rowcol_gather);
    m.impl("qdq_mxfp8", &qdq_mxfp8);
    m.impl("qdq_mxfp8_gather", &qdq_mxfp8_gather);
}
#endif

}  // namespace mok
