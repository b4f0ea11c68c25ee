// CPU implementations: thin calls into the C core (csrc/core), split over threads with
// at::parallel_for where rows (or experts) are independent. Splitting never changes a reduction
// order, so results do not depend on the thread count.
#include <ATen/Parallel.h>

#include "backend.h"
#include "checks.h"

namespace mok {
namespace cpu {
namespace {

const int32_t* idx_ptr(const at::Tensor& t) { return t.data_ptr<int32_t>(); }
const int32_t* opt_idx_ptr(const c10::optional<at::Tensor>& t) { return t.has_value() ? idx_ptr(*t) : nullptr; }
const void* opt_ptr(const c10::optional<at::Tensor>& t) { return t.has_value() ? t->data_ptr() : nullptr; }

// Rows per parallel task, so that each task does at least ~32k multiply-adds.
int64_t grain(int64_t work_per_item) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_item)); }

}  // namespace

void route_topk(const at::Tensor& logits, const c10::optional<at::Tensor>& bias, int64_t score_func,
                int64_t n_group, int64_t topk_group, bool renormalize, double scaling, at::Tensor& topk_idx,
                at::Tensor& topk_w) {
    const int64_t T = logits.size(0), E = logits.size(1), K = topk_idx.size(1);
    const mok_dtype dt = to_mok_dtype(logits, "mok.route_topk", "logits");
    const size_t elt = logits.element_size();
    at::parallel_for(0, T, grain(E * K), [&](int64_t t0, int64_t t1) {
        int st = mok_route_topk(static_cast<const char*>(logits.data_ptr()) + t0 * E * elt, opt_ptr(bias), dt, t1 - t0,
                                E, K, (int)score_func, n_group, topk_group, renormalize, scaling,
                                topk_idx.data_ptr<int32_t>() + t0 * K,
                                static_cast<char*>(topk_w.data_ptr()) + t0 * K * elt);
        check_status(st, "mok.route_topk");
    });
}

void route_topk_backward(const at::Tensor& grad_w, const at::Tensor& logits, const at::Tensor& topk_idx,
                         int64_t score_func, bool renormalize, double scaling, at::Tensor& grad_logits) {
    const int64_t T = logits.size(0), E = logits.size(1), K = topk_idx.size(1);
    const mok_dtype dt = to_mok_dtype(logits, "mok.route_topk_backward", "logits");
    const size_t elt = logits.element_size();
    at::parallel_for(0, T, grain(E * K), [&](int64_t t0, int64_t t1) {
        int st = mok_route_topk_backward(static_cast<const char*>(grad_w.data_ptr()) + t0 * K * elt,
                                         static_cast<const char*>(logits.data_ptr()) + t0 * E * elt,
                                         idx_ptr(topk_idx) + t0 * K, dt, t1 - t0, E, K, (int)score_func, renormalize,
                                         scaling, static_cast<char*>(grad_logits.data_ptr()) + t0 * E * elt);
        check_status(st, "mok.route_topk_backward");
    });
}

void moe_plan(const at::Tensor& topk_idx, int64_t num_experts, int64_t tile, bool skip_invalid, at::Tensor& counts,
              at::Tensor& offsets, at::Tensor& row_of, at::Tensor& src_of_row, at::Tensor& num_skipped) {
    int st = mok_plan_build(idx_ptr(topk_idx), topk_idx.size(0), topk_idx.size(1), num_experts, tile,
                            src_of_row.size(0), skip_invalid, counts.data_ptr<int32_t>(), offsets.data_ptr<int32_t>(),
                            row_of.data_ptr<int32_t>(), src_of_row.data_ptr<int32_t>(),
                            num_skipped.data_ptr<int32_t>());
    check_status(st, "mok.moe_plan");
}

// row_of (the inverse map) only speeds up the CUDA kernel; the result does not depend on it.
void gather_rows(const at::Tensor& x, const at::Tensor& src_of_row, const c10::optional<at::Tensor>& w,
                 int64_t top_k, const c10::optional<at::Tensor>& /*row_of*/, at::Tensor& out) {
    const mok_dtype dt = to_mok_dtype(x, "mok.gather_rows", "x");
    const int64_t R = out.size(0), H = x.size(1);
    at::parallel_for(0, R, grain(H), [&](int64_t r0, int64_t r1) {
        int st = mok_gather_rows(x.data_ptr(), dt, x.size(0), H, top_k, idx_ptr(src_of_row), opt_ptr(w), r0, r1,
                                 out.data_ptr());
        check_status(st, "mok.gather_rows");
    });
}

void combine(const at::Tensor& rows, const at::Tensor& row_of, const c10::optional<at::Tensor>& w, at::Tensor& y) {
    const mok_dtype dt = to_mok_dtype(rows, "mok.combine", "rows");
    const int64_t T = row_of.size(0), K = row_of.size(1), H = rows.size(1);
    at::parallel_for(0, T, grain(H * K), [&](int64_t t0, int64_t t1) {
        int st = mok_combine(rows.data_ptr(), dt, rows.size(0), H, idx_ptr(row_of), opt_ptr(w), K, t0, t1,
                             y.data_ptr());
        check_status(st, "mok.combine");
    });
}

void combine_weight_grad(const at::Tensor& dy, const at::Tensor& rows, const at::Tensor& row_of, at::Tensor& d_w) {
    const mok_dtype dt = to_mok_dtype(rows, "mok.combine_weight_grad", "rows");
    const int64_t T = row_of.size(0), K = row_of.size(1), H = rows.size(1);
    at::parallel_for(0, T, grain(H * K), [&](int64_t t0, int64_t t1) {
        int st = mok_combine_weight_grad(dy.data_ptr(), rows.data_ptr(), dt, H, idx_ptr(row_of), K, t0, t1,
                                         d_w.data_ptr());
        check_status(st, "mok.combine_weight_grad");
    });
}

void swiglu(const at::Tensor& h, at::Tensor& act) {
    const mok_dtype dt = to_mok_dtype(h, "mok.swiglu", "h");
    const int64_t I = act.size(1);
    at::parallel_for(0, h.size(0), grain(I), [&](int64_t r0, int64_t r1) {
        check_status(mok_swiglu_forward(h.data_ptr(), dt, I, r0, r1, act.data_ptr()), "mok.swiglu");
    });
}

void swiglu_backward(const at::Tensor& h, const at::Tensor& d_act, at::Tensor& d_h) {
    const mok_dtype dt = to_mok_dtype(h, "mok.swiglu_backward", "h");
    const int64_t I = d_act.size(1);
    at::parallel_for(0, h.size(0), grain(I), [&](int64_t r0, int64_t r1) {
        check_status(mok_swiglu_backward(h.data_ptr(), d_act.data_ptr(), dt, I, r0, r1, d_h.data_ptr()),
                     "mok.swiglu_backward");
    });
}

void swiglu_scaled_backward(const at::Tensor& h, const at::Tensor& d_z, const at::Tensor& src_of_row,
                            const at::Tensor& w, at::Tensor& d_h, at::Tensor& z, at::Tensor& d_s) {
    const char* op = "mok.swiglu_scaled_backward";
    const mok_dtype dt = to_mok_dtype(h, op, "h");
    const int64_t I = d_z.size(1);
    const int32_t* src = idx_ptr(src_of_row);
    for (int64_t r = 0; r < src_of_row.numel(); ++r) {
        TORCH_CHECK_VALUE(src[r] < w.numel(), op, ": src_of_row[", r, "] = ", src[r], " is not a pair of w (",
                          w.numel(), " pairs)");
    }
    at::parallel_for(0, h.size(0), grain(I), [&](int64_t r0, int64_t r1) {
        check_status(mok_swiglu_scaled_backward(h.data_ptr(), d_z.data_ptr(), dt, I, idx_ptr(src_of_row), w.data_ptr(),
                                                w.numel(), r0, r1, d_h.data_ptr(), z.data_ptr(), d_s.data_ptr()),
                     op);
    });
}

void grouped_mm(const at::Tensor& a, const c10::optional<at::Tensor>& a_gather, int64_t a_gather_div,
                const at::Tensor& b, const at::Tensor& offsets, bool trans_b, at::Tensor& out, at::Tensor* swiglu_out,
                const at::Tensor* b_second) {
    if (b_second) { /* the C core reads one B: the halves concatenated */
        grouped_mm(a, a_gather, a_gather_div, at::cat({b, *b_second}, 1), offsets, trans_b, out, swiglu_out);
        return;
    }
    const mok_dtype dt = to_mok_dtype(a, "mok.grouped_mm", "a");
    const int64_t R = out.size(0), N = out.size(1), E = b.size(0);
    const int64_t Kd = trans_b ? b.size(2) : b.size(1);
    at::parallel_for(0, R, grain(N * Kd), [&](int64_t r0, int64_t r1) {
        int st = mok_grouped_gemm(a.data_ptr(), opt_idx_ptr(a_gather), a_gather_div, b.data_ptr(), dt,
                                  idx_ptr(offsets), E, N, Kd, trans_b, r0, r1, out.data_ptr());
        check_status(st, "mok.grouped_mm");
        if (swiglu_out)
            check_status(mok_swiglu_forward(out.data_ptr(), dt, N / 2, r0, r1, swiglu_out->data_ptr()),
                         "mok.grouped_mm_swiglu");
    });
}

// The definition, in three passes: the gathered rows, their row-wise MXFP8 qdq (the C core), the GEMM.
void grouped_mm_mxfp8_a(const at::Tensor& a, const c10::optional<at::Tensor>& a_gather, int64_t a_gather_div,
                        const at::Tensor& b, const at::Tensor& offsets, bool trans_b, at::Tensor& out,
                        at::Tensor* swiglu_out) {
    const char* op = swiglu_out ? "mok.grouped_mm_swiglu_mxfp8_a" : "mok.grouped_mm_mxfp8_a";
    const int64_t R = out.size(0), Kd = a.size(1);
    at::Tensor rows = a;
    if (a_gather.has_value()) {
        rows = at::empty({R, Kd}, a.options());
        gather_rows(a, *a_gather, c10::nullopt, a_gather_div, c10::nullopt, rows);
    }
    auto q = at::empty({R, Kd}, a.options());
    const auto* xp = reinterpret_cast<const uint16_t*>(rows.data_ptr());
    auto* qp = reinterpret_cast<uint16_t*>(q.data_ptr());
    at::parallel_for(0, R, grain(Kd), [&](int64_t r0, int64_t r1) {
        check_status(mok_qdq_mxfp8_rows(xp, R, Kd, r0, r1, qp), op);
    });
    grouped_mm(q, c10::nullopt, 1, b, offsets, trans_b, out, swiglu_out);
}

void grouped_mm_wgrad(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& b_gather,
                      int64_t b_gather_div, const at::Tensor& offsets, at::Tensor& out, at::Tensor* out_second) {
    if (out_second) { /* the C core writes one output: split it after */
        into_halves(out, *out_second,
                    [&](at::Tensor& whole) { grouped_mm_wgrad(a, b, b_gather, b_gather_div, offsets, whole); });
        return;
    }
    const mok_dtype dt = to_mok_dtype(a, "mok.grouped_mm_wgrad", "a");
    const int64_t E = out.size(0), M = out.size(1), N = out.size(2);
    at::parallel_for(0, E, 1, [&](int64_t e0, int64_t e1) {
        int st = mok_grouped_gemm_wgrad(a.data_ptr(), b.data_ptr(), opt_idx_ptr(b_gather), b_gather_div, dt,
                                        idx_ptr(offsets), M, N, e0, e1, out.data_ptr());
        check_status(st, "mok.grouped_mm_wgrad");
    });
}

}  // namespace cpu
}  // namespace mok
