"""Expert-parallel dispatch and combine bandwidth: GB/s per GPU of mok's exchange kernels against
torch.distributed.all_to_all_single (NCCL) and torch.ops.symm_mem.all_to_all_vdev_2d (NVSHMEM),
on the same routing. W = 2, 4, 8 processes when that many GPUs exist; otherwise virtual ranks on
one GPU (all W ranks in one launch; GB/s is then per virtual rank, sharing one GPU's memory).

    python benchmarks/bench_ep.py [--tokens 4096] [--hidden 7168] [--experts 64] [--topk 8]

GB/s counts the bytes of the rows a rank sends that leave it (routed pairs, bf16 rows), per call."""
import argparse
import datetime
import os
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


@dataclass(frozen=True)
class Config:
    tokens: int
    hidden: int
    experts: int
    topk: int


def cuda_time_ms(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def routing(cfg, ranks, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    scores = torch.rand(ranks, cfg.tokens, cfg.experts, generator=g)
    return scores.topk(cfg.topk, dim=-1).indices.to(device)


def row_gb(n_rows, cfg):
    return n_rows * cfg.hidden * 2 / 1e9


def bench_virtual(cfg, world):
    import mok.ep as ep

    dev = torch.device("cuda")
    x = torch.randn(world, cfg.tokens, cfg.hidden, device=dev, dtype=torch.bfloat16)
    idx = routing(cfg, world, dev)
    g = ep.VirtualExpertParallel(world, num_experts=cfg.experts, max_tokens=cfg.tokens, top_k=cfg.topk,
                                 hidden_size=cfg.hidden, dtype=torch.bfloat16, device=dev, backend="kernel")
    lay = g.layout(idx)
    recv, _eid, cnt = g._ex.dispatch(x, cfg.topk, lay)
    t_d = cuda_time_ms(lambda: g._ex.dispatch(x, cfg.topk, lay))
    t_c = cuda_time_ms(lambda: g._ex.combine(recv, cnt, lay))
    g.check_errors(synchronize=True)
    sent = int((lay.dst >= 0).sum()) / world  # rows per rank
    print(f"virtual W={world}: dispatch {t_d:.3f} ms ({row_gb(sent, cfg) / t_d * 1e3:.1f} GB/s per rank), "
          f"combine {t_c:.3f} ms ({row_gb(sent, cfg) / t_c * 1e3:.1f} GB/s per rank)")


def _worker(rank, world, path, cfg, out_path):
    import mok.ep as ep

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300), device_id=dev)
    lines = []
    try:
        x = torch.randn(1, cfg.tokens, cfg.hidden, device=dev, dtype=torch.bfloat16)
        idx = routing(cfg, world, dev)[rank:rank + 1]
        g = ep.ExpertParallel(num_experts=cfg.experts, max_tokens=cfg.tokens, top_k=cfg.topk,
                              hidden_size=cfg.hidden, dtype=torch.bfloat16, device=dev, backend="symm_mem")
        lay = g.layout(idx)
        recv, _eid, cnt = g._ex.dispatch(x, cfg.topk, lay)
        t_d = cuda_time_ms(lambda: g._ex.dispatch(x, cfg.topk, lay))
        t_c = cuda_time_ms(lambda: g._ex.combine(recv, cnt, lay))
        g.check_errors(synchronize=True)
        sent = int((lay.dst >= 0).sum())
        gb = row_gb(sent, cfg)
        lines.append(f"W={world} rank {rank}: mok dispatch {t_d:.3f} ms {gb / t_d * 1e3:.1f} GB/s, "
                     f"combine {t_c:.3f} ms {gb / t_c * 1e3:.1f} GB/s")
        # NCCL all_to_all_single on the same rows, split sizes known on the host (a real MoE would
        # have to sync to learn them).
        counts = lay.counts[0].tolist()
        order = torch.argsort(lay.dst[0].clamp(min=world).long() * (cfg.tokens * cfg.topk + 1) + lay.pos[0].long())
        rows = x[0, order[:sent] // cfg.topk].contiguous()
        in_splits = counts
        out_t = torch.tensor(counts, device=dev)
        recv_splits = torch.empty_like(out_t)
        dist.all_to_all_single(recv_splits, out_t)
        out_splits = recv_splits.tolist()
        out = torch.empty(sum(out_splits), cfg.hidden, device=dev, dtype=torch.bfloat16)
        t_n = cuda_time_ms(lambda: dist.all_to_all_single(out, rows, out_splits, in_splits))
        lines.append(f"W={world} rank {rank}: NCCL all_to_all_single {t_n:.3f} ms {gb / t_n * 1e3:.1f} GB/s "
                     f"(mok dispatch / NCCL = {t_d / t_n:.2f}x time)")
        try:
            lines.append(_bench_vdev_2d(cfg, world, rank, dev, rows, lay))
        except Exception as e:  # NVSHMEM missing or the op's limits (experts per rank <= 16)
            lines.append(f"W={world} rank {rank}: all_to_all_vdev_2d n/a ({type(e).__name__}: {str(e)[:120]})")
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w") as f:
            f.write("\n".join(lines) + "\n")


def _bench_vdev_2d(cfg, world, rank, dev, rows, lay):
    import torch.distributed._symmetric_memory as symm_mem

    symm_mem.set_backend("NVSHMEM")
    group = dist.group.WORLD.group_name
    El = cfg.experts // world
    cap = cfg.tokens * cfg.topk
    inp = symm_mem.empty(cap, cfg.hidden, dtype=torch.bfloat16, device=dev)
    out = symm_mem.empty(cap * world, cfg.hidden, dtype=torch.bfloat16, device=dev)
    # rank-major splits: per (destination rank, local expert)
    eids = lay.eid[0][lay.dst[0] >= 0].long() + lay.dst[0][lay.dst[0] >= 0].long() * El
    splits = torch.bincount(eids, minlength=cfg.experts).to(torch.int64)
    in_splits = symm_mem.empty(cfg.experts, dtype=torch.int64, device=dev).copy_(splits)
    out_so = symm_mem.empty(2, cfg.experts, dtype=torch.int64, device=dev)
    inp[: rows.shape[0]].copy_(rows)
    fn = lambda: torch.ops.symm_mem.all_to_all_vdev_2d(inp, out, in_splits, out_so, group)  # noqa: E731
    t = cuda_time_ms(fn)
    gb = row_gb(rows.shape[0], cfg)
    return f"W={world} rank {rank}: all_to_all_vdev_2d {t:.3f} ms {gb / t * 1e3:.1f} GB/s"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--topk", type=int, default=8)
    a = ap.parse_args()
    cfg = Config(a.tokens, a.hidden, a.experts, a.topk)
    n = torch.cuda.device_count()
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {cfg}")
    if n >= 2:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        for world in (2, 4, 8):
            if world > n:
                break
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "out.txt")
                mp.spawn(_worker, args=(world, os.path.join(d, "store"), cfg, out), nprocs=world, join=True)
                print(open(out).read(), end="")
    else:
        for world in (2, 4, 8):
            bench_virtual(Config(cfg.tokens // world, cfg.hidden, cfg.experts, cfg.topk), world)


if __name__ == "__main__":
    main()
