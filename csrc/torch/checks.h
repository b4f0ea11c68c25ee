// Argument checks and shape rules shared by the CPU and CUDA implementations of every mok op.
// Each check names the argument and what was expected, so a user sees "mok.grouped_mm: b must be
// 3-D [E, N, K], got [4, 8]" instead of a crash in a kernel.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "../core/mok_core.h"

namespace mok {

inline std::string shape_str(const at::Tensor& t) {
    std::string s = "[";
    for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + "]";
}

inline mok_dtype to_mok_dtype(const at::Tensor& t, const char* op, const char* name) {
    switch (t.scalar_type()) {
        case at::kFloat: return MOK_F32;
        case at::kDouble: return MOK_F64;
        case at::kBFloat16: return MOK_BF16;
        case at::kHalf: return MOK_F16;
        default: break;
    }
    TORCH_CHECK_VALUE(false, op, ": ", name, " must be bfloat16, float16, float32 or float64, got ", t.scalar_type());
}

// The dtype of weights that go with data of dtype t: float32, or float64 for float64 data.
inline at::ScalarType acc_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

inline void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* name, const char* layout) {
    TORCH_CHECK_VALUE(t.dim() == dim, op, ": ", name, " must be ", dim, "-D ", layout, ", got shape ", shape_str(t));
}

inline void check_contiguous(const at::Tensor& t, const char* op, const char* name) {
    TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous (row-major), got strides ", t.strides());
}

inline void check_dtype(const at::Tensor& t, at::ScalarType want, const char* op, const char* name) {
    TORCH_CHECK_VALUE(t.scalar_type() == want, op, ": ", name, " must be ", want, ", got ", t.scalar_type());
}

inline void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* name,
                              const char* ref_name) {
    TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", name, " must be on the device of ", ref_name, " (",
                      ref.device(), "), got ", t.device());
}

// The up rows of a gate / up weight held as two tensors (torchtitan's w3 beside w1): the gate's
// shape, dtype and device, contiguous.
inline void check_up(const at::Tensor& up, const at::Tensor& gate, const char* op, const char* gate_name) {
    check_dim(up, 3, op, "up", "[E, I, H] (the up rows)");
    check_contiguous(up, op, "up");
    TORCH_CHECK_VALUE(up.scalar_type() == gate.scalar_type(), op, ": up must have ", gate_name, "'s dtype ",
                      gate.scalar_type(), ", got ", up.scalar_type());
    check_same_device(up, gate, op, "up", gate_name);
    TORCH_CHECK_VALUE(up.sizes() == gate.sizes(), op, ": up must have the shape of ", gate_name, " ", shape_str(gate),
                      " (the gate rows), got shape ", shape_str(up));
}

inline void check_size(const at::Tensor& t, int64_t dim, int64_t want, const char* op, const char* name,
                       const char* what) {
    TORCH_CHECK_VALUE(t.size(dim) == want, op, ": ", name, ".shape[", dim, "] must be ", want, " (", what, "), got shape ",
                      shape_str(t));
}

// A contiguous index tensor of int32 on the device of ref.
inline void check_index(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* name) {
    check_dtype(t, at::kInt, op, name);
    check_contiguous(t, op, name);
    check_same_device(t, ref, op, name, "the data");
}

// Optional routing weights w [T, K] in the accumulation type of data (gather_rows, combine and the ops
// built on them).
inline void check_weights(const c10::optional<at::Tensor>& w, const at::Tensor& data, int64_t T, int64_t K,
                          const char* op) {
    if (!w.has_value()) return;
    check_dim(*w, 2, op, "w", "[T, K]");
    check_dtype(*w, acc_dtype(data.scalar_type()), op, "w");
    check_contiguous(*w, op, "w");
    check_same_device(*w, data, op, "w", "the data");
    check_size(*w, 0, T, op, "w", "tokens");
    check_size(*w, 1, K, op, "w", "top_k");
}

// Throws the error a core/launcher status stands for.
inline void check_status(int status, const char* op) {
    if (status == MOK_OK) return;
    if (status == MOK_ERR_EXPERT_ID)
        TORCH_CHECK_VALUE(false, op, ": topk_idx holds an expert id outside [0, num_experts)");
    if (status < 0) TORCH_CHECK(false, op, ": ", mok_status_string(status));
    TORCH_CHECK(false, op, ": CUDA error ", status, " at launch");
}

// ---- shapes of each op (one definition used by CPU and CUDA implementations) ----

struct GroupedMMDims {
    int64_t R, E, N, Kd;
};

// a [Ra, Kd]; a_gather [R] or none (then R = Ra); b [E, N, Kd] (trans_b) or [E, Kd, N]; offsets [E + 1].
inline GroupedMMDims check_grouped_mm(const char* op, const at::Tensor& a, const c10::optional<at::Tensor>& a_gather,
                                      int64_t a_gather_div, const at::Tensor& b, const at::Tensor& offsets,
                                      bool trans_b) {
    check_dim(a, 2, op, "a", "[rows, K]");
    check_dim(b, 3, op, "b", trans_b ? "[E, N, K]" : "[E, K, N]");
    check_contiguous(a, op, "a");
    check_contiguous(b, op, "b");
    TORCH_CHECK_VALUE(a.scalar_type() == b.scalar_type(), op, ": a and b must have the same dtype, got ",
                      a.scalar_type(), " and ", b.scalar_type());
    to_mok_dtype(a, op, "a");
    check_same_device(b, a, op, "b", "a");
    check_index(offsets, a, op, "offsets");
    check_dim(offsets, 1, op, "offsets", "[E + 1]");
    GroupedMMDims d;
    d.E = b.size(0);
    d.N = trans_b ? b.size(1) : b.size(2);
    d.Kd = trans_b ? b.size(2) : b.size(1);
    check_size(offsets, 0, d.E + 1, op, "offsets", "number of experts + 1");
    check_size(a, 1, d.Kd, op, "a", "the contraction size of b");
    if (a_gather.has_value()) {
        check_index(*a_gather, a, op, "a_gather");
        check_dim(*a_gather, 1, op, "a_gather", "[rows]");
        TORCH_CHECK_VALUE(a_gather_div >= 1, op, ": a_gather_div must be >= 1, got ", a_gather_div);
        d.R = a_gather->size(0);
    } else {
        d.R = a.size(0);
    }
    return d;
}

}  // namespace mok
