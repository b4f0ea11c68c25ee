"""Kernel-by-kernel trace of the routed-expert MLP's forward + backward, as bench_moe_layer.py runs
it (same inputs, autograd.grad for x, topk_w and both weights), from torch.profiler: every GPU
kernel with its time per step, and the GPU's idle time between kernels inside a step (launch gaps,
host work). Where bench_moe_layer.py's fwd+bwd is larger than the sum of profile_moe_steps.py's
kernels, this says which kernels or gaps make the difference.

    python benchmarks/trace_moe_layer.py --shapes qwen3_30b_a3b --impls mok,eager   # on the GPU
    python benchmarks/trace_moe_layer.py --quick                                     # CPU smoke test

No L2 flush between steps (the profiler's own overhead would be in the flush's shadow anyway);
steps are synchronised one by one so that each step's span is its own. With --queued the steps are
queued back to back as bench_moe_layer.py times them (one sync at the end): the idle time per step
is then what launch gaps cost when the host is ahead, and the largest gaps are listed with the
kernels on either side."""
import argparse
import collections
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import bench_moe_layer, common  # noqa: E402


def short_name(name: str, width: int = 70) -> str:
    """Kernel names without template argument lists (mok's wgmma kernel has 4 flags: keep them)."""
    if name.startswith("void "):
        name = name[5:]
    if "grouped_gemm_bf16_nt_kernel" in name:
        return name.split("(")[0][:width]
    cut = name.find("<")
    return (name if cut < 0 else name[:cut])[:width]


def gpu_kernels(trace_path: str):
    """(name, start us, duration us) of every GPU kernel and memset/memcpy in a chrome trace."""
    with open(trace_path) as f:
        events = json.load(f).get("traceEvents", [])
    out = []
    for ev in events:
        if ev.get("ph") != "X" or ev.get("cat") not in ("kernel", "gpu_memset", "gpu_memcpy"):
            continue
        out.append((short_name(ev.get("name", "?")), float(ev["ts"]), float(ev["dur"])))
    return sorted(out, key=lambda k: k[1])


def gap_us(kernels, i: int) -> float:
    """GPU idle time (us) between kernel i - 1's end and kernel i's start."""
    return kernels[i][1] - (kernels[i - 1][1] + kernels[i - 1][2])


def trace(fn, steps: int, device, queued: bool = False, largest_gaps: int = 0):
    """Runs fn() `steps` times under the profiler, one synchronised step per profiler step (queued:
    back to back, one sync at the end). Returns per-kernel totals (ms per step), kernel time per
    step and span per step (ms); with largest_gaps > 0 it also prints the largest gaps."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        common.sync(device)
        for _ in range(steps):
            with torch.profiler.record_function("mok_trace_step"):
                fn()
            if not queued:
                common.sync(device)
        common.sync(device)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        kernels = gpu_kernels(path)
    if not kernels:
        return {}, float("nan"), float("nan")
    gaps = sorted(range(1, len(kernels)), key=lambda i: gap_us(kernels, i))
    if largest_gaps > 0:
        big = gaps[::-1][:largest_gaps]
        print(f"   gaps between kernels: {len(gaps)}, over 5 us: {sum(gap_us(kernels, i) > 5 for i in gaps)}, "
              f"median {gap_us(kernels, gaps[len(gaps) // 2]) if gaps else float('nan'):.1f} us; largest:")
        for i in big:
            print(f"   {gap_us(kernels, i):8.1f} us  after {kernels[i - 1][0][:45]}  before {kernels[i][0][:45]}")
    if queued:
        # one span over all the steps: the idle per step is the launch gaps' cost with the host ahead
        bounds = [0, len(kernels)]
    else:
        # Steps are separated by host synchronisations: split where the GPU idles longer than any
        # gap inside a step can be (the sync + Python between steps): at the steps-1 largest gaps.
        cuts = sorted(gaps[-(steps - 1):]) if steps > 1 else []
        bounds = [0] + cuts + [len(kernels)]
    spans, busy = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        ks = kernels[lo:hi]
        spans.append(ks[-1][1] + ks[-1][2] - ks[0][1])
        busy.append(sum(k[2] for k in ks))
    totals = collections.defaultdict(lambda: [0.0, 0])
    for name, _ts, dur in kernels:
        totals[name][0] += dur
        totals[name][1] += 1
    per_step = {n: (t / steps / 1e3, c / steps) for n, (t, c) in totals.items()}
    n = steps if queued else len(spans)
    return per_step, sum(busy) / n / 1e3, sum(spans) / n / 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_moe_layer.add_step_args(p, "mok,eager")
    p.add_argument("--steps", type=int, default=3, help="profiled fwd+bwd steps (after 3 untimed ones)")
    p.add_argument("--top", type=int, default=25, help="kernels listed per run")
    p.add_argument("--queued", action="store_true",
                   help="steps queued back to back (no sync between them), as bench_moe_layer.py times them")
    p.add_argument("--gaps", type=int, default=0, help="list this many of the largest gaps between kernels")
    args = p.parse_args(argv)
    dev = common.pick_device(args.device)
    common.print_environment(common.environment(dev))
    for cfg, impl, step in bench_moe_layer.steps_of_args(p, args, dev):
        for _ in range(3):
            step()
        print(f"\n== {cfg.shape} {cfg.routing} {impl}{' (steps queued)' if args.queued else ''}", flush=True)
        per_kernel, busy_ms, span_ms = trace(step, args.steps, dev, args.queued, args.gaps)
        print(f"   span {span_ms:.3f} ms per step, kernels {busy_ms:.3f} ms, "
              f"GPU idle {'per step' if args.queued else 'inside the step'} {span_ms - busy_ms:.3f} ms")
        rows = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:args.top]
        print(common.format_table([dict(kernel=n, ms=t, calls=c) for n, (t, c) in rows],
                                  [("kernel", "kernel", ""), ("ms", "ms/step", ".3f"), ("calls", "calls", ".0f")]))


if __name__ == "__main__":
    main()
