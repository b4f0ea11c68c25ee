// torch.ops.mok: schemas, argument checks and output allocation. The compute goes to
// mok::cpu (C core) or mok::cuda (csrc/cuda launchers) by the device of the data.
// Fake kernels and autograd formulas are registered in Python (mok/_ops.py).
#include <torch/library.h>

#include "backend.h"
#include "checks.h"

namespace mok {
namespace {

#ifdef MOK_WITH_CUDA
#define MOK_DISPATCH(dev, fn, ...)          \
    do {                                    \
        if ((dev).is_cuda()) {              \
            cuda::fn(__VA_ARGS__);          \
        } else {                            \
            cpu::fn(__VA_ARGS__);           \
        }                                   \
    } while (0)
#else
#define MOK_DISPATCH(dev, fn, ...)                                                                  \
    do {                                                                                            \
        TORCH_CHECK(!(dev).is_cuda(), "mok was built without CUDA support: reinstall it where nvcc " \
                                      "and a CUDA build of torch are available");                   \
        cpu::fn(__VA_ARGS__);                                                                       \
    } while (0)
#endif

void check_router_dtype(const at::Tensor& t, const char* op, const char* name) {
    TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op, ": ", name,
                      " must be float32 or float64 (router math runs in fp32), got ", t.scalar_type());
}

void check_score_func(int64_t score_func, const char* op) {
    TORCH_CHECK_VALUE(score_func == MOK_SCORE_SOFTMAX || score_func == MOK_SCORE_SIGMOID, op,
                      ": score_func must be 0 (softmax) or 1 (sigmoid), got ", score_func);
}

// ---------------------------------------------------------------------------------------------
// routing
// ---------------------------------------------------------------------------------------------

// Returns (topk_w, topk_idx): the differentiable output first (opcheck's aot check sums the
// outputs into the first one's dtype).
std::tuple<at::Tensor, at::Tensor> route_topk(const at::Tensor& logits, const c10::optional<at::Tensor>& bias,
                                              int64_t top_k, int64_t score_func, int64_t n_group, int64_t topk_group,
                                              bool renormalize, double scaling) {
    const char* op = "mok.route_topk";
    check_dim(logits, 2, op, "logits", "[T, E]");
    check_contiguous(logits, op, "logits");
    check_router_dtype(logits, op, "logits");
    check_score_func(score_func, op);
    const int64_t E = logits.size(1);
    TORCH_CHECK_VALUE(top_k >= 1 && top_k <= E, op, ": top_k must be in [1, num_experts=", E, "], got ", top_k);
    if (bias.has_value()) {
        check_dim(*bias, 1, op, "bias", "[E]");
        check_size(*bias, 0, E, op, "bias", "number of experts");
        check_dtype(*bias, logits.scalar_type(), op, "bias");
        check_contiguous(*bias, op, "bias");
        check_same_device(*bias, logits, op, "bias", "logits");
    }
    if (n_group > 1) {
        TORCH_CHECK_VALUE(E % n_group == 0, op, ": num_experts=", E, " must be divisible by n_group=", n_group);
        TORCH_CHECK_VALUE(topk_group >= 1 && topk_group <= n_group, op, ": topk_group must be in [1, n_group=",
                          n_group, "], got ", topk_group);
        TORCH_CHECK_VALUE(top_k <= topk_group * (E / n_group), op, ": top_k=", top_k,
                          " exceeds the experts in topk_group=", topk_group, " groups of ", E / n_group);
    }
    auto topk_idx = at::empty({logits.size(0), top_k}, logits.options().dtype(at::kInt));
    auto topk_w = at::empty({logits.size(0), top_k}, logits.options());
    if (logits.size(0) > 0)
        MOK_DISPATCH(logits, route_topk, logits, bias, score_func, n_group, topk_group, renormalize, scaling, topk_idx,
                     topk_w);
    return {topk_w, topk_idx};
}

at::Tensor route_topk_backward(const at::Tensor& grad_w, const at::Tensor& logits, const at::Tensor& topk_idx,
                               int64_t score_func, bool renormalize, double scaling) {
    const char* op = "mok.route_topk_backward";
    check_dim(logits, 2, op, "logits", "[T, E]");
    check_router_dtype(logits, op, "logits");
    check_contiguous(logits, op, "logits");
    check_score_func(score_func, op);
    check_dim(topk_idx, 2, op, "topk_idx", "[T, K]");
    check_index(topk_idx, logits, op, "topk_idx");
    check_size(topk_idx, 0, logits.size(0), op, "topk_idx", "tokens of logits");
    check_dim(grad_w, 2, op, "grad_w", "[T, K]");
    check_dtype(grad_w, logits.scalar_type(), op, "grad_w");
    check_contiguous(grad_w, op, "grad_w");
    TORCH_CHECK_VALUE(grad_w.sizes() == topk_idx.sizes(), op, ": grad_w must have the shape of topk_idx ",
                      shape_str(topk_idx), ", got ", shape_str(grad_w));
    auto grad_logits = at::empty_like(logits);
    if (logits.size(0) > 0)
        MOK_DISPATCH(logits, route_topk_backward, grad_w, logits, topk_idx, score_func, renormalize, scaling,
                     grad_logits);
    return grad_logits;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_plan(const at::Tensor& topk_idx,
                                                                                int64_t num_experts, int64_t tile,
                                                                                bool skip_invalid) {
    const char* op = "mok.moe_plan";
    check_dim(topk_idx, 2, op, "topk_idx", "[T, K]");
    check_dtype(topk_idx, at::kInt, op, "topk_idx");
    check_contiguous(topk_idx, op, "topk_idx");
    TORCH_CHECK_VALUE(num_experts >= 1, op, ": num_experts must be >= 1, got ", num_experts);
    TORCH_CHECK_VALUE(tile >= 1, op, ": tile must be >= 1, got ", tile);
    const int64_t T = topk_idx.size(0), K = topk_idx.size(1);
    const int64_t capacity = mok_plan_capacity(T, K, num_experts, tile);
    TORCH_CHECK_VALUE(capacity < (int64_t(1) << 31), op, ": the plan needs ", capacity,
                      " rows, more than int32 row indices hold");
    auto opts = topk_idx.options();
    auto counts = at::empty({num_experts}, opts);
    auto offsets = at::empty({num_experts + 1}, opts);
    auto row_of = at::empty({T, K}, opts);
    auto src_of_row = at::empty({capacity}, opts);
    auto num_skipped = at::empty({1}, opts);
    MOK_DISPATCH(topk_idx, moe_plan, topk_idx, num_experts, tile, skip_invalid, counts, offsets, row_of, src_of_row,
                 num_skipped);
    return {counts, offsets, row_of, src_of_row, num_skipped};
}

// ---------------------------------------------------------------------------------------------
// row movement
// ---------------------------------------------------------------------------------------------

// row_of, when given, is the plan's inverse map [T, top_k]: a speed hint (the CUDA kernel may walk
// the tokens and read x once: plain bf16 copies with 4 <= top_k <= 32); the result is the same
// whatever it holds.
at::Tensor gather_rows(const at::Tensor& x, const at::Tensor& src_of_row, const c10::optional<at::Tensor>& w,
                       int64_t top_k, const c10::optional<at::Tensor>& row_of) {
    const char* op = "mok.gather_rows";
    check_dim(x, 2, op, "x", "[T, H]");
    check_contiguous(x, op, "x");
    to_mok_dtype(x, op, "x");
    check_dim(src_of_row, 1, op, "src_of_row", "[rows]");
    check_index(src_of_row, x, op, "src_of_row");
    TORCH_CHECK_VALUE(top_k >= 1, op, ": top_k must be >= 1, got ", top_k);
    check_weights(w, x, x.size(0), top_k, op);
    if (row_of.has_value()) {
        check_dim(*row_of, 2, op, "row_of", "[T, top_k]");
        check_index(*row_of, x, op, "row_of");
        check_size(*row_of, 0, x.size(0), op, "row_of", "tokens");
        check_size(*row_of, 1, top_k, op, "row_of", "top_k");
    }
    auto out = at::empty({src_of_row.size(0), x.size(1)}, x.options());
    if (out.numel() > 0) MOK_DISPATCH(x, gather_rows, x, src_of_row, w, top_k, row_of, out);
    return out;
}

at::Tensor combine(const at::Tensor& rows, const at::Tensor& row_of, const at::Tensor& src_of_row,
                   const c10::optional<at::Tensor>& w) {
    const char* op = "mok.combine";
    check_dim(rows, 2, op, "rows", "[rows, H]");
    check_contiguous(rows, op, "rows");
    to_mok_dtype(rows, op, "rows");
    check_dim(row_of, 2, op, "row_of", "[T, K]");
    check_index(row_of, rows, op, "row_of");
    check_dim(src_of_row, 1, op, "src_of_row", "[rows]");
    check_index(src_of_row, rows, op, "src_of_row");
    check_size(src_of_row, 0, rows.size(0), op, "src_of_row", "rows of the plan");
    check_weights(w, rows, row_of.size(0), row_of.size(1), op);
    auto y = at::empty({row_of.size(0), rows.size(1)}, rows.options());
    if (y.numel() > 0) MOK_DISPATCH(rows, combine, rows, row_of, w, y);
    return y;
}

at::Tensor combine_weight_grad(const at::Tensor& dy, const at::Tensor& rows, const at::Tensor& row_of) {
    const char* op = "mok.combine_weight_grad";
    check_dim(rows, 2, op, "rows", "[rows, H]");
    check_contiguous(rows, op, "rows");
    to_mok_dtype(rows, op, "rows");
    check_dim(dy, 2, op, "dy", "[T, H]");
    check_contiguous(dy, op, "dy");
    check_dtype(dy, rows.scalar_type(), op, "dy");
    check_same_device(dy, rows, op, "dy", "rows");
    check_dim(row_of, 2, op, "row_of", "[T, K]");
    check_index(row_of, rows, op, "row_of");
    check_size(dy, 0, row_of.size(0), op, "dy", "tokens of row_of");
    check_size(dy, 1, rows.size(1), op, "dy", "hidden size of rows");
    auto d_w = at::empty({row_of.size(0), row_of.size(1)}, rows.options().dtype(acc_dtype(rows.scalar_type())));
    if (d_w.numel() > 0) {
        if (rows.size(1) == 0) {
            d_w.zero_();
        } else {
            MOK_DISPATCH(rows, combine_weight_grad, dy, rows, row_of, d_w);
        }
    }
    return d_w;
}

// ---------------------------------------------------------------------------------------------
// SwiGLU
// ---------------------------------------------------------------------------------------------

void check_swiglu_h(const at::Tensor& h, const char* op) {
    check_dim(h, 2, op, "h", "[rows, 2 * I]");
    check_contiguous(h, op, "h");
    to_mok_dtype(h, op, "h");
    TORCH_CHECK_VALUE(h.size(1) % 2 == 0, op, ": h.shape[1] must be even ([gate | up]), got shape ", shape_str(h));
}

at::Tensor swiglu(const at::Tensor& h) {
    check_swiglu_h(h, "mok.swiglu");
    auto act = at::empty({h.size(0), h.size(1) / 2}, h.options());
    if (act.numel() > 0) MOK_DISPATCH(h, swiglu, h, act);
    return act;
}

at::Tensor swiglu_backward(const at::Tensor& h, const at::Tensor& d_act) {
    const char* op = "mok.swiglu_backward";
    check_swiglu_h(h, op);
    check_dim(d_act, 2, op, "d_act", "[rows, I]");
    check_contiguous(d_act, op, "d_act");
    check_dtype(d_act, h.scalar_type(), op, "d_act");
    check_same_device(d_act, h, op, "d_act", "h");
    check_size(d_act, 0, h.size(0), op, "d_act", "rows of h");
    check_size(d_act, 1, h.size(1) / 2, op, "d_act", "half the width of h");
    auto d_h = at::empty_like(h);
    if (d_h.numel() > 0) MOK_DISPATCH(h, swiglu_backward, h, d_act, d_h);
    return d_h;
}

// Backward of z = s * SwiGLU(h) with the per-row scale s[r] = w[src_of_row[r]] (0 for padding
// rows): (d_h, z recomputed, d_s [rows] in the accumulation type). See mok_swiglu_scaled_backward
// in csrc/core/mok_core.h. The MoE layer's backward gets the router-weight gradient from it.
std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_scaled_backward(const at::Tensor& h, const at::Tensor& d_z,
                                                                      const at::Tensor& src_of_row,
                                                                      const at::Tensor& w) {
    const char* op = "mok.swiglu_scaled_backward";
    check_swiglu_h(h, op);
    check_dim(d_z, 2, op, "d_z", "[rows, I]");
    check_contiguous(d_z, op, "d_z");
    check_dtype(d_z, h.scalar_type(), op, "d_z");
    check_same_device(d_z, h, op, "d_z", "h");
    check_size(d_z, 0, h.size(0), op, "d_z", "rows of h");
    check_size(d_z, 1, h.size(1) / 2, op, "d_z", "half the width of h");
    check_dim(src_of_row, 1, op, "src_of_row", "[rows]");
    check_index(src_of_row, h, op, "src_of_row");
    check_size(src_of_row, 0, h.size(0), op, "src_of_row", "rows of h");
    check_dim(w, 2, op, "w", "[T, K]");
    check_dtype(w, acc_dtype(h.scalar_type()), op, "w");
    check_contiguous(w, op, "w");
    check_same_device(w, h, op, "w", "h");
    auto d_h = at::empty_like(h);
    auto z = at::empty_like(d_z);
    auto d_s = at::empty({h.size(0)}, h.options().dtype(acc_dtype(h.scalar_type())));
    if (h.size(0) > 0) MOK_DISPATCH(h, swiglu_scaled_backward, h, d_z, src_of_row, w, d_h, z, d_s);
    return {d_h, z, d_s};
}

// ---------------------------------------------------------------------------------------------
// grouped GEMMs
// ---------------------------------------------------------------------------------------------

// out [R, N] of a plain grouped GEMM: zeros without a contraction or experts, else run(out).
template <typename Run>
at::Tensor grouped_mm_out(const GroupedMMDims& d, const at::Tensor& a, Run&& run) {
    auto out = at::empty({d.R, d.N}, a.options());
    if (out.numel() > 0) {
        if (d.Kd == 0 || d.E == 0) {
            out.zero_();
        } else {
            run(out);
        }
    }
    return out;
}

at::Tensor grouped_mm(const at::Tensor& a, const c10::optional<at::Tensor>& a_gather, int64_t a_gather_div,
                      const at::Tensor& b, const at::Tensor& offsets, bool trans_b) {
    auto d = check_grouped_mm("mok.grouped_mm", a, a_gather, a_gather_div, b, offsets, trans_b);
    return grouped_mm_out(d, a, [&](at::Tensor& out) {
        MOK_DISPATCH(a, grouped_mm, a, a_gather, a_gather_div, b, offsets, trans_b, out, nullptr);
    });
}

// The checks of a GEMM1 with SwiGLU over x's rows gathered by src_of_row (top_k rows per token),
// gate_up [E, 2I, H] holding [gate | up] rows, or with up given, gate_up the gate rows [E, I, H] and
// up the up rows (then N = 2I counts both).
GroupedMMDims check_grouped_mm_swiglu(const char* op, const at::Tensor& x, const at::Tensor& src_of_row, int64_t top_k,
                                      const at::Tensor& gate_up, const at::Tensor& offsets,
                                      const c10::optional<at::Tensor>& up = c10::nullopt) {
    TORCH_CHECK_VALUE(top_k >= 1, op, ": top_k must be >= 1, got ", top_k);
    auto d = check_grouped_mm(op, x, src_of_row, top_k, gate_up, offsets, true);
    if (up.has_value()) {
        check_up(*up, gate_up, op, "gate_up");
        d.N *= 2;
    } else {
        TORCH_CHECK_VALUE(d.N % 2 == 0, op, ": gate_up.shape[1] must be even ([gate | up] = 2 * I), got shape ",
                          shape_str(gate_up));
    }
    return d;
}

// (act [R, I], h [R, 2I]) of a GEMM1 with SwiGLU: zeros without a contraction or experts, else run(h, act).
template <typename Run>
std::tuple<at::Tensor, at::Tensor> grouped_mm_swiglu_out(const GroupedMMDims& d, const at::Tensor& x, Run&& run) {
    auto h = at::empty({d.R, d.N}, x.options());
    auto act = at::empty({d.R, d.N / 2}, x.options());
    if (h.numel() > 0) {
        if (d.Kd == 0 || d.E == 0) {
            h.zero_();
            act.zero_();
        } else {
            run(h, act);
        }
    }
    return {act, h};
}

// GEMM1 of the expert MLP: token rows gathered on load (row r reads x[src_of_row[r] / top_k]),
// times gate_up[e]^T, then SwiGLU. Returns (act [R, I], h [R, 2I]); h is kept for backward.
// row_of is not read here: autograd needs it to reduce dx over each token's K rows.
// x_rows, when given, is gather_rows(x, src_of_row, None, top_k) [R, H]: the GEMM reads it
// instead of gathering (TMA rows on sm_90a), and the backward reuses it for the weight gradient.
// up, when given, holds the up rows [E, I, H] and gate_up only the gate rows [E, I, H] (torchtitan's
// w1 and w3): the same result as gate_up = cat(gate_up, up, 1), without the copy on sm_90a.
std::tuple<at::Tensor, at::Tensor> grouped_mm_swiglu(const at::Tensor& x, const at::Tensor& src_of_row,
                                                     const at::Tensor& row_of, int64_t top_k,
                                                     const at::Tensor& gate_up, const at::Tensor& offsets,
                                                     const c10::optional<at::Tensor>& x_rows,
                                                     const c10::optional<at::Tensor>& up) {
    const char* op = "mok.grouped_mm_swiglu";
    const auto d = check_grouped_mm_swiglu(op, x, src_of_row, top_k, gate_up, offsets, up);
    const at::Tensor* up_ptr = up.has_value() ? &*up : nullptr;
    check_dim(row_of, 2, op, "row_of", "[T, K]");
    check_index(row_of, x, op, "row_of");
    check_size(row_of, 0, x.size(0), op, "row_of", "tokens of x");
    check_size(row_of, 1, top_k, op, "row_of", "top_k");
    if (x_rows.has_value()) {
        check_dim(*x_rows, 2, op, "x_rows", "[rows, H] (gather_rows(x, src_of_row, None, top_k))");
        check_contiguous(*x_rows, op, "x_rows");
        check_dtype(*x_rows, x.scalar_type(), op, "x_rows");
        check_same_device(*x_rows, x, op, "x_rows", "x");
        check_size(*x_rows, 0, d.R, op, "x_rows", "rows of src_of_row");
        check_size(*x_rows, 1, x.size(1), op, "x_rows", "hidden size of x");
    }
    return grouped_mm_swiglu_out(d, x, [&](at::Tensor& h, at::Tensor& act) {
        if (x_rows.has_value()) {
            const c10::optional<at::Tensor> no_gather;
            MOK_DISPATCH(x, grouped_mm, *x_rows, no_gather, 1, gate_up, offsets, true, h, &act, up_ptr);
        } else {
            MOK_DISPATCH(x, grouped_mm, x, src_of_row, top_k, gate_up, offsets, true, h, &act, up_ptr);
        }
    });
}

// GEMM1's dgrad with the weight held as gate and up [E, I, H] (torchtitan's w1 and w3):
// d_rows [R, H] = grouped_mm(d_h, None, 1, cat(gate, up, 1), offsets, False), the same bits, read in
// place on sm_90a (I a multiple of 64; else the halves are concatenated first).
at::Tensor grouped_mm_gate_up_dgrad(const at::Tensor& d_h, const at::Tensor& gate, const at::Tensor& up,
                                    const at::Tensor& offsets) {
    const char* op = "mok.grouped_mm_gate_up_dgrad";
    check_dim(gate, 3, op, "gate", "[E, I, H] (the gate rows)");
    check_contiguous(gate, op, "gate");
    check_up(up, gate, op, "gate");
    check_dim(d_h, 2, op, "d_h", "[rows, 2I]");
    check_contiguous(d_h, op, "d_h");
    to_mok_dtype(d_h, op, "d_h");
    check_dtype(gate, d_h.scalar_type(), op, "gate");
    check_same_device(gate, d_h, op, "gate", "d_h");
    check_index(offsets, d_h, op, "offsets");
    check_dim(offsets, 1, op, "offsets", "[E + 1]");
    GroupedMMDims d;
    d.E = gate.size(0);
    d.N = gate.size(2);
    d.Kd = 2 * gate.size(1);
    d.R = d_h.size(0);
    check_size(offsets, 0, d.E + 1, op, "offsets", "number of experts + 1");
    check_size(d_h, 1, d.Kd, op, "d_h", "2I: the gate and up rows of gate and up");
    return grouped_mm_out(d, d_h, [&](at::Tensor& out) {
        const c10::optional<at::Tensor> no_gather;
        MOK_DISPATCH(d_h, grouped_mm, d_h, no_gather, 1, gate, offsets, false, out, nullptr, &up);
    });
}

// ---------------------------------------------------------------------------------------------
// grouped GEMMs of MXFP8-rounded A (recipe="mxfp8")
// ---------------------------------------------------------------------------------------------

// grouped_mm(qdq(A), None, 1, b, offsets, trans_b), where A = a, or a's rows gathered by a_gather
// (row r reads a[a_gather[r] / a_gather_div], a zero row where a_gather[r] < 0), and qdq(A) is A's
// row-wise MXFP8 quantise-dequantise (1 x 32 blocks along K: qdq_mxfp8(A, None, True, False)[0]).
// Bit for bit those ops; on sm_90a the qdq runs in the GEMM as each K-block of A arrives (plain
// GEMMs with contiguous A), so the rounded copy is never written. bf16 only.
at::Tensor grouped_mm_mxfp8_a(const at::Tensor& a, const c10::optional<at::Tensor>& a_gather, int64_t a_gather_div,
                              const at::Tensor& b, const at::Tensor& offsets, bool trans_b) {
    const char* op = "mok.grouped_mm_mxfp8_a";
    auto d = check_grouped_mm(op, a, a_gather, a_gather_div, b, offsets, trans_b);
    check_dtype(a, at::kBFloat16, op, "a");
    return grouped_mm_out(d, a, [&](at::Tensor& out) {
        MOK_DISPATCH(a, grouped_mm_mxfp8_a, a, a_gather, a_gather_div, b, offsets, trans_b, out, nullptr);
    });
}

// grouped_mm_swiglu(x, src_of_row, row_of, top_k, gate_up, offsets) on the MXFP8 row-wise qdq of the
// gathered rows (as grouped_mm_mxfp8_a): (act [R, I], h [R, 2I]). On sm_90a the qdq runs in the GEMM.
// No autograd (recipe="mxfp8" wires its own backward). bf16 only.
std::tuple<at::Tensor, at::Tensor> grouped_mm_swiglu_mxfp8_a(const at::Tensor& x, const at::Tensor& src_of_row,
                                                             int64_t top_k, const at::Tensor& gate_up,
                                                             const at::Tensor& offsets) {
    const char* op = "mok.grouped_mm_swiglu_mxfp8_a";
    auto d = check_grouped_mm_swiglu(op, x, src_of_row, top_k, gate_up, offsets);
    check_dtype(x, at::kBFloat16, op, "x");
    return grouped_mm_swiglu_out(d, x, [&](at::Tensor& h, at::Tensor& act) {
        MOK_DISPATCH(x, grouped_mm_mxfp8_a, x, src_of_row, top_k, gate_up, offsets, true, h, &act);
    });
}

// The checks of a weight gradient over each expert's rows of a [rows, M] (named a_name: "a", or
// "d_h" for GEMM1's gate / up halves) and b [rows, N] (or b's rows gathered by b_gather).
void check_grouped_mm_wgrad(const char* op, const char* a_name, const at::Tensor& a, const at::Tensor& b,
                            const c10::optional<at::Tensor>& b_gather, int64_t b_gather_div, const at::Tensor& offsets) {
    const std::string rows_of_a = std::string("rows of ") + a_name;
    check_dim(a, 2, op, a_name, "[rows, M]");
    check_dim(b, 2, op, "b", "[rows, N]");
    check_contiguous(a, op, a_name);
    check_contiguous(b, op, "b");
    to_mok_dtype(a, op, a_name);
    check_dtype(b, a.scalar_type(), op, "b");
    check_same_device(b, a, op, "b", a_name);
    check_dim(offsets, 1, op, "offsets", "[E + 1]");
    check_index(offsets, a, op, "offsets");
    TORCH_CHECK_VALUE(offsets.size(0) >= 1, op, ": offsets must hold E + 1 >= 1 entries");
    if (b_gather.has_value()) {
        check_dim(*b_gather, 1, op, "b_gather", "[rows]");
        check_index(*b_gather, a, op, "b_gather");
        check_size(*b_gather, 0, a.size(0), op, "b_gather", rows_of_a.c_str());
        TORCH_CHECK_VALUE(b_gather_div >= 1, op, ": b_gather_div must be >= 1, got ", b_gather_div);
    } else {
        check_size(b, 0, a.size(0), op, "b", rows_of_a.c_str());
    }
}

// out[e] = a_e^T @ B_e over each expert's rows (weight gradient with a ragged contraction).
at::Tensor grouped_mm_wgrad(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& b_gather,
                            int64_t b_gather_div, const at::Tensor& offsets) {
    const char* op = "mok.grouped_mm_wgrad";
    check_grouped_mm_wgrad(op, "a", a, b, b_gather, b_gather_div, offsets);
    const int64_t E = offsets.size(0) - 1;
    auto out = at::empty({E, a.size(1), b.size(1)}, a.options());
    if (out.numel() > 0) {
        if (a.size(0) == 0) {
            out.zero_();
        } else {
            MOK_DISPATCH(a, grouped_mm_wgrad, a, b, b_gather, b_gather_div, offsets, out);
        }
    }
    return out;
}

// GEMM1's weight gradient as gate and up halves (torchtitan's w1 and w3): (d_gate, d_up), each
// [E, I, N], the halves of grouped_mm_wgrad(d_h, b, b_gather, b_gather_div, offsets) along dim 1 (the
// same bits), written in place on sm_90a (I a multiple of 64; else split with a copy).
std::tuple<at::Tensor, at::Tensor> grouped_mm_gate_up_wgrad(const at::Tensor& d_h, const at::Tensor& b,
                                                            const c10::optional<at::Tensor>& b_gather,
                                                            int64_t b_gather_div, const at::Tensor& offsets) {
    const char* op = "mok.grouped_mm_gate_up_wgrad";
    check_grouped_mm_wgrad(op, "d_h", d_h, b, b_gather, b_gather_div, offsets);
    TORCH_CHECK_VALUE(d_h.size(1) % 2 == 0, op, ": d_h.shape[1] must be even ([gate | up] = 2 * I), got shape ",
                      shape_str(d_h));
    const int64_t E = offsets.size(0) - 1, I = d_h.size(1) / 2;
    auto d_gate = at::empty({E, I, b.size(1)}, d_h.options());
    auto d_up = at::empty({E, I, b.size(1)}, d_h.options());
    if (d_gate.numel() > 0) {
        if (d_h.size(0) == 0) {
            d_gate.zero_();
            d_up.zero_();
        } else {
            MOK_DISPATCH(d_h, grouped_mm_wgrad, d_h, b, b_gather, b_gather_div, offsets, d_gate, &d_up);
        }
    }
    return {d_gate, d_up};
}

// Reads (and optionally clears) the error bits kernels reported since the last clear. A plain
// host read of pinned memory: no synchronisation, so it sees the launches that have finished.
int64_t device_errors(bool clear) {
#ifdef MOK_WITH_CUDA
    volatile int32_t* word = cuda::device_error_word();
    if (!word) return 0;
    const int32_t bits = *word;
    if (clear && bits) *word = 0;
    return bits;
#else
    (void)clear;
    return 0;
#endif
}

}  // namespace

TORCH_LIBRARY(mok, m) {
    m.set_python_module("mok._ops");
    m.def("route_topk(Tensor logits, Tensor? bias, int top_k, int score_func, int n_group, int topk_group, "
          "bool renormalize, float scaling) -> (Tensor topk_w, Tensor topk_idx)");
    m.def("route_topk_backward(Tensor grad_w, Tensor logits, Tensor topk_idx, int score_func, bool renormalize, "
          "float scaling) -> Tensor");
    m.def("moe_plan(Tensor topk_idx, int num_experts, int tile, bool skip_invalid) -> (Tensor counts, "
          "Tensor offsets, Tensor row_of, Tensor src_of_row, Tensor num_skipped)");
    m.def("gather_rows(Tensor x, Tensor src_of_row, Tensor? w, int top_k, Tensor? row_of=None) -> Tensor");
    m.def("combine(Tensor rows, Tensor row_of, Tensor src_of_row, Tensor? w) -> Tensor");
    m.def("combine_weight_grad(Tensor dy, Tensor rows, Tensor row_of) -> Tensor");
    m.def("swiglu(Tensor h) -> Tensor");
    m.def("swiglu_backward(Tensor h, Tensor d_act) -> Tensor");
    m.def("swiglu_scaled_backward(Tensor h, Tensor d_z, Tensor src_of_row, Tensor w) -> (Tensor d_h, Tensor z, "
          "Tensor d_s)");
    m.def("grouped_mm(Tensor a, Tensor? a_gather, int a_gather_div, Tensor b, Tensor offsets, bool trans_b) -> Tensor");
    m.def("grouped_mm_swiglu(Tensor x, Tensor src_of_row, Tensor row_of, int top_k, Tensor gate_up, "
          "Tensor offsets, Tensor? x_rows=None, Tensor? up=None) -> (Tensor act, Tensor h)");
    m.def("grouped_mm_wgrad(Tensor a, Tensor b, Tensor? b_gather, int b_gather_div, Tensor offsets) -> Tensor");
    m.def("grouped_mm_gate_up_dgrad(Tensor d_h, Tensor gate, Tensor up, Tensor offsets) -> Tensor");
    m.def("grouped_mm_gate_up_wgrad(Tensor d_h, Tensor b, Tensor? b_gather, int b_gather_div, Tensor offsets) -> "
          "(Tensor d_gate, Tensor d_up)");
    m.def("grouped_mm_mxfp8_a(Tensor a, Tensor? a_gather, int a_gather_div, Tensor b, Tensor offsets, bool trans_b) "
          "-> Tensor");
    m.def("grouped_mm_swiglu_mxfp8_a(Tensor x, Tensor src_of_row, int top_k, Tensor gate_up, Tensor offsets) -> "
          "(Tensor act, Tensor h)");
    m.def("device_errors(bool clear) -> int", &device_errors);
}

#define MOK_IMPL_ALL(m)                                         \
    m.impl("route_topk", &route_topk);                          \
    m.impl("route_topk_backward", &route_topk_backward);        \
    m.impl("moe_plan", &moe_plan);                              \
    m.impl("gather_rows", &gather_rows);                        \
    m.impl("combine", &combine);                                \
    m.impl("combine_weight_grad", &combine_weight_grad);        \
    m.impl("swiglu", &swiglu);                                  \
    m.impl("swiglu_backward", &swiglu_backward);                \
    m.impl("swiglu_scaled_backward", &swiglu_scaled_backward);  \
    m.impl("grouped_mm", &grouped_mm);                          \
    m.impl("grouped_mm_swiglu", &grouped_mm_swiglu);            \
    m.impl("grouped_mm_wgrad", &grouped_mm_wgrad);                \
    m.impl("grouped_mm_gate_up_dgrad", &grouped_mm_gate_up_dgrad); \
    m.impl("grouped_mm_gate_up_wgrad", &grouped_mm_gate_up_wgrad); \
    m.impl("grouped_mm_mxfp8_a", &grouped_mm_mxfp8_a);            \
    m.impl("grouped_mm_swiglu_mxfp8_a", &grouped_mm_swiglu_mxfp8_a)

TORCH_LIBRARY_IMPL(mok, CPU, m) { MOK_IMPL_ALL(m); }

#ifdef MOK_WITH_CUDA
TORCH_LIBRARY_IMPL(mok, CUDA, m) { MOK_IMPL_ALL(m); }
#endif

}  // namespace mok
