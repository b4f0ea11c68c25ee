"""Is a fwd+bwd step of the routed experts paced by the host or by the GPU? For each impl it queues N steps
back to back (as bench_moe_layer.py times them, no L2 flush) and reports the host's time to issue a step
(Python, autograd, op dispatch, launches) against the GPU's time per step (CUDA events around the whole
run, after one sync). If the host's time comes near the GPU's, the GPU waits on launches and the layer's
time is partly the host's: kernel work alone will not show in the step.

    python benchmarks/host_pace.py --shapes qwen3_30b_a3b --impls mok,mok_fp8_all_tiled   # on the GPU
    python benchmarks/host_pace.py --quick                                                   # CPU smoke test

On the CPU both times are the host's (the ops run synchronously), so only the smoke test is meaningful."""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import bench_moe_layer, common  # noqa: E402


def pace(step, device, steps: int):
    """(host ms to issue one step, device ms per step) over `steps` queued steps."""
    for _ in range(3):
        step()
    common.sync(device)
    on_cuda = device.type == "cuda"
    start = end = None
    if on_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    host_ms = (time.perf_counter() - t0) * 1e3 / steps
    if on_cuda:
        end.record()
    common.sync(device)
    device_ms = start.elapsed_time(end) / steps if on_cuda else host_ms
    return host_ms, device_ms


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_moe_layer.add_step_args(p, "mok,mok_fp8_all_tiled")
    p.add_argument("--steps", type=int, default=20, help="queued fwd+bwd steps per measurement")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps: expected at least 1")
    dev = common.pick_device(args.device)
    common.print_environment(common.environment(dev))
    steps = bench_moe_layer.steps_of_args(p, args, dev)
    rows = []
    for cfg, impl, step in steps:
        host_ms, device_ms = pace(step, dev, args.steps)
        rows.append(dict(shape=cfg.shape, impl=impl, host=host_ms, device=device_ms, ratio=host_ms / device_ms))
        print(f"   {cfg.shape} {impl}: host {host_ms:.3f} ms/step, device {device_ms:.3f} ms/step", flush=True)
    print(common.format_table(rows, [("shape", "shape", ""), ("impl", "impl", ""), ("host", "host ms/step", ".3f"),
                                     ("device", "device ms/step", ".3f"), ("ratio", "host / device", ".2f")]))


if __name__ == "__main__":
    main()
