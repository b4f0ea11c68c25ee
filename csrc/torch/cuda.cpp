// CUDA implementations: tensors -> mok_<op>_args, current stream, launch. Nothing here
// synchronises with the host. Errors that only the device can see (an expert id out of range)
// go to a host-mapped error word that Python reads without a sync (mok._errors).
#ifdef MOK_WITH_CUDA

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <mutex>

#include "../cuda/gemm/grouped_gemm_sm90.h"
#include "../cuda/mok_cuda.h"
#include "../cuda/mok_qdq_cuda.h"
#include "backend.h"
#include "checks.h"

namespace mok {
namespace cuda {
namespace {

const int32_t* opt_idx_ptr(const c10::optional<at::Tensor>& t) {
    return t.has_value() ? t->data_ptr<int32_t>() : nullptr;
}
const void* opt_ptr(const c10::optional<at::Tensor>& t) { return t.has_value() ? t->data_ptr() : nullptr; }

cudaStream_t stream_of(const at::Tensor& t) { return at::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

int num_sms(const at::Tensor& t) { return at::cuda::getDeviceProperties(t.device().index())->multiProcessorCount; }

}  // namespace

// The process-wide device error word: pinned host memory, written by kernels through its UVA
// address, read by the host with no synchronisation.
int32_t* device_error_word() {
    static int32_t* word = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        void* p = nullptr;
        if (cudaHostAlloc(&p, sizeof(int32_t), cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess) {
            word = static_cast<int32_t*>(p);
            *word = 0;
        } else {
            (void)cudaGetLastError();
        }
    });
    return word;
}

void route_topk(const at::Tensor& logits, const c10::optional<at::Tensor>& bias, int64_t score_func,
                int64_t n_group, int64_t topk_group, bool renormalize, double scaling, at::Tensor& topk_idx,
                at::Tensor& topk_w) {
    c10::cuda::CUDAGuard guard(logits.device());
    mok_route_topk_args a{};
    a.logits = logits.data_ptr();
    a.bias = opt_ptr(bias);
    a.dtype = to_mok_dtype(logits, "mok.route_topk", "logits");
    a.T = logits.size(0);
    a.E = logits.size(1);
    a.K = topk_idx.size(1);
    a.score_func = (int)score_func;
    a.n_group = n_group;
    a.topk_group = topk_group;
    a.renormalize = renormalize;
    a.scaling = scaling;
    a.topk_idx = topk_idx.data_ptr<int32_t>();
    a.topk_w = topk_w.data_ptr();
    check_status(mok_route_topk_cuda(&a, stream_of(logits)), "mok.route_topk");
}

void route_topk_backward(const at::Tensor& grad_w, const at::Tensor& logits, const at::Tensor& topk_idx,
                         int64_t score_func, bool renormalize, double scaling, at::Tensor& grad_logits) {
    c10::cuda::CUDAGuard guard(logits.device());
    mok_route_topk_backward_args a{};
    a.grad_w = grad_w.data_ptr();
    a.logits = logits.data_ptr();
    a.topk_idx = topk_idx.data_ptr<int32_t>();
    a.dtype = to_mok_dtype(logits, "mok.route_topk_backward", "logits");
    a.T = logits.size(0);
    a.E = logits.size(1);
    a.K = topk_idx.size(1);
    a.score_func = (int)score_func;
    a.renormalize = renormalize;
    a.scaling = scaling;
    a.grad_logits = grad_logits.data_ptr();
    check_status(mok_route_topk_backward_cuda(&a, stream_of(logits)), "mok.route_topk_backward");
}

void moe_plan(const at::Tensor& topk_idx, int64_t num_experts, int64_t tile, bool skip_invalid, at::Tensor& counts,
              at::Tensor& offsets, at::Tensor& row_of, at::Tensor& src_of_row, at::Tensor& num_skipped) {
    c10::cuda::CUDAGuard guard(topk_idx.device());
    const int64_t T = topk_idx.size(0), K = topk_idx.size(1);
    // The scratch comes from the caching allocator, so this is capture-safe.
    auto workspace = at::empty({(int64_t)mok_plan_workspace_bytes(T, K, num_experts)},
                               topk_idx.options().dtype(at::kByte));
    mok_plan_build_args a{};
    a.topk_idx = topk_idx.data_ptr<int32_t>();
    a.T = T;
    a.K = K;
    a.E = num_experts;
    a.tile = tile;
    a.capacity = src_of_row.size(0);
    a.skip_invalid = skip_invalid;
    a.counts = counts.data_ptr<int32_t>();
    a.offsets = offsets.data_ptr<int32_t>();
    a.row_of = row_of.data_ptr<int32_t>();
    a.src_of_row = src_of_row.data_ptr<int32_t>();
    a.num_skipped = num_skipped.data_ptr<int32_t>();
    a.workspace = workspace.data_ptr();
    a.error_flag = device_error_word();
    check_status(mok_plan_build_cuda(&a, stream_of(topk_idx)), "mok.moe_plan");
}

void gather_rows(const at::Tensor& x, const at::Tensor& src_of_row, const c10::optional<at::Tensor>& w,
                 int64_t top_k, const c10::optional<at::Tensor>& row_of, at::Tensor& out) {
    c10::cuda::CUDAGuard guard(x.device());
    mok_gather_rows_args a{};
    a.x = x.data_ptr();
    a.dtype = to_mok_dtype(x, "mok.gather_rows", "x");
    a.T = x.size(0);
    a.H = x.size(1);
    a.K = top_k;
    a.R = out.size(0);
    a.src_of_row = src_of_row.data_ptr<int32_t>();
    a.w = opt_ptr(w);
    a.out = out.data_ptr();
    a.row_of = row_of.has_value() ? row_of->data_ptr<int32_t>() : nullptr;
    check_status(mok_gather_rows_cuda(&a, stream_of(x)), "mok.gather_rows");
}

void combine(const at::Tensor& rows, const at::Tensor& row_of, const c10::optional<at::Tensor>& w, at::Tensor& y) {
    c10::cuda::CUDAGuard guard(rows.device());
    mok_combine_args a{};
    a.rows = rows.data_ptr();
    a.dtype = to_mok_dtype(rows, "mok.combine", "rows");
    a.R = rows.size(0);
    a.H = rows.size(1);
    a.T = row_of.size(0);
    a.K = row_of.size(1);
    a.row_of = row_of.data_ptr<int32_t>();
    a.w = opt_ptr(w);
    a.y = y.data_ptr();
    check_status(mok_combine_cuda(&a, stream_of(rows)), "mok.combine");
}

void combine_weight_grad(const at::Tensor& dy, const at::Tensor& rows, const at::Tensor& row_of, at::Tensor& d_w) {
    c10::cuda::CUDAGuard guard(rows.device());
    mok_combine_weight_grad_args a{};
    a.dy = dy.data_ptr();
    a.rows = rows.data_ptr();
    a.dtype = to_mok_dtype(rows, "mok.combine_weight_grad", "rows");
    a.R = rows.size(0);
    a.H = rows.size(1);
    a.T = row_of.size(0);
    a.K = row_of.size(1);
    a.row_of = row_of.data_ptr<int32_t>();
    a.d_w = d_w.data_ptr();
    check_status(mok_combine_weight_grad_cuda(&a, stream_of(rows)), "mok.combine_weight_grad");
}

void swiglu(const at::Tensor& h, at::Tensor& act) {
    c10::cuda::CUDAGuard guard(h.device());
    mok_swiglu_args a{};
    a.h = h.data_ptr();
    a.dtype = to_mok_dtype(h, "mok.swiglu", "h");
    a.R = h.size(0);
    a.I = act.size(1);
    a.out = act.data_ptr();
    check_status(mok_swiglu_forward_cuda(&a, stream_of(h)), "mok.swiglu");
}

void swiglu_backward(const at::Tensor& h, const at::Tensor& d_act, at::Tensor& d_h) {
    c10::cuda::CUDAGuard guard(h.device());
    mok_swiglu_args a{};
    a.h = h.data_ptr();
    a.d_act = d_act.data_ptr();
    a.dtype = to_mok_dtype(h, "mok.swiglu_backward", "h");
    a.R = h.size(0);
    a.I = d_act.size(1);
    a.out = d_h.data_ptr();
    check_status(mok_swiglu_backward_cuda(&a, stream_of(h)), "mok.swiglu_backward");
}

void swiglu_scaled_backward(const at::Tensor& h, const at::Tensor& d_z, const at::Tensor& src_of_row,
                            const at::Tensor& w, at::Tensor& d_h, at::Tensor& z, at::Tensor& d_s) {
    c10::cuda::CUDAGuard guard(h.device());
    mok_swiglu_scaled_backward_args a{};
    a.h = h.data_ptr();
    a.d_z = d_z.data_ptr();
    a.dtype = to_mok_dtype(h, "mok.swiglu_scaled_backward", "h");
    a.R = h.size(0);
    a.I = d_z.size(1);
    a.src_of_row = src_of_row.data_ptr<int32_t>();
    a.w = w.data_ptr();
    a.n_pairs = w.numel();
    a.d_h = d_h.data_ptr();
    a.z = z.data_ptr();
    a.d_s = d_s.data_ptr();
    check_status(mok_swiglu_scaled_backward_cuda(&a, stream_of(h)), "mok.swiglu_scaled_backward");
}

namespace {
mok_grouped_gemm_args grouped_mm_args(const at::Tensor& a, const c10::optional<at::Tensor>& a_gather,
                                      int64_t a_gather_div, const at::Tensor& b, const at::Tensor& offsets,
                                      bool trans_b, at::Tensor& out, at::Tensor* swiglu_out) {
    mok_grouped_gemm_args g{};
    g.a = a.data_ptr();
    g.a_gather = opt_idx_ptr(a_gather);
    g.a_gather_div = a_gather_div;
    g.b = b.data_ptr();
    g.dtype = to_mok_dtype(a, "mok.grouped_mm", "a");
    g.offsets = offsets.data_ptr<int32_t>();
    g.R = out.size(0);
    g.E = b.size(0);
    g.N = out.size(1);
    g.Kd = trans_b ? b.size(2) : b.size(1);
    g.trans_b = trans_b;
    g.out = out.data_ptr();
    g.swiglu_out = swiglu_out ? swiglu_out->data_ptr() : nullptr;
    g.num_sms = num_sms(a);
    return g;
}
}  // namespace

void grouped_mm(const at::Tensor& a, const c10::optional<at::Tensor>& a_gather, int64_t a_gather_div,
                const at::Tensor& b, const at::Tensor& offsets, bool trans_b, at::Tensor& out,
                at::Tensor* swiglu_out, const at::Tensor* b_second) {
    c10::cuda::CUDAGuard guard(a.device());
    // NT and NN both run as they are: the sm_90a kernel reads an N-major B (the dgrad GEMMs'
    // weights [E, K, N]) as MN-major wgmma operands, no transposed copy.
    mok_grouped_gemm_args g = grouped_mm_args(a, a_gather, a_gather_div, b, offsets, trans_b, out, swiglu_out);
    if (b_second) {
        // Split weights: the sm_90a kernel reads both halves where they are; elsewhere (the SIMT
        // kernel, other dtypes) they are concatenated first.
        g.b_second = b_second->data_ptr();
        if (!trans_b) g.Kd *= 2;
        if (!mok_grouped_gemm_sm90_supported(&g)) {
            grouped_mm(a, a_gather, a_gather_div, at::cat({b, *b_second}, 1), offsets, trans_b, out, swiglu_out);
            return;
        }
    }
    check_status(mok_grouped_gemm_cuda(&g, stream_of(a)), "mok.grouped_mm");
}

std::tuple<at::Tensor, at::Tensor> qdq_mxfp8(const at::Tensor& x, int64_t M, const c10::optional<at::Tensor>& offsets,
                                             int64_t E, bool rows, bool cols, const char* op, const at::Tensor* src_of_row,
                                             const c10::optional<at::Tensor>& w, int64_t top_k) {
    const int64_t N = x.size(1);
    auto y_rows = at::empty({rows ? M : 0, N}, x.options());
    auto y_cols = at::empty({cols ? M : 0, N}, x.options());
    if (M == 0 || N == 0) return {y_rows, y_cols};
    c10::cuda::CUDAGuard guard(x.device());
    mok_qdq_mxfp8_args a{};
    a.x = x.data_ptr();
    a.M = M;
    a.N = N;
    a.rows = rows ? y_rows.data_ptr() : nullptr;
    a.cols = cols ? y_cols.data_ptr() : nullptr;
    a.offsets = cols && offsets.has_value() ? offsets->data_ptr<int32_t>() : nullptr;
    a.E = E;
    a.error_flag = device_error_word();
    if (src_of_row) {
        a.src_of_row = src_of_row->data_ptr<int32_t>();
        a.w = w.has_value() ? w->data_ptr<float>() : nullptr;
        a.T = x.size(0);
        a.K = top_k;
    }
    check_status(mok_qdq_mxfp8_cuda(&a, stream_of(x)), op);
    return {y_rows, y_cols};
}

// The sm_90a kernel qdq's A's rows as they arrive, for the variants it builds (SwiGLU with gathered
// rows, plain with contiguous rows); elsewhere the row-wise copy is made first (the qdq kernel, which
// gathers the rows itself), then the plain GEMM: the same bits.
void grouped_mm_mxfp8_a(const at::Tensor& a, const c10::optional<at::Tensor>& a_gather, int64_t a_gather_div,
                        const at::Tensor& b, const at::Tensor& offsets, bool trans_b, at::Tensor& out,
                        at::Tensor* swiglu_out) {
    const char* op = swiglu_out ? "mok.grouped_mm_swiglu_mxfp8_a" : "mok.grouped_mm_mxfp8_a";
    c10::cuda::CUDAGuard guard(a.device());
    mok_grouped_gemm_args g = grouped_mm_args(a, a_gather, a_gather_div, b, offsets, trans_b, out, swiglu_out);
    g.qdq_a_mxfp8 = 1;
    if (mok_grouped_gemm_sm90_supported(&g)) {
        check_status(mok_grouped_gemm_cuda(&g, stream_of(a)), op);
        return;
    }
    const at::Tensor q = std::get<0>(qdq_mxfp8(a, out.size(0), c10::nullopt, 0, true, false, op,
                                               a_gather.has_value() ? &*a_gather : nullptr, c10::nullopt, a_gather_div));
    grouped_mm(q, c10::nullopt, 1, b, offsets, trans_b, out, swiglu_out);
}

void grouped_mm_wgrad(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& b_gather,
                      int64_t b_gather_div, const at::Tensor& offsets, at::Tensor& out, at::Tensor* out_second) {
    c10::cuda::CUDAGuard guard(a.device());
    const int64_t R = a.size(0), E = out.size(0), M = a.size(1), N = out.size(2);
    // TMA reads 16-byte aligned rows (a gathered copy of b is a fresh, aligned allocation).
    const uintptr_t b_addr = b_gather.has_value() ? 0 : reinterpret_cast<uintptr_t>(b.data_ptr());
    const bool aligned = (reinterpret_cast<uintptr_t>(a.data_ptr()) | b_addr) % 16 == 0;
    const bool planes_ok = !out_second || mok_sm90_planes_ok(out.data_ptr(), out_second->data_ptr());
    const bool sm90 = a.scalar_type() == at::kBFloat16 && aligned && planes_ok &&
                      mok_grouped_gemm_wgrad_sm90_supported(R, E, M, N, out_second != nullptr);
    if (out_second && !sm90) {
        // Split output where the kernel cannot write the halves in place: the whole result, then
        // its halves copied out.
        into_halves(out, *out_second,
                    [&](at::Tensor& whole) { grouped_mm_wgrad(a, b, b_gather, b_gather_div, offsets, whole); });
        return;
    }
    if (sm90) {
        // The sm_90a kernel contracts over rows with both operands read as they are (MN-major);
        // gathered b rows are first gathered into the row space (one pass).
        at::Tensor rows = b;
        if (b_gather.has_value()) {
            rows = at::empty({R, N}, b.options());
            gather_rows(b, *b_gather, c10::nullopt, b_gather_div, c10::nullopt, rows);
        }
        check_status(mok_grouped_gemm_wgrad_sm90(a.data_ptr(), rows.data_ptr(), offsets.data_ptr<int32_t>(), R, E, M,
                                                 N, out.data_ptr(), out_second ? out_second->data_ptr() : nullptr,
                                                 num_sms(a), stream_of(a)),
                     "mok.grouped_mm_wgrad");
        return;
    }
    mok_grouped_gemm_wgrad_args g{};
    g.a = a.data_ptr();
    g.b = b.data_ptr();
    g.b_gather = opt_idx_ptr(b_gather);
    g.b_gather_div = b_gather_div;
    g.dtype = to_mok_dtype(a, "mok.grouped_mm_wgrad", "a");
    g.offsets = offsets.data_ptr<int32_t>();
    g.R = a.size(0);
    g.E = out.size(0);
    g.M = out.size(1);
    g.N = out.size(2);
    g.out = out.data_ptr();
    g.num_sms = num_sms(a);
    check_status(mok_grouped_gemm_wgrad_cuda(&g, stream_of(a)), "mok.grouped_mm_wgrad");
}

}  // namespace cuda
}  // namespace mok

#endif  // MOK_WITH_CUDA
