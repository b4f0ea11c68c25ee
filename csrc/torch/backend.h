// The compute half of every op, once per device kind. ops.cpp checks arguments and allocates the
// outputs, then calls mok::cpu::<op> (cpu.cpp, the C core) or mok::cuda::<op> (cuda.cpp, the
// launchers in csrc/cuda). Inputs here are already checked; outputs are allocated and contiguous.
// Split weights (torchtitan's w1 and w3 as two tensors): grouped_mm's b_second is the second half
// of B (the up rows [E, N / 2, K] beside the gate rows in b, NT with SwiGLU; rows [K / 2, K) of an
// NN b [E, K / 2, N]); grouped_mm_wgrad's out_second receives rows [M / 2, M) of each expert's
// result, out then [E, M / 2, N]. Both mean exactly the concatenated operand; a backend whose
// kernel cannot read or write the halves in place concatenates or splits with a copy.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace mok {

// A split output (out_second) made where a kernel writes only one: compute(whole) fills [E, 2 Mh, N], then its
// rows [0, Mh) are copied into first and [Mh, 2 Mh) into second (both [E, Mh, N]).
template <typename Compute>
void into_halves(at::Tensor& first, at::Tensor& second, Compute&& compute) {
    const int64_t Mh = first.size(1);
    auto whole = at::empty({first.size(0), 2 * Mh, first.size(2)}, first.options());
    compute(whole);
    first.copy_(whole.narrow(1, 0, Mh));
    second.copy_(whole.narrow(1, Mh, Mh));
}

#define MOK_BACKEND_DECLS                                                                                             \
    void route_topk(const at::Tensor& logits, const c10::optional<at::Tensor>& bias, int64_t score_func,             \
                    int64_t n_group, int64_t topk_group, bool renormalize, double scaling, at::Tensor& topk_idx,      \
                    at::Tensor& topk_w);                                                                              \
    void route_topk_backward(const at::Tensor& grad_w, const at::Tensor& logits, const at::Tensor& topk_idx,          \
                             int64_t score_func, bool renormalize, double scaling, at::Tensor& grad_logits);          \
    void moe_plan(const at::Tensor& topk_idx, int64_t num_experts, int64_t tile, bool skip_invalid,                   \
                  at::Tensor& counts, at::Tensor& offsets, at::Tensor& row_of, at::Tensor& src_of_row,               \
                  at::Tensor& num_skipped);                                                                           \
    void gather_rows(const at::Tensor& x, const at::Tensor& src_of_row, const c10::optional<at::Tensor>& w,           \
                     int64_t top_k, const c10::optional<at::Tensor>& row_of, at::Tensor& out);                        \
    void combine(const at::Tensor& rows, const at::Tensor& row_of, const c10::optional<at::Tensor>& w,                \
                 at::Tensor& y);                                                                                      \
    void combine_weight_grad(const at::Tensor& dy, const at::Tensor& rows, const at::Tensor& row_of, at::Tensor& d_w); \
    void swiglu(const at::Tensor& h, at::Tensor& act);                                                                \
    void swiglu_backward(const at::Tensor& h, const at::Tensor& d_act, at::Tensor& d_h);                              \
    void swiglu_scaled_backward(const at::Tensor& h, const at::Tensor& d_z, const at::Tensor& src_of_row,              \
                                const at::Tensor& w, at::Tensor& d_h, at::Tensor& z, at::Tensor& d_s);                \
    void grouped_mm(const at::Tensor& a, const c10::optional<at::Tensor>& a_gather, int64_t a_gather_div,             \
                    const at::Tensor& b, const at::Tensor& offsets, bool trans_b, at::Tensor& out,                    \
                    at::Tensor* swiglu_out, const at::Tensor* b_second = nullptr);                                    \
    void grouped_mm_wgrad(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& b_gather,        \
                          int64_t b_gather_div, const at::Tensor& offsets, at::Tensor& out,                           \
                          at::Tensor* out_second = nullptr);                                                          \
    void grouped_mm_mxfp8_a(const at::Tensor& a, const c10::optional<at::Tensor>& a_gather, int64_t a_gather_div,     \
                            const at::Tensor& b, const at::Tensor& offsets, bool trans_b, at::Tensor& out,            \
                            at::Tensor* swiglu_out);

namespace cpu {
MOK_BACKEND_DECLS
}  // namespace cpu

#ifdef MOK_WITH_CUDA
namespace cuda {
MOK_BACKEND_DECLS
// The process-wide host-mapped word that kernels OR error bits into (MOK_DEVICE_ERR_*); may be null.
int32_t* device_error_word();
// MXFP8 qdq of bf16 x's M rows (or, with src_of_row, of the plan's rows gathered from x [T, N], top_k
// rows per token, weighted by w when given): the row-wise copy when `rows`, the column-wise one with
// expert segments when `cols`; a copy not asked for is an empty [0, N] tensor. Shared by the qdq ops
// and the GEMMs that make A's row-wise copy first where their kernel cannot round it on load.
std::tuple<at::Tensor, at::Tensor> qdq_mxfp8(const at::Tensor& x, int64_t M, const c10::optional<at::Tensor>& offsets,
                                             int64_t E, bool rows, bool cols, const char* op,
                                             const at::Tensor* src_of_row = nullptr,
                                             const c10::optional<at::Tensor>& w = c10::nullopt, int64_t top_k = 1);
}  // namespace cuda
#endif

#undef MOK_BACKEND_DECLS

}  // namespace mok
