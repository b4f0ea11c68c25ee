"""Shared benchmark helpers: timing, L2 flush, peak memory, FLOP counts, environment header,
table printing and result files. Every benchmark script in this folder imports this module.

Timing on CUDA: CUDA events around each call, one synchronize at the end (no host sync between
timed calls), median over the timed calls after warm-up. On the CPU (smoke tests) the same API
times with time.perf_counter, so every script runs end to end without a GPU."""
import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # so `python benchmarks/x.py` finds mok and benchmarks without installing
    sys.path.insert(0, ROOT)

GIB = float(1 << 30)
L2_FLUSH_BYTES = 256 << 20  # larger than any Hopper L2 (50-60 MB), as DeepGEMM's flush


# ------------------------------------------------------------------------------------------------
# devices and timing
# ------------------------------------------------------------------------------------------------


def pick_device(name: Optional[str] = None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class L2Flusher:
    """Zeroes a 256 MB buffer: run between timed calls (outside the timed region) so every call
    starts with a cold L2, as it would inside a model where other layers evict the data."""

    def __init__(self, device):
        self.buf = None
        if torch.device(device).type == "cuda":
            self.buf = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)

    def __call__(self):
        if self.buf is not None:
            self.buf.zero_()


def bench(fn: Callable[[int], object], device, *, iters: int = 20, warmup: int = 5, flush_l2: bool = False,
          setup: Optional[Callable[[int], object]] = None) -> Dict[str, float]:
    """Times fn(i) for i in range(iters) after `warmup` untimed calls; returns median/min/mean ms.

    fn gets the call index so a caller can rotate between input groups (fn(i) uses group
    i % n) instead of, or on top of, flushing the L2. setup(i), if given, runs before each call
    outside the timed region (e.g. zeroing gradients). On CUDA all timed calls are queued with
    their start/end events and the host waits once at the end."""
    device = torch.device(device)
    flush = L2Flusher(device) if flush_l2 else None
    for i in range(warmup):
        if setup is not None:
            setup(i)
        fn(i)
    sync(device)
    times: List[float] = []
    if device.type == "cuda":
        events = []
        for i in range(iters):
            if setup is not None:
                setup(i)
            if flush is not None:
                flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            end.record()
            events.append((start, end))
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in events]
    else:
        for i in range(iters):
            if setup is not None:
                setup(i)
            t0 = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "mean_ms": statistics.fmean(times),
            "iters": iters}


def time_once_s(fn: Callable[[], object], device) -> float:
    """Wall-clock seconds of one call, synchronised: to decide whether a slow peer is worth timing."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def peak_memory_gib(fn: Callable[[], object], device) -> float:
    """Peak device memory allocated during fn(), above what was allocated before it (inputs and
    weights are shared by all implementations, so the difference is what the implementation
    itself needs). NaN on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / GIB


def held_after_gib(fwd: Callable[[], object], device) -> float:
    """Device memory still allocated after fwd() while its output (and so the autograd graph with
    the tensors saved for the backward) is alive, above what was allocated before: what a model
    holds per layer between its forward and its backward. NaN on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    out = fwd()
    torch.cuda.synchronize(device)
    held = torch.cuda.memory_allocated(device) - base
    del out
    return held / GIB


# ------------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------------


def moe_fwd_flops(T: int, H: int, I: int, K: int) -> int:
    """Forward FLOPs of the routed expert MLPs: GEMM1 [T*K, H] x [H, 2I] plus GEMM2 [T*K, I] x [I, H]
    (real rows only, no padding; the SwiGLU and combine are not counted)."""
    return 2 * T * K * H * (2 * I) + 2 * T * K * I * H


def moe_fwd_bwd_flops(T: int, H: int, I: int, K: int) -> int:
    """Forward + backward (dgrad + wgrad): 3x the forward."""
    return 3 * moe_fwd_flops(T, H, I, K)


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12 if ms and ms > 0 and math.isfinite(ms) else float("nan")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float32 (0 when both are zero)."""
    a, b = a.detach().float(), b.detach().float()
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else num


# ------------------------------------------------------------------------------------------------
# environment, CLI, tables, files
# ------------------------------------------------------------------------------------------------


def _git_rev() -> str:
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev + ("+dirty" if dirty else "") if rev else "unknown"
    except Exception:
        return "unknown"


def environment(device) -> Dict[str, object]:
    device = torch.device(device)
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "git": _git_rev(),
        "device": "cpu",
    }
    try:
        import mok

        env["mok"] = mok.__version__
        env["mok_cuda_kernels"] = bool(mok.has_cuda_kernels())
    except Exception as e:  # the header must still print if mok fails to import
        env["mok"] = f"import failed: {e!r}"[:200]
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env["device"] = torch.cuda.get_device_name(device)
        env["sms"] = p.multi_processor_count
        env["memory_gib"] = round(p.total_memory / GIB, 1)
        env["capability"] = f"{p.major}.{p.minor}"
    else:
        env["device"] = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return env


def print_environment(env: Dict[str, object]) -> None:
    width = max(len(k) for k in env)
    for k, v in env.items():
        print(f"# {k:<{width}} : {v}")
    print(flush=True)


def start_run(args: argparse.Namespace):
    """The start of every benchmark that took add_common_args: --quick keeps at most 3 timed calls
    and 1 warm-up; picks the device and prints the environment. Returns (device, environment)."""
    if args.quick:
        args.iters, args.warmup = min(args.iters, 3), min(args.warmup, 1)
    dev = pick_device(args.device)
    env = environment(dev)
    print_environment(env)
    return dev, env


def add_common_args(p: argparse.ArgumentParser, script: str, iters: int = 20, warmup: int = 5) -> None:
    p.add_argument("--iters", type=int, default=iters, help="timed calls per measurement (median reported)")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed calls before timing")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--quick", action="store_true", help="tiny shapes, for a CPU smoke test")
    p.add_argument("--no-flush-l2", dest="flush_l2", action="store_false",
                   help="do not zero a 256 MB buffer between timed calls")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "out", f"{script}.json"),
                   help="JSON result path; a .md table is written beside it")


def _fmt(v, fmt: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return format(v, fmt) if fmt else f"{v:g}"
    return format(v, fmt) if fmt and not isinstance(v, str) else str(v)


def format_table(rows: Sequence[Dict[str, object]], columns: Sequence[tuple], markdown: bool = False) -> str:
    """columns: (key, header, format spec, e.g. '.3f'); missing or NaN values print as '-'.
    Text columns are left-aligned, numbers right-aligned."""
    cells = [[_fmt(r.get(k), f) for k, _, f in columns] for r in rows]
    heads = [h for _, h, _ in columns]
    numeric = [all(isinstance(r.get(k), (int, float)) or r.get(k) is None for r in rows) for k, _, _ in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]

    def line(vals):
        out = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)]
        return ("| " + " | ".join(out) + " |") if markdown else "  ".join(out)

    sep = ("|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(widths, numeric)) + "|"
           if markdown else "  ".join("-" * w for w in widths))
    return "\n".join([line(heads), sep] + [line(c) for c in cells])


def as_dict(obj) -> Dict[str, object]:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else dict(obj)


def write_results(out: str, env: Dict[str, object], rows: Sequence[Dict[str, object]], columns: Sequence[tuple],
                  title: str, notes: Sequence[str] = ()) -> None:
    """Writes <out>.json (environment + every row, all fields) and <out>.md (header + table)."""
    base = out[:-5] if out.endswith(".json") else out
    os.makedirs(os.path.dirname(os.path.abspath(base)) or ".", exist_ok=True)

    def clean(v):  # JSON has no NaN
        return None if isinstance(v, float) and not math.isfinite(v) else v

    with open(base + ".json", "w") as f:
        json.dump({"title": title, "env": env, "results": [{k: clean(v) for k, v in r.items()} for r in rows]},
                  f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(f"## {title}\n\n")
        for k, v in env.items():
            f.write(f"- {k}: `{v}`\n")
        f.write("\n" + format_table(rows, columns, markdown=True) + "\n")
        for n in notes:
            f.write(f"\n{n}\n")
    print(f"\nwrote {base}.json and {base}.md")


def free_memory(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def with_env(name, value, fn):
    """fn run with the environment variable name=value (the launcher reads mok's kernel switches on every
    call), restoring the caller's value afterwards."""
    def run(*args, **kwargs):
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn(*args, **kwargs)
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
    return run
