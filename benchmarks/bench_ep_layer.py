"""Expert-parallel MoE experts layer, forward + backward, one process per rank: mok's ExpertParallel
against the torchtitan-style EP baseline on the same inputs. The baseline sorts its pairs by
expert, learns the split sizes on the host (two syncs per direction), exchanges rows with
all_to_all_single (the differentiable functional collective torchtitan uses), runs the local experts on
torch._grouped_mm (a loop where that does not run), sends the rows back and sums each token's K
rows weighted.

    python benchmarks/bench_ep_layer.py --world 8                  # one process per GPU (NCCL)
    python benchmarks/bench_ep_layer.py --world 8 --shapes qwen3_30b_a3b --iters 20
    python benchmarks/bench_ep_layer.py --world 8 --recipes bf16,blockwise_all,mxfp8   # mok's FP8 recipes too
    python benchmarks/bench_ep_layer.py --quick                    # W = 2 on the CPU (gloo), smoke test
                                                                   # (fp32; bf16 with an FP8 recipe)

Shapes (tokens per rank T, H, I, experts E, top-k K): dsv3 (4096, 7168, 2048, 256, 8) and
qwen3_30b_a3b (4096, 2048, 768, 128, 8). Routing is uniform random top-k. Times are medians of
whole fwd+bwd steps between barriers (the baseline's host syncs are part of its cost), the slowest
rank's; 'err y' compares the two layers' outputs on rank 0 (the baseline is BF16: FP8 recipes show their
quantisation error there, ~6e-2)."""
import argparse
import datetime
import gc
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SHAPES = {  # name: (T per rank, H, I, E, K)
    "dsv3": (4096, 7168, 2048, 256, 8),
    "qwen3_30b_a3b": (4096, 2048, 768, 128, 8),
}
QUICK = {"quick": (96, 64, 48, 8, 2)}
QUICK_FP8 = {"quick": (64, 128, 128, 8, 2)}  # --quick with an FP8 recipe: bf16, H and I multiples of 128
# --recipes: the local experts' numerics (ExpertParallel.moe_experts' options); the exchange moves bf16 rows
RECIPES = {"bf16": {}, "blockwise": dict(recipe="blockwise"),
           "blockwise_all": dict(recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True), "mxfp8": dict(recipe="mxfp8")}


def local_experts_mlp(x_local, counts, gate_up, down, use_grouped_mm):
    """SwiGLU MLP of the local experts over rows grouped by expert (counts [El] rows each)."""
    I = gate_up.shape[1] // 2
    if use_grouped_mm:
        offs = torch.cumsum(counts.to(torch.int32), 0, dtype=torch.int32)
        h = torch._grouped_mm(x_local, gate_up.transpose(-2, -1), offs=offs)
        act = F.silu(h[:, :I]) * h[:, I:]
        return torch._grouped_mm(act, down.transpose(-2, -1), offs=offs)
    outs, start = [], 0
    for e, n in enumerate(counts.tolist()):
        xe = x_local[start:start + n]
        h = xe @ gate_up[e].t()
        outs.append((F.silu(h[:, :I]) * h[:, I:]) @ down[e].t())
        start += n
    return torch.cat(outs) if outs else x_local.new_zeros(0, down.shape[1])


def baseline_ep_experts(x, topk_idx, topk_w, gate_up, down, world, use_grouped_mm):
    """torchtitan-style EP experts of one rank: x [T, H], topk_idx [T, K] global ids, this rank's
    gate_up [E/W, 2I, H] and down [E/W, H, I]."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    T, K = topk_idx.shape
    El = gate_up.shape[0]
    E = El * world
    flat = topk_idx.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs by global expert: by destination rank, then expert
    send = x.index_select(0, order // K)
    counts = torch.bincount(flat, minlength=E)  # [E] pairs per global expert
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)  # [W * El]: my experts' counts from each source
    send_splits = counts.view(world, El).sum(1).tolist()  # host sync
    recv_splits = recv_counts.view(world, El).sum(1).tolist()  # host sync
    recv = all_to_all_single_autograd(send, recv_splits, send_splits, dist.group.WORLD)
    # received rows: by source rank, then local expert; the grouped GEMM wants them by local expert
    local_eid = torch.arange(El, device=x.device).repeat(world).repeat_interleave(recv_counts)
    perm = torch.argsort(local_eid, stable=True)
    out_local = local_experts_mlp(recv.index_select(0, perm), recv_counts.view(world, El).sum(0), gate_up, down,
                                  use_grouped_mm)
    back_rows = out_local.index_select(0, torch.argsort(perm))
    back = all_to_all_single_autograd(back_rows, send_splits, recv_splits, dist.group.WORLD)
    pairs = back.index_select(0, torch.argsort(order)).view(T, K, -1)
    return (pairs.float() * topk_w.float().unsqueeze(-1)).sum(1).to(x.dtype)


def time_steps_ms(step, device, iters, warmup):
    times = []
    for i in range(warmup + iters):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = torch.tensor([statistics.median(times)], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        ms = ms.to(device)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # the slowest rank's median
    return float(ms.item())


def _worker(rank, world, store, shapes, args, out_path):
    import mok.ep as ep
    from benchmarks.baselines import grouped_mm_available

    cuda = not args.quick and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=600), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=600))
    fp8 = any(r != "bf16" for r in args.recipes.split(","))
    dtype = torch.bfloat16 if cuda or fp8 else torch.float32
    use_gmm = cuda and grouped_mm_available("cuda", dtype)
    lines = []
    try:
        for name in shapes:
            T, H, I, E, K = ((QUICK_FP8 if fp8 else QUICK) if args.quick else SHAPES)[name]
            El = E // world
            gen = torch.Generator().manual_seed(1234)  # the same full weights on every rank
            gate_up_full = torch.randn(E, 2 * I, H, generator=gen) / H ** 0.5
            down_full = torch.randn(E, H, I, generator=gen) / I ** 0.5
            gu = gate_up_full[rank * El:(rank + 1) * El].to(device, dtype).requires_grad_(True)
            dn = down_full[rank * El:(rank + 1) * El].to(device, dtype).requires_grad_(True)
            gen.manual_seed(100 + rank)  # this rank's tokens and routing
            x = torch.randn(T, H, generator=gen).to(device, dtype).requires_grad_(True)
            idx = torch.rand(T, E, generator=gen).topk(K, dim=-1).indices.to(device)
            w = torch.rand(T, K, generator=gen).softmax(-1).to(device).requires_grad_(True)
            gy = torch.randn(T, H, generator=gen).to(device, dtype)
            group = ep.ExpertParallel(num_experts=E, max_tokens=T, top_k=K, hidden_size=H, dtype=dtype,
                                      device=device)

            def base_step():
                y = baseline_ep_experts(x, idx, w, gu, dn, world, use_gmm)
                torch.autograd.grad(y, (x, w, gu, dn), gy)

            t_base = time_steps_ms(base_step, device, args.iters, args.warmup)
            with torch.no_grad():
                b = baseline_ep_experts(x, idx, w, gu, dn, world, use_gmm).float()
            for recipe in args.recipes.split(","):
                options = RECIPES[recipe]

                def mok_step():
                    y = group.moe_experts(x, idx, w, gu, dn, **options)
                    torch.autograd.grad(y, (x, w, gu, dn), gy)

                with torch.no_grad():
                    a = group.moe_experts(x, idx, w, gu, dn, **options).float()
                    err = float((a - b).norm() / b.norm().clamp_min(1e-30))
                t_mok = time_steps_ms(mok_step, device, args.iters, args.warmup)
                group.check_errors(synchronize=True)
                lines.append(f"| {name} | {world} | {T} | {H} | {I} | {E} | {K} | {group.backend} | {recipe} | "
                             f"{'grouped_mm' if use_gmm else 'loop'} | {t_base:.3f} | {t_mok:.3f} | "
                             f"{t_base / t_mok:.2f}x | {err:.1e} |")
        # NOTE: every rank done before any tears its group down. Twice in CI (gloo, CPU; 2026-12-05
        # rank 1, 2026-12-06 rank 0) a worker aborted with "terminate called without an active
        # exception" (a C++ thread destroyed while joinable), never in 43 local runs, loaded or not.
        # Teardown is the likeliest place: the group's last references (ExpertParallel's, the
        # functional collectives' registry) die in the interpreter's finalisation, after
        # destroy_process_group, in no set order. So the references go first, and the worker leaves
        # without finalisation (os._exit) once its output is written.
        dist.barrier()
    finally:
        group = None
        gc.collect()
        dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w") as f:
            f.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=None, help="processes (default: every GPU; 2 with --quick)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list from " + ", ".join(SHAPES))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny shape, W = 2, CPU (gloo)")
    ap.add_argument("--recipes", default="bf16",
                    help="comma list of mok's local-expert recipes from " + ", ".join(RECIPES) +
                         " (blockwise_all: every expert GEMM in FP8); the baseline is BF16")
    args = ap.parse_args()
    for r in args.recipes.split(","):
        if r not in RECIPES:
            sys.exit(f"bench_ep_layer: --recipes takes names from {', '.join(RECIPES)}, got {r!r}")
    if args.quick:
        world, shapes = args.world or 2, list(QUICK)
    else:
        world, shapes = args.world or torch.cuda.device_count(), args.shapes.split(",")
        if world < 2 or world > torch.cuda.device_count():
            sys.exit(f"bench_ep_layer: needs --world between 2 and the {torch.cuda.device_count()} GPUs here "
                     "(or --quick for the CPU smoke test)")
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    print(f"torch {torch.__version__}, {world} ranks, "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.quick else 'CPU'}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print("| shape | W | T per rank | H | I | E | K | mok exchange | mok recipe | baseline GEMM | baseline fwd+bwd ms | "
          "mok fwd+bwd ms | mok vs baseline | err y |")
    print("|---|---|---|---|---|---|---|---|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.txt")
        mp.spawn(_worker, args=(world, os.path.join(d, "store"), shapes, args, out), nprocs=world, join=True)
        print(open(out).read(), end="")


if __name__ == "__main__":
    main()
