// swiglu_quantize_fp8: SwiGLU (d_act absent) or its gradient (d_act given) with the result quantised
// blockwise 1 x 128 in the same op, for the FP8 layer (mok/_fp8_experts.py), which quantises act in
// the forward and d_h in the backward as soon as they exist:
//
//   swiglu_quantize_fp8(h [R, 2I], d_act [R, I]?, rows, cols, keep, scales_t_mn_major=False, col_recipe=None)
//     -> (out, q, scales, qt, scales_t)
//   y = swiglu(h) [R, I] or swiglu_backward(h, d_act) [R, 2I] (N columns);
//   (q [R, N] e4m3, scales [R, N / 128] f32)            = quantize_fp8(y, "blockwise_1x128")      if rows
//   (qt [N, R] e4m3, scales_t [N, ceil(R / 128)] f32)   = quantize_fp8(y^T, col_recipe)          if cols
//   out = y if keep. What is not asked for comes back as an empty tensor of its dtype. col_recipe
//   "blockwise_128x128" (v52) makes the column-wise copy in 128 x 128 tiles (fp8_wgrad="tiled"),
//   scales_t_mn_major gives scales_t transposed: exactly quantize_fp8_rowcol(y, ..., scales_t_mn_major,
//   col_recipe)'s column-wise half.
//
//   swiglu_scaled_quantize_fp8(h [R, 2I], d_z [R, I]?, row_scale [R], rows, cols, scales_t_mn_major=False,
//                              col_recipe=None) -> (q, scales, qt, scales_t, d_s)
//   the row-scaled form z = s * swiglu(h), s = row_scale (v53: the all-FP8 layer's router weights,
//   mok/_down_combine.py explains why), with (d_h, z, d_s) = swiglu_scaled_backward(h, d_z, s):
//   forward (d_z absent): the row-wise copy of act = swiglu(h), the column-wise copy of z; d_s empty.
//   backward: both copies of d_h, and d_s [R] (f32): d_s[r] = sum_j d_z[r, j] * act[r, j].
//
// Each is that composition by definition, and on the CPU and for other dtypes or shapes it runs that
// way (the ops through the dispatcher). CUDA bf16 with I % 128 == 0 takes one kernel
// (csrc/cuda/quant/swiglu_quantize_tile.cuh) that never writes y unless keep: the same bits (d_s: the
// kernel's per-128-column partial sums added in a fixed order, equal to the serial sum up to rounding).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#ifdef MOK_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda/mok_cuda.h"
#endif

#include "checks.h"

namespace mok {
namespace {

using Quantized = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
constexpr const char* kRecipe = "blockwise_1x128";
constexpr int64_t kBlock = 128;

at::Tensor call_swiglu(const at::Tensor& h) {
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mok::swiglu", "").typed<at::Tensor(const at::Tensor&)>();
    return op.call(h);
}

at::Tensor call_swiglu_backward(const at::Tensor& h, const at::Tensor& d_act) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("mok::swiglu_backward", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
    return op.call(h, d_act);
}

std::tuple<at::Tensor, at::Tensor> call_quantize(const at::Tensor& x) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("mok::quantize_fp8", "")
                         .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, c10::string_view)>();
    return op.call(x, kRecipe);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_quantize_rowcol(
    const at::Tensor& x, bool mn_major, const c10::optional<c10::string_view>& col_recipe) {
    static auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("mok::quantize_fp8_rowcol", "")
            .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                const at::Tensor&, c10::string_view, bool, const c10::optional<c10::string_view>&)>();
    return op.call(x, kRecipe, mn_major, col_recipe);
}

// The column-wise copy in 128 x 128 tiles: col_recipe "blockwise_128x128"; the recipe itself (or none)
// keeps 1 x 128 blocks; anything else is an error naming the argument.
bool col_tiles_of(const c10::optional<c10::string_view>& col_recipe, const char* op) {
    if (!col_recipe.has_value() || *col_recipe == kRecipe) return false;
    TORCH_CHECK_VALUE(*col_recipe == "blockwise_128x128", op,
                      ": col_recipe must be 'blockwise_1x128' or 'blockwise_128x128', got '", std::string(*col_recipe),
                      "'");
    return true;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_swiglu_scaled_backward(const at::Tensor& h, const at::Tensor& d_z,
                                                                           const at::Tensor& src_of_row,
                                                                           const at::Tensor& w) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("mok::swiglu_scaled_backward", "")
                         .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                               const at::Tensor&, const at::Tensor&)>();
    return op.call(h, d_z, src_of_row, w);
}

at::Tensor nothing(const at::Tensor& like, at::ScalarType dtype) { return at::empty({0}, like.options().dtype(dtype)); }

// (q, scales) row-wise and / or (qt, scales_t) column-wise of y: the composed path's quantisation.
void quantize_composed(const at::Tensor& y, bool rows, bool cols, bool mn_major,
                       const c10::optional<c10::string_view>& col_recipe, at::Tensor& q, at::Tensor& scales,
                       at::Tensor& qt, at::Tensor& scales_t) {
    if (cols) {
        auto [rq, rs, cq, cs] = call_quantize_rowcol(y, mn_major, col_recipe);
        qt = cq;
        scales_t = cs;
        if (rows) {
            q = rq;
            scales = rs;
        }
    } else if (rows) {
        std::tie(q, scales) = call_quantize(y);
    }
}

// The composition itself (the definition; CPU, other dtypes, I % 128 != 0).
Quantized composed(const at::Tensor& h, const c10::optional<at::Tensor>& d_act, bool rows, bool cols, bool keep,
                   bool mn_major, const c10::optional<c10::string_view>& col_recipe) {
    const at::Tensor y = d_act.has_value() ? call_swiglu_backward(h, *d_act) : call_swiglu(h);
    at::Tensor q = nothing(h, at::kFloat8_e4m3fn), scales = nothing(h, at::kFloat);
    at::Tensor qt = nothing(h, at::kFloat8_e4m3fn), scales_t = nothing(h, at::kFloat);
    quantize_composed(y, rows, cols, mn_major, col_recipe, q, scales, qt, scales_t);
    return {keep ? y : nothing(h, h.scalar_type()), q, scales, qt, scales_t};
}

// The row-scaled op's composition: swiglu_scaled_backward with s as w [R, 1] and src_of_row = r (the
// forward's z from a zero d_z; its d_h and d_s are then unused).
Quantized composed_scaled(const at::Tensor& h, const c10::optional<at::Tensor>& d_z, const at::Tensor& row_scale,
                          bool rows, bool cols, bool mn_major, const c10::optional<c10::string_view>& col_recipe) {
    const int64_t R = h.size(0), I = h.size(1) / 2;
    const at::Tensor src = at::arange(R, h.options().dtype(at::kInt));
    const at::Tensor dz = d_z.has_value() ? *d_z : at::zeros({R, I}, h.options());
    auto [d_h, z, d_s] = call_swiglu_scaled_backward(h, dz, src, row_scale.view({R, 1}));
    at::Tensor q = nothing(h, at::kFloat8_e4m3fn), scales = nothing(h, at::kFloat);
    at::Tensor qt = nothing(h, at::kFloat8_e4m3fn), scales_t = nothing(h, at::kFloat);
    if (d_z.has_value()) {
        quantize_composed(d_h, rows, cols, mn_major, col_recipe, q, scales, qt, scales_t);
        return {q, scales, qt, scales_t, d_s};
    }
    if (rows) std::tie(q, scales) = call_quantize(call_swiglu(h));
    at::Tensor unused_q, unused_s;
    if (cols) quantize_composed(z, false, true, mn_major, col_recipe, unused_q, unused_s, qt, scales_t);
    return {q, scales, qt, scales_t, nothing(h, d_s.scalar_type())};
}

// Shared checks of both ops: h [R, 2I] and the incoming gradient (named grad_name) [R, I].
void check_swiglu_quantize_args(const char* op, const at::Tensor& h, const c10::optional<at::Tensor>& grad,
                                const char* grad_name, bool rows, bool cols) {
    check_dim(h, 2, op, "h", "[rows, 2 * I]");
    check_contiguous(h, op, "h");
    to_mok_dtype(h, op, "h");
    TORCH_CHECK_VALUE(h.size(1) % 2 == 0, op, ": h.shape[1] must be even ([gate | up]), got shape ", shape_str(h));
    TORCH_CHECK_VALUE(rows || cols, op, ": rows and cols are both false: nothing to quantise");
    if (grad.has_value()) {
        const at::Tensor& d = *grad;
        check_dim(d, 2, op, grad_name, "[rows, I]");
        check_contiguous(d, op, grad_name);
        check_dtype(d, h.scalar_type(), op, grad_name);
        check_same_device(d, h, op, grad_name, "h");
        check_size(d, 0, h.size(0), op, grad_name, "rows of h");
        check_size(d, 1, h.size(1) / 2, op, grad_name, "half the width of h");
    }
}

#ifdef MOK_WITH_CUDA
// The one kernel's path: CUDA bf16, I % 128 == 0, 16-byte aligned h and gradient.
bool kernel_applies(const at::Tensor& h, const c10::optional<at::Tensor>& grad) {
    const int64_t I = h.size(1) / 2;
    const bool aligned = (reinterpret_cast<uintptr_t>(h.data_ptr()) % 16 == 0) &&
                         (!grad.has_value() || reinterpret_cast<uintptr_t>(grad->data_ptr()) % 16 == 0);
    return h.is_cuda() && h.scalar_type() == at::kBFloat16 && I > 0 && I % kBlock == 0 && aligned;
}

// Runs the kernel: the outputs allocated here, a filled in by the caller except for the outputs.
Quantized launch_kernel(const char* op, const at::Tensor& h, bool backward, bool rows, bool cols, bool keep,
                        bool mn_major, bool col_tiles, mok_swiglu_quantize_fp8_args a) {
    const int64_t R = h.size(0), I = h.size(1) / 2, N = backward ? 2 * I : I;
    const auto codes = h.options().dtype(at::kFloat8_e4m3fn), f32 = h.options().dtype(at::kFloat);
    at::Tensor out = keep ? at::empty({R, N}, h.options()) : nothing(h, h.scalar_type());
    at::Tensor q = rows ? at::empty({R, N}, codes) : nothing(h, at::kFloat8_e4m3fn);
    at::Tensor scales = rows ? at::empty({R, N / kBlock}, f32) : nothing(h, at::kFloat);
    at::Tensor qt = cols ? at::empty({N, R}, codes) : nothing(h, at::kFloat8_e4m3fn);
    // scales_t: one per (column, 128 rows) or per 128 x 128 tile; transposed when MN-major
    const int64_t st_rows = col_tiles ? (N + kBlock - 1) / kBlock : N, st_cols = (R + kBlock - 1) / kBlock;
    at::Tensor scales_t = nothing(h, at::kFloat);
    if (cols) scales_t = mn_major ? at::empty({st_cols, st_rows}, f32) : at::empty({st_rows, st_cols}, f32);
    if (R == 0) return {out, q, scales, qt, scales_t};
    c10::cuda::CUDAGuard guard(h.device());
    a.h = h.data_ptr();
    a.R = R;
    a.I = I;
    a.out = keep ? out.data_ptr() : nullptr;
    a.q = rows ? static_cast<uint8_t*>(q.data_ptr()) : nullptr;
    a.scales = rows ? scales.data_ptr<float>() : nullptr;
    a.qt = cols ? static_cast<uint8_t*>(qt.data_ptr()) : nullptr;
    a.scales_t = cols ? scales_t.data_ptr<float>() : nullptr;
    a.scales_t_mn_major = mn_major;
    a.col_tile = col_tiles;
    check_status(mok_swiglu_quantize_fp8_cuda(&a, at::cuda::getCurrentCUDAStream(h.device().index()).stream()), op);
    return {out, q, scales, qt, scales_t};
}
#endif

Quantized swiglu_quantize_fp8(const at::Tensor& h, const c10::optional<at::Tensor>& d_act, bool rows, bool cols,
                              bool keep, bool scales_t_mn_major, const c10::optional<c10::string_view>& col_recipe) {
    const char* op = "mok.swiglu_quantize_fp8";
    const bool col_tiles = col_tiles_of(col_recipe, op);
    check_swiglu_quantize_args(op, h, d_act, "d_act", rows, cols);
#ifdef MOK_WITH_CUDA
    if (kernel_applies(h, d_act)) {
        mok_swiglu_quantize_fp8_args a{};
        a.d_act = d_act.has_value() ? d_act->data_ptr() : nullptr;
        return launch_kernel(op, h, d_act.has_value(), rows, cols, keep, scales_t_mn_major, col_tiles, a);
    }
#endif
    return composed(h, d_act, rows, cols, keep, scales_t_mn_major, col_recipe);
}

Quantized swiglu_scaled_quantize_fp8(const at::Tensor& h, const c10::optional<at::Tensor>& d_z,
                                     const at::Tensor& row_scale, bool rows, bool cols, bool scales_t_mn_major,
                                     const c10::optional<c10::string_view>& col_recipe) {
    const char* op = "mok.swiglu_scaled_quantize_fp8";
    const bool col_tiles = col_tiles_of(col_recipe, op);
    check_swiglu_quantize_args(op, h, d_z, "d_z", rows, cols);
    check_dim(row_scale, 1, op, "row_scale", "[rows]");
    check_contiguous(row_scale, op, "row_scale");
    check_dtype(row_scale, acc_dtype(h.scalar_type()), op, "row_scale");
    check_same_device(row_scale, h, op, "row_scale", "h");
    check_size(row_scale, 0, h.size(0), op, "row_scale", "rows of h");
#ifdef MOK_WITH_CUDA
    if (kernel_applies(h, d_z) && reinterpret_cast<uintptr_t>(row_scale.data_ptr()) % 4 == 0) {
        const int64_t R = h.size(0), I = h.size(1) / 2;
        const bool backward = d_z.has_value();
        // the backward's per-tile partial sums of d_z . act, added over the I / 128 tiles in a fixed order
        at::Tensor part = backward ? at::empty({I / kBlock, R}, h.options().dtype(at::kFloat)) : at::Tensor();
        mok_swiglu_quantize_fp8_args a{};
        a.d_act = backward ? d_z->data_ptr() : nullptr;
        a.row_scale = row_scale.data_ptr<float>();
        a.d_s_part = backward ? part.data_ptr<float>() : nullptr;
        auto [out, q, scales, qt, scales_t] = launch_kernel(op, h, backward, rows, cols, false, scales_t_mn_major,
                                                            col_tiles, a);
        return {q, scales, qt, scales_t, backward ? part.sum(0) : nothing(h, at::kFloat)};
    }
#endif
    return composed_scaled(h, d_z, row_scale, rows, cols, scales_t_mn_major, col_recipe);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
    m.def("swiglu_quantize_fp8(Tensor h, Tensor? d_act, bool rows, bool cols, bool keep, bool scales_t_mn_major=False, "
          "str? col_recipe=None) -> (Tensor out, Tensor q, Tensor scales, Tensor qt, Tensor scales_t)");
    m.def("swiglu_scaled_quantize_fp8(Tensor h, Tensor? d_z, Tensor row_scale, bool rows, bool cols, "
          "bool scales_t_mn_major=False, str? col_recipe=None) -> (Tensor q, Tensor scales, Tensor qt, Tensor scales_t, "
          "Tensor d_s)");
}

TORCH_LIBRARY_IMPL(mok, CPU, m) {
    m.impl("swiglu_quantize_fp8", &swiglu_quantize_fp8);
    m.impl("swiglu_scaled_quantize_fp8", &swiglu_scaled_quantize_fp8);
}

#ifdef MOK_WITH_CUDA
TORCH_LIBRARY_IMPL(mok, CUDA, m) {
    m.impl("swiglu_quantize_fp8", &swiglu_quantize_fp8);
    m.impl("swiglu_scaled_quantize_fp8", &swiglu_scaled_quantize_fp8);
}
#endif

}  // namespace mok
