"""FP8 blockwise grouped GEMMs (DeepSeek-V3's recipe): the ops exist on the CPU (the C core) and on
CUDA (the sm_90a kernel); they have no autograd formula. recipe="blockwise" of
mok.functional.moe_experts and the layers runs its forward expert GEMMs on grouped_mm_blockwise, with
fp8_dgrad=True also the backward's dgrad GEMMs (on the weights' transposed codes), and with
fp8_wgrad=True the two weight gradients on grouped_mm_wgrad_blockwise (a K-grouped GEMM over each
expert's rows, on column-wise copies of both operands).

    a_q, a_scales = mok.fp8.quantize(rows, "blockwise_1x128")          # rows [R, K]
    b_q, b_scales = mok.fp8_gemm.quantize_weight_blockwise(w)         # w [E, N, K]
    plan = mok.functional.moe_plan(topk_idx, E)                       # 128-aligned on CUDA
    out = mok.fp8_gemm.grouped_mm_blockwise(a_q, a_scales, b_q, b_scales, plan.offsets)   # [R, N] bf16
    act, h = mok.fp8_gemm.grouped_mm_swiglu_blockwise(a_q, a_scales, w1_q, w1_s, plan.offsets)  # [gate | up] rows

    # weight gradient: d_w[e] = d_out[rows of e]^T @ rows[rows of e], [E, N, K]
    g_q, g_s = mok.fp8_gemm.quantize_colwise_blockwise(d_out)        # d_out [R, N]: g_q [N, R]
    x_q, x_s = mok.fp8_gemm.quantize_colwise_blockwise(rows)         # rows [R, K]: x_q [K, R]
    d_w = mok.fp8_gemm.grouped_mm_wgrad_blockwise(g_q, g_s, x_q, x_s, plan.offsets)
"""
import torch

from . import fp8
from ._ops import ops

BLOCK = 128  # the FP8 scale block: 1x128 for activations, 128x128 for weights


def grouped_mm_blockwise(a_q, a_scales, b_q, b_scales, offsets):
    """Grouped GEMM "NT" on FP8 E4M3 operands with fp32 block scales, bf16 output.

    Layouts (all contiguous, on one device):
      a_q       [R, K]               float8_e4m3fn  rows in expert order (the plan's row space)
      a_scales  [R, K/128]           float32        one scale per 1x128 block of a row
      b_q       [E, N, K]            float8_e4m3fn  per-expert weights, nn.Linear layout (K contiguous)
      b_scales  [E, N/128, K/128]    float32        one scale per 128x128 tile of an expert
      offsets   [E + 1]              int32          expert e owns rows [offsets[e], offsets[e+1])
    K and N must be multiples of 128.

    For offsets[e] <= r < offsets[e+1]:
      out[r, n] = sum_kb a_scales[r, kb] * b_scales[e, n // 128, kb]
                         * sum_{k in block kb} a_q[r, k] * b_q[e, n, k]
    returned as bf16 [R, N]; rows before offsets[0] or at/after offsets[E] are 0. That is
    (dequantize(a) @ dequantize(b[e]).T) for each expert's rows (mok.reference.grouped_mm_fp8_blockwise).

    Operands: a_q, a_scales = mok.fp8.quantize(a, "blockwise_1x128"); b_q, b_scales =
    quantize_weight_blockwise(b) (mok.fp8.quantize of b viewed as [E*N, K] with "blockwise_128x128").

    Numerics: CPU (C core) sums each 128-block exactly in double, scales and adds the blocks in
    double and rounds once to bf16. CUDA (Hopper, sm_90a) accumulates each block in fp32 on the
    tensor cores and promotes it, scaled, to an fp32 accumulator (DeepGEMM's scheme).

    CUDA requirements: a Hopper GPU (otherwise NotImplementedError), 16-byte aligned tensors, and
    every offsets[e] a multiple of 128, which the plans of mok.functional.moe_plan on CUDA are (tile
    128). A misaligned offset is not checked on the host (that would synchronise with the GPU): the
    kernel computes nothing and the next mok.check_errors() raises ValueError.

    Forward only: there is no autograd formula (gradients do not flow through this op)."""
    return ops.grouped_mm_fp8(a_q, a_scales, b_q, b_scales, offsets)


def grouped_mm_swiglu_blockwise(a_q, a_scales, b_q, b_scales, offsets):
    """GEMM1 of the experts with SwiGLU: (act [R, I], h [R, 2I]), both bf16, where b_q [E, 2I, K] holds
    each expert's [gate | up] rows (I a multiple of 128), h = grouped_mm_blockwise(a_q, a_scales, b_q,
    b_scales, offsets) and act = torch.ops.mok.swiglu(h), bit for bit. On CUDA one kernel: the SwiGLU runs in
    the GEMM's epilogue on the rounded h values, so no pass reads h back. Forward only, as
    grouped_mm_blockwise."""
    return ops.grouped_mm_fp8_swiglu(a_q, a_scales, b_q, b_scales, offsets)


def grouped_mm_wgrad_blockwise(a_q, a_scales, b_q, b_scales, offsets):
    """Weight-gradient grouped GEMM (K-grouped: the contraction runs over each expert's rows) on FP8
    E4M3 operands with fp32 1x128 block scales along the rows, bf16 output.

    Layouts (all contiguous, on one device):
      a_q       [M, R]               float8_e4m3fn  column-wise copy of an [R, M] tensor (R contiguous)
      a_scales  [ceil(R/128), M]     float32        one scale per 1x128 block along R, MN-major
      b_q       [N, R]               float8_e4m3fn  column-wise copy of an [R, N] tensor
      b_scales  [ceil(R/128), N]     float32        one scale per 1x128 block along R, MN-major,
             or [ceil(R/128), ceil(N/128)]          one scale per 128x128 block (b quantised in tiles:
                                                    quantize_rowcol_for_wgrad(x, "blockwise_128x128"))
      offsets   [E + 1]              int32          expert e owns rows [offsets[e], offsets[e+1])

    For each expert e:
      out[e, m, n] = sum_{offsets[e] <= r < offsets[e+1]} a_scales[r // 128, m] * b_scales[r // 128, n]
                                                          * a_q[m, r] * b_q[n, r]
    (b_scales[r // 128, n // 128] with 128x128 blocks)
    returned as bf16 [E, M, N]; an expert with no rows gets zeros; rows before offsets[0] or at/after
    offsets[E] are not read. That is (dequantize(a)[:, rows of e] @ dequantize(b)[:, rows of e].T) for
    each expert (mok.reference.grouped_mm_fp8_wgrad_blockwise).

    Operands: quantize_colwise_blockwise(x) for x [R, M] (or colwise_operand of a
    mok.fp8.quantize_rowcol(x, "blockwise_1x128") that also gives the row-wise copy). The scales are
    MN-major (scales_t transposed) so that the kernel reads a 128-row block's scales of a tile as one
    contiguous run (one bulk copy per pipeline stage instead of 128 + 128 four-byte copies).
    With x = the output gradient [R, N_w] and the GEMM's input rows [R, K_w], the result is the weight
    gradient [E, N_w, K_w] of out = rows @ w[e]^T.

    Numerics: CPU (C core) sums each (128-row block, expert) piece exactly in double, scales and adds
    the pieces in increasing block order in double and rounds once to bf16; any offsets (a scale
    block shared by two experts gives each its own rows of it). CUDA (Hopper, sm_90a) accumulates each
    128-row block in fp32 on the tensor cores and promotes it, scaled, to an fp32 accumulator: a multiply
    and an add per accumulator and block with 1x128 b_scales, one fused multiply-add with 128x128 ones
    (performance log v50).

    CUDA requirements: a Hopper GPU (otherwise NotImplementedError), M and N multiples of 128, R a
    multiple of 16, 16-byte aligned tensors, and every offsets[e] a multiple of 128 (mok's CUDA plans
    are): a misaligned offset is not checked on the host (that would synchronise with the GPU): the
    kernel computes nothing and the next mok.check_errors() raises ValueError.

    No autograd formula (gradients do not flow through this op)."""
    return ops.grouped_mm_fp8_wgrad(a_q, a_scales, b_q, b_scales, offsets)


def colwise_operand(rc):
    """(qt [M, R], scales [ceil(R/128), M]): the column-wise copy of a
    mok.fp8.quantize_rowcol(x, "blockwise_1x128") result (x [R, M]) in the form
    grouped_mm_wgrad_blockwise takes (its scales_t transposed to MN-major)."""
    return rc.qt, rc.scales_t.t().contiguous()


def quantize_rowcol_for_wgrad(x, col_recipe="blockwise_1x128"):
    """x [R, M] -> ((q [R, M], scales [R, ceil(M/128)]), (qt [M, R], scales [ceil(R/128), M])): the row-wise
    copy of mok.fp8.quantize_rowcol(x, "blockwise_1x128") and its column-wise copy as an operand of
    grouped_mm_wgrad_blockwise, bit for bit colwise_operand(quantize_rowcol(x, ...)); on the GPU the
    kernel writes the column-wise scales MN-major itself (no transpose pass).

    col_recipe="blockwise_128x128": the column-wise copy in 128 x 128 tiles of x instead (its scales
    [ceil(R/128), ceil(M/128)]; bit for bit mok.fp8.quantize(x.t().contiguous(), "blockwise_128x128")
    with the scales transposed), from the same single pass: as grouped_mm_wgrad_blockwise's b operand
    its promotion is one FFMA per accumulator instead of an FMUL and an FFMA. (Other col_recipe values:
    the op's ValueError.)"""
    q, scales, qt, scales_t = ops.quantize_fp8_rowcol(x.contiguous(), "blockwise_1x128", True, col_recipe)
    return (q, scales), (qt, scales_t)


def quantize_colwise_blockwise(x):
    """x [R, M] -> (qt [M, R] float8_e4m3fn, scales [ceil(R/128), M] float32): x quantised in 1 x 128
    blocks along R (its column-wise copy, bit for bit mok.fp8.quantize(x.t().contiguous(),
    "blockwise_1x128")), scales MN-major: an operand of grouped_mm_wgrad_blockwise.

    Through quantize_rowcol: on the GPU its fused kernel reads a bf16 x once and writes both copies
    (4 bytes per element moved), less than transposing x first and quantising the copy (7)."""
    return quantize_rowcol_for_wgrad(x)[1]


def quantize_weight_blockwise(w):
    """w [E, N, K] (bf16, fp16, fp32, fp64) -> (q [E, N, K] float8_e4m3fn, scales [E, N/128, ceil(K/128)]
    float32): 128x128 blockwise quantisation of each expert (mok.fp8.quantize of w viewed as
    [E * N, K] with "blockwise_128x128"). N must be a multiple of 128 so that no tile spans two
    experts; grouped_mm_blockwise also needs K to be one."""
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        got = f"shape {tuple(w.shape)}" if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"mok.fp8_gemm.quantize_weight_blockwise: w must be a 3-D tensor [E, N, K], got {got}")
    E, N, K = w.shape
    if N % BLOCK:
        raise ValueError(
            f"mok.fp8_gemm.quantize_weight_blockwise: N (w.shape[1]) must be a multiple of {BLOCK} so that "
            f"128x128 tiles stay within one expert, got {N}"
        )
    q, scales = fp8.quantize(w.reshape(E * N, K), "blockwise_128x128")
    return q.view(E, N, K), scales.view(E, N // BLOCK, scales.shape[1])
