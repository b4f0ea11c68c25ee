"""Hardware counters of mok's memory-bound FP8 kernels and the FP8 GEMM, one launch each, under Nsight
Compute (ncu reads the counters on the Firecracker GPU machines; the clocks are left alone):

    ncu --clock-control none --kernel-name regex:'quantize_rows_bf16|quantize_rowcol|swiglu_quantize_bf16|grouped_gemm_fp8' \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section SchedulerStats --section Occupancy --section LaunchStats python3 benchmarks/ncu_profile.py

Launches, in order, on DeepSeek-V3's activation (x [65536, 7168] bf16) unless said: the row-wise 1x128
quantiser (quantize_rows_bf16_kernel), the rowcol quantiser, the SwiGLU + quantisation forward with both
copies on Qwen3's h ([131072, 1536]), and the FP8 forward GEMM1 of DeepSeek-V3 (32 experts x 2048 rows,
N 4096, K 7168). Nothing is timed here: bench_quant.py and bench_gemm_fp8.py do that."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import mok  # noqa: E402


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    x = torch.randn(65536, 7168, device=dev, dtype=torch.bfloat16)
    a_q, a_s = mok.fp8.quantize(x, "blockwise_1x128")           # quantize_rows_bf16_kernel
    mok.fp8.quantize_rowcol(x, "blockwise_1x128")               # quantize_rowcol_bf16_kernel
    h = torch.randn(131072, 1536, device=dev, dtype=torch.bfloat16)
    torch.ops.mok.swiglu_quantize_fp8(h, None, True, True, False)  # swiglu_quantize_bf16_kernel (forward)
    del h
    w = torch.randn(32, 4096, 7168, device=dev, dtype=torch.bfloat16) * 0.02
    w_q, w_s = mok.fp8_gemm.quantize_weight_blockwise(w)        # (128x128: not matched by the filter)
    del w
    offsets = torch.arange(0, 65536 + 1, 2048, device=dev, dtype=torch.int32)
    mok.fp8_gemm.grouped_mm_blockwise(a_q, a_s, w_q, w_s, offsets)  # grouped_gemm_fp8_nt_kernel
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
