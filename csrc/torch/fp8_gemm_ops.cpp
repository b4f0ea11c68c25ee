// FP8 blockwise grouped GEMM ops (no autograd formula; recipe="blockwise" of the layers calls the first
// for the forward GEMMs and, with fp8_dgrad=True, the dgrad GEMMs: mok/_fp8_experts.py):
//
//   grouped_mm_fp8(a [R, K] e4m3, a_scales [R, K/128] f32, b [E, N, K] e4m3,
//                  b_scales [E, N/128, K/128] f32, offsets [E + 1] i32) -> out [R, N] bf16
//
//   out[r, n] = sum_kb a_scales[r, kb] * b_scales[e, n / 128, kb] * sum_{k in block kb} a[r, k] b[e, n, k]
//
// for offsets[e] <= r < offsets[e + 1]; rows outside [offsets[0], offsets[E]) are 0. The operands are
// what mok.fp8.quantize gives ("blockwise_1x128" for a, "blockwise_128x128" for b viewed as
// [E * N, K]). CPU: the C core (mok_grouped_gemm_fp8_blockwise, exact block sums in double). CUDA: the
// sm_90a kernel of csrc/cuda/grouped_gemm_fp8_sm90.cu (fp32 promotion every 128 of K), which also
// needs 128-aligned offsets: a misaligned one is reported through the device error word
// (mok.check_errors raises), since checking it here would synchronise with the GPU.
//
// Its SwiGLU form (GEMM1 of the experts under recipe="blockwise": b's rows are [gate | up], N = 2I):
//
//   grouped_mm_fp8_swiglu(a, a_scales, b, b_scales, offsets) -> (act [R, I] bf16, h [R, 2I] bf16)
//
// h as grouped_mm_fp8 computes it, and act = mok.swiglu(h), bit for bit. CUDA: one kernel, SwiGLU in
// the GEMM's epilogue (no pass over h); CPU: the two ops.
//
// Its weight-gradient form (a K-grouped GEMM; recipe="blockwise" with fp8_wgrad=True calls it for
// both expert weights' gradients):
//
//   grouped_mm_fp8_wgrad(a [M, R] e4m3, a_scales [ceil(R/128), M] f32, b [N, R] e4m3,
//                        b_scales [ceil(R/128), N] f32, offsets [E + 1] i32) -> out [E, M, N] bf16
//
//   out[e, m, n] = sum over rows r in [offsets[e], offsets[e + 1]) of deq(a)[m, r] * deq(b)[n, r]
//
// with deq(a)[m, r] = e4m3(a[m, r]) * a_scales[r / 128, m]: a and b are column-wise copies of x [R, M]
// and [R, N] with their scales stored MN-major (mok.fp8_gemm.quantize_colwise_blockwise: the qt of
// mok.fp8.quantize_rowcol(x, "blockwise_1x128") and its scales_t transposed). b_scales may instead be
// [ceil(R/128), ceil(N/128)]: b quantised in 128 x 128 tiles of its [R, N] source (quantize_rowcol's
// col_recipe="blockwise_128x128"), deq(b)[n, r] = e4m3(b[n, r]) * b_scales[r / 128, n / 128]; the
// kernel's promotion then costs one FFMA per accumulator instead of an FMUL and an FFMA (the two layouts
// differ in shape whenever N > 1, and agree in meaning when N == 1). An expert with no rows gets zeros. CPU: the C core (mok_grouped_gemm_fp8_wgrad_blockwise, any offsets). CUDA: the
// kWgrad variant of the same sm_90a kernel, which needs M and N multiples of 128, R of 16 and
// 128-aligned offsets (a misaligned one: the device error word, as above).
//
// Its gate / up form (torchtitan's w1 and w3 as two tensors, recipe="blockwise" with fp8_wgrad):
//
//   grouped_mm_fp8_gate_up_wgrad(a [2I, R], ...) -> (d_gate [E, I, N], d_up [E, I, N]) bf16
//
// the halves of grouped_mm_fp8_wgrad's out along dim 1, bit for bit; CUDA writes each into its own
// tensor (I a multiple of 64), the CPU splits the whole result with a copy.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#ifdef MOK_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda/mok_fp8_gemm_cuda.h"
#endif

#include "backend.h"

#include "checks.h"

namespace mok {
namespace {

constexpr int64_t kBlock = 128;  // the FP8 scale block (1x128 for a, 128x128 for b)

void check_fp8_operand(const at::Tensor& t, int64_t dim, const char* op, const char* name, const char* layout) {
    check_dim(t, dim, op, name, layout);
    check_dtype(t, at::kFloat8_e4m3fn, op, name);
    check_contiguous(t, op, name);
}

void check_scales(const at::Tensor& s, const at::Tensor& ref, at::IntArrayRef want, const char* op, const char* name,
                  const char* layout, const char* source) {
    check_dim(s, static_cast<int64_t>(want.size()), op, name, layout);
    check_dtype(s, at::kFloat, op, name);
    check_contiguous(s, op, name);
    check_same_device(s, ref, op, name, "a");
    TORCH_CHECK_VALUE(s.sizes() == want, op, ": ", name, " must have shape ", layout, " = ", want, " (", source,
                      "), got ", shape_str(s));
}

// The CPU paths read the offsets on the host, so their values can be checked for free (the core
// would only say "invalid argument").
void check_offsets_order(const int32_t* offp, int64_t E, const char* op) {
    for (int64_t e = 0; e <= E; ++e) {
        const int32_t prev = e ? offp[e - 1] : 0;
        TORCH_CHECK_VALUE(offp[e] >= prev, op, ": offsets must be non-negative and non-decreasing (a plan's expert ",
                          "row offsets), got offsets[", e, "] = ", offp[e], e ? " after " : "",
                          e ? std::to_string(prev) : "");
    }
}

// The raw pointers of the C core's FP8 GEMMs (forward and weight gradient), after the host-side check
// of the offsets' order.
struct CpuOperands {
    const uint8_t* a;
    const float* sa;
    const uint8_t* b;
    const float* sb;
    const int32_t* off;
    uint16_t* out;
};

CpuOperands cpu_operands(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                         const at::Tensor& b_scales, const at::Tensor& offsets, at::Tensor& out, int64_t E,
                         const char* op) {
    CpuOperands c{static_cast<const uint8_t*>(a.data_ptr()), a_scales.data_ptr<float>(),
                  static_cast<const uint8_t*>(b.data_ptr()), b_scales.data_ptr<float>(), offsets.data_ptr<int32_t>(),
                  reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>())};
    check_offsets_order(c.off, E, op);
    return c;
}

#ifdef MOK_WITH_CUDA
void check_aligned(const at::Tensor& t, const char* op, const char* name) {
    TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, op, ": ", name,
                      " must be 16-byte aligned on CUDA (the kernel reads it with TMA / 16-byte copies), got address ",
                      t.data_ptr(), "; pass a fresh tensor or .clone() it");
}

// act: the SwiGLU variant's [R, N / 2] output, or nullptr.
void grouped_mm_fp8_cuda(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                         const at::Tensor& b_scales, const at::Tensor& offsets, at::Tensor& out, at::Tensor* act,
                         const char* op) {
    check_aligned(a, op, "a");
    check_aligned(a_scales, op, "a_scales");
    check_aligned(b, op, "b");
    check_aligned(b_scales, op, "b_scales");
    c10::cuda::CUDAGuard guard(a.device());
    mok_grouped_gemm_fp8_args g{};
    g.a = a.data_ptr();
    g.sa = a_scales.data_ptr<float>();
    g.b = b.data_ptr();
    g.sb = b_scales.data_ptr<float>();
    g.offsets = offsets.data_ptr<int32_t>();
    g.R = out.size(0);
    g.E = b.size(0);
    g.N = out.size(1);
    g.K = a.size(1);
    g.out = out.data_ptr();
    g.act = act != nullptr ? act->data_ptr() : nullptr;
    g.error_flag = cuda::device_error_word();
    g.num_sms = at::cuda::getDeviceProperties(a.device().index())->multiProcessorCount;
    TORCH_CHECK_NOT_IMPLEMENTED(mok_grouped_gemm_fp8_supported(&g), op,
                                ": the CUDA kernel needs a Hopper (sm_90) GPU (and MOK_DISABLE_SM90 unset); "
                                "there is no other CUDA path yet, use the CPU op");
    check_status(mok_grouped_gemm_fp8_cuda(&g, at::cuda::getCurrentCUDAStream(a.device().index()).stream()), op);
}

// The CUDA kernel's shape rules, checked before anything is allocated.
void check_wgrad_cuda_shapes(int64_t M, int64_t N, int64_t R, const char* op) {
    TORCH_CHECK_VALUE(M % kBlock == 0, op, ": M (a.shape[0]) must be a multiple of 128 on CUDA (the kernel's ",
                      "tile), got ", M);
    TORCH_CHECK_VALUE(N % kBlock == 0, op, ": N (b.shape[0]) must be a multiple of 128 on CUDA (the kernel's ",
                      "tile), got ", N);
    TORCH_CHECK_VALUE(R % 16 == 0, op, ": R (a.shape[1] and b.shape[1]) must be a multiple of 16 on CUDA (the TMA ",
                      "row pitch of a and b), got ", R, "; mok's CUDA plans have a multiple of 128 rows");
}

// out_second: the rows [M / 2, M) of every expert's result when the caller wants the halves as two
// tensors (out then [E, M / 2, N], rows [0, M / 2)); where the kernel cannot write both in place
// (mok_grouped_gemm_fp8_wgrad_supported says no for the pair) the whole result, then a copy of each half.
void grouped_mm_fp8_wgrad_cuda(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                               const at::Tensor& b_scales, bool b_tiled, const at::Tensor& offsets, at::Tensor& out,
                               at::Tensor* out_second, const char* op) {
    const int64_t M = a.size(0), R = a.size(1), N = b.size(0);
    if (R == 0) {
        // No rows: every expert's gradient is zero. (The operands are empty, and an empty tensor may be a
        // view with any address: the kernel's alignment rules do not apply to it.)
        out.zero_();
        if (out_second) out_second->zero_();
        return;
    }
    check_aligned(a, op, "a");
    check_aligned(a_scales, op, "a_scales");
    check_aligned(b, op, "b");
    check_aligned(b_scales, op, "b_scales");
    c10::cuda::CUDAGuard guard(a.device());
    mok_grouped_gemm_fp8_wgrad_args g{};
    g.a = a.data_ptr();
    g.sa = a_scales.data_ptr<float>();
    g.b = b.data_ptr();
    g.sb = b_scales.data_ptr<float>();
    g.sb_tiled = b_tiled;
    g.offsets = offsets.data_ptr<int32_t>();
    g.R = R;
    g.E = out.size(0);
    g.M = M;
    g.N = N;
    g.out = out.data_ptr();
    g.out_second = out_second ? out_second->data_ptr() : nullptr;
    g.error_flag = cuda::device_error_word();
    g.num_sms = at::cuda::getDeviceProperties(a.device().index())->multiProcessorCount;
    if (out_second && !mok_grouped_gemm_fp8_wgrad_supported(&g)) {
        into_halves(out, *out_second, [&](at::Tensor& whole) {
            grouped_mm_fp8_wgrad_cuda(a, a_scales, b, b_scales, b_tiled, offsets, whole, nullptr, op);
        });
        return;
    }
    TORCH_CHECK_NOT_IMPLEMENTED(mok_grouped_gemm_fp8_wgrad_supported(&g), op,
                                ": the CUDA kernel needs a Hopper (sm_90) GPU (and MOK_DISABLE_SM90 unset); "
                                "there is no other CUDA path yet, use the CPU op");
    check_status(mok_grouped_gemm_fp8_wgrad_cuda(&g, at::cuda::getCurrentCUDAStream(a.device().index()).stream()),
                 op);
}
#endif

// The forward's argument checks (grouped_mm_fp8 and its SwiGLU form).
void check_fp8_gemm_args(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                         const at::Tensor& b_scales, const at::Tensor& offsets, const char* op) {
    check_fp8_operand(a, 2, op, "a", "[R, K]");
    check_fp8_operand(b, 3, op, "b", "[E, N, K]");
    check_same_device(b, a, op, "b", "a");
    const int64_t R = a.size(0), K = a.size(1), E = b.size(0), N = b.size(1);
    check_size(b, 2, K, op, "b", "K, the columns of a");
    TORCH_CHECK_VALUE(K % kBlock == 0, op, ": K (a.shape[1]) must be a multiple of 128 (the FP8 scale block), got ", K);
    TORCH_CHECK_VALUE(N % kBlock == 0, op, ": N (b.shape[1]) must be a multiple of 128 (the FP8 scale block), got ", N);
    check_scales(a_scales, a, {R, K / kBlock}, op, "a_scales", "[R, K / 128]", "mok.fp8.quantize 'blockwise_1x128'");
    check_scales(b_scales, a, {E, N / kBlock, K / kBlock}, op, "b_scales", "[E, N / 128, K / 128]",
                 "mok.fp8.quantize 'blockwise_128x128' of b viewed as [E * N, K]");
    check_index(offsets, a, op, "offsets");
    check_dim(offsets, 1, op, "offsets", "[E + 1]");
    check_size(offsets, 0, E + 1, op, "offsets", "number of experts + 1");
}

// The C core's GEMM into out [R, N] (every row written).
void grouped_mm_fp8_cpu(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                        const at::Tensor& b_scales, const at::Tensor& offsets, at::Tensor& out, const char* op) {
    const int64_t R = a.size(0), K = a.size(1), E = b.size(0), N = b.size(1);
    const CpuOperands c = cpu_operands(a, a_scales, b, b_scales, offsets, out, E, op);
    // Rows are independent and each element's arithmetic does not depend on the split: the result is
    // the same for any thread count. About 1M multiply-adds per task.
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, N * K));
    at::parallel_for(0, R, grain, [&](int64_t r0, int64_t r1) {
        check_status(mok_grouped_gemm_fp8_blockwise(c.a, c.sa, c.b, c.sb, c.off, E, N, K, r0, r1, c.out), op);
    });
}

at::Tensor grouped_mm_fp8(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                          const at::Tensor& b_scales, const at::Tensor& offsets) {
    const char* op = "mok.grouped_mm_fp8";
    check_fp8_gemm_args(a, a_scales, b, b_scales, offsets, op);
    // The kernels write every row (zeros outside the experts).
    auto out = at::empty({a.size(0), b.size(1)}, a.options().dtype(at::kBFloat16));
    if (out.numel() == 0) return out;
    if (a.size(1) == 0 || b.size(0) == 0) return out.zero_();
#ifdef MOK_WITH_CUDA
    if (a.is_cuda()) {
        grouped_mm_fp8_cuda(a, a_scales, b, b_scales, offsets, out, nullptr, op);
        return out;
    }
#endif
    grouped_mm_fp8_cpu(a, a_scales, b, b_scales, offsets, out, op);
    return out;
}

std::tuple<at::Tensor, at::Tensor> grouped_mm_fp8_swiglu(const at::Tensor& a, const at::Tensor& a_scales,
                                                         const at::Tensor& b, const at::Tensor& b_scales,
                                                         const at::Tensor& offsets) {
    const char* op = "mok.grouped_mm_fp8_swiglu";
    check_fp8_gemm_args(a, a_scales, b, b_scales, offsets, op);
    const int64_t R = a.size(0), N = b.size(1);
    TORCH_CHECK_VALUE(N % (2 * kBlock) == 0, op, ": b.shape[1] must be 2 * I, [gate | up], with I a multiple of 128 ",
                      "(whole scale blocks in each half), got ", N);
    auto h = at::empty({R, N}, a.options().dtype(at::kBFloat16));
    auto act = at::empty({R, N / 2}, h.options());
    if (h.numel() == 0) return {act, h};
    if (a.size(1) == 0 || b.size(0) == 0) return {act.zero_(), h.zero_()};
#ifdef MOK_WITH_CUDA
    if (a.is_cuda()) {
        grouped_mm_fp8_cuda(a, a_scales, b, b_scales, offsets, h, &act, op);
        return {act, h};
    }
#endif
    grouped_mm_fp8_cpu(a, a_scales, b, b_scales, offsets, h, op);
    cpu::swiglu(h, act);
    return {act, h};
}

// grouped_mm_fp8_wgrad's argument checks: returns whether b's scales are per 128 x 128 block (else per
// column); *E the number of experts.
bool check_fp8_wgrad_args(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                          const at::Tensor& b_scales, const at::Tensor& offsets, int64_t* E, const char* op) {
    check_fp8_operand(a, 2, op, "a", "[M, R]");
    check_fp8_operand(b, 2, op, "b", "[N, R]");
    check_same_device(b, a, op, "b", "a");
    const int64_t M = a.size(0), R = a.size(1), N = b.size(0), nrb = (R + kBlock - 1) / kBlock;
    check_size(b, 1, R, op, "b", "R, the columns of a: both operands run over the same rows");
    // MN-major: a K-block's scales are contiguous (the kernel reads them with one bulk copy per stage)
    check_scales(a_scales, a, {nrb, M}, op, "a_scales", "[ceil(R / 128), M]",
                 "MN-major 1 x 128 scales along R: mok.fp8_gemm.quantize_colwise_blockwise");
    // b's scales per column (1 x 128 along R) or per 128 x 128 block
    const int64_t nnb = (N + kBlock - 1) / kBlock;
    const bool b_tiled = N > 1 && b_scales.dim() == 2 && b_scales.size(1) == nnb;
    if (b_tiled)
        check_scales(b_scales, a, {nrb, nnb}, op, "b_scales", "[ceil(R / 128), ceil(N / 128)]",
                     "MN-major 128 x 128 scales: mok.fp8_gemm.quantize_rowcol_for_wgrad(x, col_recipe='blockwise_128x128')");
    else
        check_scales(b_scales, a, {nrb, N}, op, "b_scales", "[ceil(R / 128), N] (or [ceil(R / 128), ceil(N / 128)])",
                     "MN-major 1 x 128 scales along R: mok.fp8_gemm.quantize_colwise_blockwise");
    check_index(offsets, a, op, "offsets");
    check_dim(offsets, 1, op, "offsets", "[E + 1]");
    TORCH_CHECK_VALUE(offsets.size(0) >= 1, op, ": offsets must hold E + 1 >= 1 values, got shape ",
                      shape_str(offsets));
    *E = offsets.size(0) - 1;
#ifdef MOK_WITH_CUDA
    if (a.is_cuda()) check_wgrad_cuda_shapes(M, N, R, op);
#endif
    return b_tiled;
}

// The C core's weight gradient into out [E, M, N] (every expert written).
void grouped_mm_fp8_wgrad_cpu(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                              const at::Tensor& b_scales, bool b_tiled, const at::Tensor& offsets, at::Tensor& out,
                              const char* op) {
    const int64_t M = a.size(0), R = a.size(1), N = b.size(0), E = out.size(0);
    const CpuOperands c = cpu_operands(a, a_scales, b, b_scales, offsets, out, E, op);
    TORCH_CHECK_VALUE(c.off[E] <= R, op, ": offsets[E] must be at most R = ", R,
                      " (a.shape[1], the rows the operands hold), got ", c.off[E]);
    // Experts are independent and each element's arithmetic does not depend on the split: the result
    // is the same for any thread count. About 1M multiply-adds per task.
    const int64_t work = std::max<int64_t>(1, M * N * (static_cast<int64_t>(c.off[E]) - c.off[0]) / E);
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 20) / work);
    at::parallel_for(0, E, grain, [&](int64_t e0, int64_t e1) {
        check_status(mok_grouped_gemm_fp8_wgrad_blockwise_nb(c.a, c.sa, c.b, c.sb, b_tiled ? kBlock : 1, c.off, E, R,
                                                             M, N, e0, e1, c.out),
                     op);
    });
}

at::Tensor grouped_mm_fp8_wgrad(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                                const at::Tensor& b_scales, const at::Tensor& offsets) {
    const char* op = "mok.grouped_mm_fp8_wgrad";
    int64_t E = 0;
    const bool b_tiled = check_fp8_wgrad_args(a, a_scales, b, b_scales, offsets, &E, op);
    // The kernels write every expert's gradient (zeros for an expert without rows).
    auto out = at::empty({E, a.size(0), b.size(0)}, a.options().dtype(at::kBFloat16));
    if (out.numel() == 0) return out;
#ifdef MOK_WITH_CUDA
    if (a.is_cuda()) {
        grouped_mm_fp8_wgrad_cuda(a, a_scales, b, b_scales, b_tiled, offsets, out, nullptr, op);
        return out;
    }
#endif
    grouped_mm_fp8_wgrad_cpu(a, a_scales, b, b_scales, b_tiled, offsets, out, op);
    return out;
}

// GEMM1's FP8 weight gradient as gate and up halves (torchtitan's w1 and w3): (d_gate, d_up), each
// [E, M / 2, N], the halves of grouped_mm_fp8_wgrad(a, ...) along dim 1 (the same bits); written in
// place on sm_90a (M / 2 a multiple of 64), else the whole result split with a copy.
std::tuple<at::Tensor, at::Tensor> grouped_mm_fp8_gate_up_wgrad(const at::Tensor& a, const at::Tensor& a_scales,
                                                                const at::Tensor& b, const at::Tensor& b_scales,
                                                                const at::Tensor& offsets) {
    const char* op = "mok.grouped_mm_fp8_gate_up_wgrad";
    int64_t E = 0;
    const bool b_tiled = check_fp8_wgrad_args(a, a_scales, b, b_scales, offsets, &E, op);
    const int64_t M = a.size(0), N = b.size(0);
    TORCH_CHECK_VALUE(M % 2 == 0, op, ": a.shape[0] must be even ([gate | up] = 2 * I rows of d_h^T), got shape ",
                      shape_str(a));
    auto d_gate = at::empty({E, M / 2, N}, a.options().dtype(at::kBFloat16));
    auto d_up = at::empty({E, M / 2, N}, d_gate.options());
    if (d_gate.numel() == 0) return {d_gate, d_up};
#ifdef MOK_WITH_CUDA
    if (a.is_cuda()) {
        grouped_mm_fp8_wgrad_cuda(a, a_scales, b, b_scales, b_tiled, offsets, d_gate, &d_up, op);
        return {d_gate, d_up};
    }
#endif
    into_halves(d_gate, d_up, [&](at::Tensor& whole) {
        grouped_mm_fp8_wgrad_cpu(a, a_scales, b, b_scales, b_tiled, offsets, whole, op);
    });
    return {d_gate, d_up};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
    m.def("grouped_mm_fp8(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, Tensor offsets) -> Tensor");
    m.def("grouped_mm_fp8_swiglu(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, Tensor offsets) -> "
          "(Tensor act, Tensor h)");
    m.def("grouped_mm_fp8_wgrad(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, Tensor offsets) -> Tensor");
    m.def("grouped_mm_fp8_gate_up_wgrad(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, Tensor offsets) -> "
          "(Tensor d_gate, Tensor d_up)");
}

TORCH_LIBRARY_IMPL(mok, CPU, m) {
    m.impl("grouped_mm_fp8", &grouped_mm_fp8);
    m.impl("grouped_mm_fp8_swiglu", &grouped_mm_fp8_swiglu);
    m.impl("grouped_mm_fp8_wgrad", &grouped_mm_fp8_wgrad);
    m.impl("grouped_mm_fp8_gate_up_wgrad", &grouped_mm_fp8_gate_up_wgrad);
}

#ifdef MOK_WITH_CUDA
TORCH_LIBRARY_IMPL(mok, CUDA, m) {
    m.impl("grouped_mm_fp8", &grouped_mm_fp8);
    m.impl("grouped_mm_fp8_swiglu", &grouped_mm_fp8_swiglu);
    m.impl("grouped_mm_fp8_wgrad", &grouped_mm_fp8_wgrad);
    m.impl("grouped_mm_fp8_gate_up_wgrad", &grouped_mm_fp8_gate_up_wgrad);
}
#endif

}  // namespace mok
