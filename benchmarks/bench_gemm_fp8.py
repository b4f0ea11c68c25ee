"""FP8 grouped expert GEMMs alone, in one run with their BF16 and FP8 peers on the same problem: mok's
blockwise FP8 grouped GEMM (E4M3, 1x128 activation / 128x128 weight scales, fp32 promotion every 128
of K) against mok's BF16 grouped GEMM, torch._scaled_grouped_mm (row-wise scales, the FP8 grouped GEMM
torch has on Hopper), and, at equal FLOPs, one dense torch._scaled_mm (row-wise, the FP8 ceiling) and
one dense torch.mm (the BF16 ceiling). GEMM1 (N = 2I, K = H) and GEMM2 (N = H, K = I) of each MoE
shape, in the passes of training:

    fwd    out [rows, N] = A [rows, K] @ W[e]^T              mok: grouped_mm_blockwise
    dgrad  dA [rows, K] = dOut [rows, N] @ W[e]              mok: the same kernel on W^T's codes
    wgrad  dW [E, N, K] = dOut_e^T @ A_e (over e's rows)     mok: grouped_mm_wgrad_blockwise

    python benchmarks/bench_gemm_fp8.py                               # every shape, both GEMMs, forward
    python benchmarks/bench_gemm_fp8.py --passes fwd,dgrad,wgrad --shapes mixtral_8x7b,dsv3_ep8_slice
    python benchmarks/bench_gemm_fp8.py --quick                       # tiny shapes, CPU smoke test

GEMM1's forward also runs as the layer does: 'mok_fp8_swiglu' is the one kernel that writes h and
act = SwiGLU(h) (mok.fp8_gemm.grouped_mm_swiglu_blockwise), 'mok_fp8_then_swiglu' the same GEMM
followed by the stand-alone swiglu op (what the layer ran before); its TFLOP/s count the GEMM's FLOPs.

Issue 5's GEMM criteria read off one run: mok FP8 TFLOP/s (target 1250 on Mixtral and DeepSeek-V3)
and its ratio to mok BF16 ('vs mok bf16', target 1.8). Operands are quantised before timing (the
GEMMs alone are timed). Routing is exactly balanced, as in bench_gemm.py; FLOPs are 2 * rows * N * K
over the T*K real rows. 'err' is each output against mok's BF16 GEMM on the unquantised bf16 inputs
(E4M3 rounding of both operands: ~3-6%; a wrong scale or expert gives ~1); the run fails when a
mok row is above ERR_TOL. Times are medians of CUDA-event timings with a 256 MB L2 flush between calls."""
import math
import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import mok  # noqa: E402
from benchmarks import bench_gemm, common  # noqa: E402
from benchmarks.bench_gemm import Config, make_problem, real_rows  # noqa: E402

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
ERR_TOL = 0.12  # E4M3 operands against the bf16 GEMM (measured 3-6% on normal data)
# FP8 needs whole 128-wide scale blocks: tiny shapes with H and I multiples of 128
QUICK_SHAPES = {"tiny_fp8": (64, 256, 128, 4, 2), "tiny_fp8_e3": (48, 128, 256, 3, 1)}


def get_configs(shapes: List[str], gemms: List[str], quick: bool, passes) -> List[Config]:
    configs = bench_gemm.get_configs(shapes, gemms, quick, passes, quick_shapes=QUICK_SHAPES)
    # the default shape list holds gpt-oss-20b-like (H = I = 2880): skip such shapes, do not abort the run
    skipped = sorted({c.shape for c in configs if c.N % 128 or c.K % 128})
    for shape in skipped:
        print(f"shape {shape!r} skipped: FP8 blockwise needs H and I multiples of 128 (whole scale blocks)")
    configs = [c for c in configs if c.shape not in skipped]
    if not configs:
        raise SystemExit("no shape left to run: FP8 blockwise needs H and I multiples of 128")
    return configs


def rowwise_fp8(x):
    """(codes, fp32 scales [rows, 1]) of x [rows, cols]: one scale per row, amax / 448 (torch's
    row-wise FP8 recipe, what torch._scaled_mm and _scaled_grouped_mm take)."""
    amax = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    scale = amax / E4M3_MAX
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def quantized_operands(cfg: Config, P):
    """The pass's FP8 operands, quantised once (untimed), for mok (blockwise) and torch (row-wise).
    dgrad's weight operand is W^T [E, K, N] (the codes of W transposed, as the layer caches them)."""
    Q = {}
    w = P["w"]
    if cfg.gpass == "wgrad":
        Q["d_col"] = mok.fp8_gemm.quantize_colwise_blockwise(P["d_plan"])
        Q["a_col"] = mok.fp8_gemm.quantize_colwise_blockwise(P["a_plan"])
        # the activation's copy in 128 x 128 tiles (v50: the cheaper promotion)
        Q["a_tiled"] = mok.fp8_gemm.quantize_rowcol_for_wgrad(P["a_plan"], "blockwise_128x128")[1]
        return Q
    lhs_plan, lhs_sorted = (P["a_plan"], P["a_sorted"]) if cfg.gpass == "fwd" else (P["d_plan"], P["d_sorted"])
    Q["lhs"] = mok.fp8.quantize(lhs_plan, "blockwise_1x128")
    w_q, w_s = mok.fp8_gemm.quantize_weight_blockwise(w)
    Q["w"] = (w_q, w_s) if cfg.gpass == "fwd" else (w_q.transpose(1, 2).contiguous(), w_s.transpose(1, 2).contiguous())
    # torch, row-wise: mat2 of _scaled_grouped_mm is [E, K_gemm, N_gemm] column-major (w itself for fwd)
    w_nk = w if cfg.gpass == "fwd" else w.transpose(1, 2).contiguous()  # [E, N_gemm, K_gemm]
    wq, ws = rowwise_fp8(w_nk.reshape(-1, w_nk.shape[-1]))
    Q["w_rw"] = (wq.view(w_nk.shape), ws.view(w_nk.shape[0], w_nk.shape[1]))
    Q["lhs_rw"] = rowwise_fp8(lhs_sorted)
    wdq, wds = rowwise_fp8(P["w_dense"] if cfg.gpass == "fwd" else P["w_dense"].t().contiguous())
    Q["dense_rw"] = (wdq, wds)
    return Q


def narrow_tiles(fn):
    """fn run with MOK_SM90_FP8_BN=128: mok's plain FP8 forward and weight gradient on 128 x 128 tiles
    (their width before v30)."""
    return common.with_env("MOK_SM90_FP8_BN", "128", fn)


def pass_impls(cfg: Config, P, Q):
    """name -> callable; 'mok_bf16' first (the reference of 'err' and 'vs mok bf16'). 'mok_fp8' runs the
    default tiles (128 x 192; SwiGLU 128 x 128), 'mok_fp8_bn128' the 128 x 128 tiles of the same kernel;
    wgrad's 'mok_fp8_act128' the activation operand quantised in 128 x 128 tiles (one FFMA per accumulator
    in the promotion instead of an FMUL and an FFMA, v50)."""
    ops, plan = torch.ops.mok, P["plan"]
    bf16 = torch.bfloat16
    if cfg.gpass == "wgrad":
        fp8_wgrad = lambda: mok.fp8_gemm.grouped_mm_wgrad_blockwise(*Q["d_col"], *Q["a_col"], plan.offsets)  # noqa: E731
        return {
            "mok_bf16": lambda: ops.grouped_mm_wgrad(P["d_plan"], P["a_plan"], None, 1, plan.offsets),
            "mok_fp8": fp8_wgrad,
            "mok_fp8_bn128": narrow_tiles(fp8_wgrad),
            "mok_fp8_act128": lambda: mok.fp8_gemm.grouped_mm_wgrad_blockwise(*Q["d_col"], *Q["a_tiled"], plan.offsets),
            "cublas_bf16": lambda: torch.mm(P["d_sorted"].t(), P["a_sorted"]),
        }
    trans_b = cfg.gpass == "fwd"
    lhs_plan = P["a_plan"] if trans_b else P["d_plan"]
    lhs_q, lhs_s = Q["lhs_rw"]
    w_q, w_s = Q["w_rw"]
    dq, ds = Q["dense_rw"]
    impls = {
        "mok_bf16": lambda: ops.grouped_mm(lhs_plan, None, 1, P["w"], plan.offsets, trans_b),
        "mok_fp8": lambda: mok.fp8_gemm.grouped_mm_blockwise(*Q["lhs"], *Q["w"], plan.offsets),
        "mok_fp8_bn128": narrow_tiles(lambda: mok.fp8_gemm.grouped_mm_blockwise(*Q["lhs"], *Q["w"], plan.offsets)),
        "torch_scaled_grouped_mm": lambda: torch._scaled_grouped_mm(
            lhs_q, w_q.transpose(-2, -1), lhs_s.view(-1), w_s, offs=P["offs"], out_dtype=bf16, use_fast_accum=True),
        "scaled_mm_dense": lambda: torch._scaled_mm(lhs_q, dq.t(), lhs_s, ds.view(1, -1), out_dtype=bf16,
                                                    use_fast_accum=True),
        "cublas_bf16": lambda: torch.mm(P["a_sorted"] if trans_b else P["d_sorted"],
                                        P["w_dense"].t() if trans_b else P["w_dense"]),
    }
    if cfg.gemm == "gemm1" and cfg.gpass == "fwd":  # (h is the output compared; act is computed too)
        impls["mok_fp8_swiglu"] = lambda: mok.fp8_gemm.grouped_mm_swiglu_blockwise(*Q["lhs"], *Q["w"], plan.offsets)[1]

        def then_swiglu():
            h = mok.fp8_gemm.grouped_mm_blockwise(*Q["lhs"], *Q["w"], plan.offsets)
            ops.swiglu(h)
            return h

        impls["mok_fp8_then_swiglu"] = then_swiglu
    return impls


def run(cfg: Config, args) -> List[Dict]:
    dev = common.pick_device(args.device)
    P = make_problem(cfg, dev, args.seed)
    Q = quantized_operands(cfg, P)
    impls = pass_impls(cfg, P, Q)
    flops = 2 * cfg.rows * cfg.N * cfg.K
    rows, ref = [], None
    with torch.no_grad():
        for name, fn in impls.items():
            row = dict(shape=cfg.shape, gemm=cfg.gemm, gpass=cfg.gpass, impl=name, rows=cfg.rows, N=cfg.N, K=cfg.K,
                       E=cfg.E, ms=math.nan, tflops=math.nan, vs_bf16=math.nan, vs_scaled_mm=math.nan, err=math.nan,
                       note="")
            try:
                out = fn()
                if name == "mok_bf16":
                    ref = real_rows(cfg, out, P)
                elif ref is not None and (name.startswith("mok_fp8") or name == "torch_scaled_grouped_mm"):
                    # torch's grouped output holds the sorted real rows: the plan order of a balanced plan
                    got = out if name == "torch_scaled_grouped_mm" else real_rows(cfg, out, P)
                    row["err"] = common.rel_err(got, ref)
                del out
                row["ms"] = common.bench(lambda _i: fn(), dev, iters=args.iters, warmup=args.warmup,
                                         flush_l2=args.flush_l2)["median_ms"]
                row["tflops"] = common.tflops(flops, row["ms"])
            except Exception as e:  # a peer that does not run here: record and go on
                row["note"] = f"error: {e!r}"[:160]
            rows.append(row)
    by_name = {r["impl"]: r["tflops"] for r in rows}
    for r in rows:
        for key, base in (("vs_bf16", by_name.get("mok_bf16")), ("vs_scaled_mm", by_name.get("scaled_mm_dense"))):
            if base is not None and not math.isnan(base) and base > 0:
                r[key] = r["tflops"] / base
    del P, Q
    common.free_memory(dev)
    for r in rows:
        print(f"   {r['shape']:18s} {r['gemm']} {r['gpass']:5s} {r['impl']:24s} {r['ms']:8.3f} ms "
              f"{r['tflops']:7.1f} TFLOP/s x{r['vs_bf16']:.2f} of mok bf16 {r['note']}", flush=True)
    return rows


COLUMNS = [
    ("shape", "shape", ""), ("gemm", "gemm", ""), ("gpass", "pass", ""), ("impl", "impl", ""), ("rows", "rows", "d"),
    ("N", "N", "d"), ("K", "K", "d"), ("E", "E", "d"), ("ms", "ms", ".3f"), ("tflops", "TFLOP/s", ".1f"),
    ("vs_bf16", "vs mok bf16", ".2f"), ("vs_scaled_mm", "vs scaled_mm", ".2f"), ("err", "err", ".1e"),
    ("note", "note", ""),
]


def main(argv=None):
    args = bench_gemm.parse_args(argv, __doc__, "bench_gemm_fp8")
    dev, env = common.start_run(args)
    rows: List[Dict] = []
    for cfg in get_configs(args.shapes.split(","), args.gemms.split(","), args.quick, args.passes.split(",")):
        rows += run(cfg, args)
    print("\n" + common.format_table(rows, COLUMNS))
    notes = ["FLOPs = 2 * rows * N * K over the T*K real rows; 'vs mok bf16' / 'vs scaled_mm' = TFLOP/s over mok's "
             "BF16 grouped GEMM's / one dense torch._scaled_mm's (row-wise, fast accumulation) at equal FLOPs; "
             f"'err' vs mok BF16 on the bf16 inputs (tolerance {ERR_TOL:g}); torch's FP8 peers use row-wise "
             f"scales (coarser than mok's 1x128 / 128x128 blocks); L2 flush: {args.flush_l2}; iters {args.iters}, "
             f"warm-up {args.warmup}."]
    common.write_results(args.out, env, rows, COLUMNS, "FP8 grouped expert GEMMs", notes)
    # mok's rows decide the exit code; a peer's err is information (its call may not fit its torch version)
    bad = [r for r in rows if r["impl"].startswith("mok") and not math.isnan(r["err"]) and r["err"] >= ERR_TOL]
    if bad:
        print("MISMATCH vs mok BF16: " + ", ".join(f"{r['shape']}/{r['gemm']}/{r['gpass']}/{r['impl']}" for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
