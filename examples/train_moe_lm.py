"""Train a small Qwen3-MoE-like decoder LM twice on the same synthetic data: once with mok.MoE layers
(mok's fused grouped-GEMM experts) and once with the same layers whose experts are the
torchtitan-style torch._grouped_mm peer (benchmarks/baselines.py). Same router, same initial weights
(one state dict loaded into both), same data, same seed; prints tokens/s and final losses and writes
both loss curves.

    python examples/train_moe_lm.py                          # ~0.9B parameters, bf16, on the GPU
    python examples/train_moe_lm.py --impl mok --steps 500
    python examples/train_moe_lm.py --quick                  # tiny model, CPU smoke test
    python examples/train_moe_lm.py --recipe blockwise       # mok's experts with FP8 GEMMs (forward and dgrad)
    python examples/train_moe_lm.py --recipe blockwise --fp8-backward all    # the weight gradients in FP8 too
    python examples/train_moe_lm.py --impl all               # mok BF16, mok FP8 (blockwise), baseline

Model: token embedding -> N x [RMSNorm -> causal attention (QK-RMSNorm, rotary, SDPA) -> residual,
RMSNorm -> mok.MoE (softmax top-k router, SwiGLU experts) -> residual] -> RMSNorm -> LM head.
Data: a fixed-seed first-order Markov chain over the first --data-vocab token ids (each has 4
successors with probabilities 0.5/0.25/0.15/0.1), so the loss falls from ln(V) towards the chain's
entropy (1.21 nats) within a few hundred steps; the model keeps the full --vocab embedding and head.
Outputs in --out: loss_curves.png (if matplotlib is installed), losses.csv, summary.json."""
import argparse
import csv
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import mok  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.baselines import GroupedMMExperts, grouped_mm_available  # noqa: E402

try:
    from tqdm import tqdm
except ImportError:  # plain prints instead
    tqdm = None

SUCCESSOR_PROBS = (0.5, 0.25, 0.15, 0.1)
IMPLS = ("mok", "mok_fp8", "baseline")  # mok_fp8: mok's layers with recipe="blockwise"


# ------------------------------------------------------------------------------------------------
# data: a deterministic Markov-chain token stream
# ------------------------------------------------------------------------------------------------


def markov_tokens(num_seqs: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    """[num_seqs, length] int64 in [0, vocab). Generated on the CPU with a fixed generator, so every run, device
    and implementation sees the same tokens; the chains advance in parallel, one position at a time."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab, (vocab, len(SUCCESSOR_PROBS)), generator=g)
    cum = torch.tensor(SUCCESSOR_PROBS, dtype=torch.float64).cumsum(0)
    choice = torch.searchsorted(cum, torch.rand(num_seqs, length, generator=g, dtype=torch.float64))
    choice.clamp_(max=len(SUCCESSOR_PROBS) - 1)
    toks = torch.empty(num_seqs, length, dtype=torch.int64)
    toks[:, 0] = torch.randint(0, vocab, (num_seqs,), generator=g)
    for t in range(1, length):
        toks[:, t] = succ[toks[:, t - 1], choice[:, t]]
    return toks


def chain_entropy() -> float:
    return -sum(p * math.log(p) for p in SUCCESSOR_PROBS)


# ------------------------------------------------------------------------------------------------
# model
# ------------------------------------------------------------------------------------------------


def rotary_tables(seq: int, head_dim: int, device, base: float = 1e6):
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)  # [S, D/2]
    return ang.cos(), ang.sin()


def apply_rotary(x, cos, sin):
    """x [B, h, S, D]: rotate the (first half, second half) pairs (the Llama / Qwen convention)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, hidden, heads, rope=True):
        super().__init__()
        self.heads, self.head_dim, self.rope = heads, hidden // heads, rope
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.q_norm, self.k_norm = nn.RMSNorm(self.head_dim), nn.RMSNorm(self.head_dim)  # Qwen3's QK-norm

    def forward(self, x, cos, sin):
        B, S, H = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, self.head_dim).transpose(1, 3).unbind(2)  # [B, h, S, D]
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, S, H))


class Block(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.attn_norm, self.moe_norm = nn.RMSNorm(args.hidden), nn.RMSNorm(args.hidden)
        self.attn = Attention(args.hidden, args.heads, rope=args.rope)
        fp8 = {"fp8_dgrad": args.fp8_backward in ("dgrad", "all", "all_tiled"),
               "fp8_wgrad": {"all": True, "all_tiled": "tiled"}.get(args.fp8_backward, False)}
        self.moe = mok.MoE(args.hidden, args.inter, args.experts, args.top_k, recipe=args.recipe,
                           **(fp8 if args.recipe == "blockwise" else {}))

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.moe(self.moe_norm(x))


class MoELM(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.hidden)
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.layers))
        self.norm = nn.RMSNorm(args.hidden)
        self.head = nn.Linear(args.hidden, args.vocab, bias=False)
        self.head_dim = args.hidden // args.heads
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens):
        cos, sin = rotary_tables(tokens.shape[1], self.head_dim, tokens.device)
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.head(self.norm(x))


def build_model(args, impl, device, dtype):
    """The same module tree for every implementation: 'baseline' swaps each MoE's experts for
    GroupedMMExperts, which has the same parameters and state-dict keys; 'mok_fp8' is mok with
    recipe="blockwise" (same parameters)."""
    if impl == "mok_fp8":
        args = argparse.Namespace(**{**vars(args), "recipe": "blockwise"})
    with torch.device(device):
        model = MoELM(args)
        if impl == "baseline":
            for blk in model.blocks:
                blk.moe.experts = GroupedMMExperts(args.experts, args.hidden, args.inter)
    return model.to(dtype)


def count_params(model, args):
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = total - experts + experts * args.top_k // args.experts
    return total, active


# ------------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------------


def train(model, data, args, impl, device):
    """Returns per-step losses (read back once at the end: no host sync per step beyond the
    progress display) and the throughput over the steps after warm-up."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, min(args.lr_warmup, args.steps // 10))

    def lr_at(step):  # linear warm-up, cosine decay to 10%
        if step < warm:
            return (step + 1) / warm
        t = (step - warm) / max(1, args.steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    losses = torch.zeros(args.steps, device=device)
    skip = min(args.timing_skip, args.steps - 1)  # first steps (allocator, autotuning) are not timed
    torch.manual_seed(args.seed)
    model.train()
    bar = tqdm(range(args.steps), desc=f"{impl:8s}", dynamic_ncols=True) if tqdm and not args.no_progress else None
    t0 = time.perf_counter()
    for step in range(args.steps):
        if step == skip:
            common.sync(device)
            t0 = time.perf_counter()
        batch = data[step].to(device, non_blocking=True)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        losses[step] = loss.detach()
        if step % args.log_every == 0 or step == args.steps - 1:
            if bar is not None:
                bar.set_postfix(loss=f"{losses[step].item():.3f}")
            else:
                print(f"{impl:8s} step {step:5d}/{args.steps}  loss {losses[step].item():.4f}", flush=True)
        if bar is not None:
            bar.update(1)
    common.sync(device)
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    tokens = (args.steps - skip) * args.batch * args.seq
    return losses.tolist(), tokens / elapsed, elapsed / (args.steps - skip)


# ------------------------------------------------------------------------------------------------
# outputs
# ------------------------------------------------------------------------------------------------


def write_outputs(out_dir, runs, summary):
    os.makedirs(out_dir, exist_ok=True)
    names = list(runs)
    with open(os.path.join(out_dir, "losses.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + [f"loss_{n}" for n in names])
        for s in range(len(runs[names[0]]["losses"])):
            w.writerow([s] + [f"{runs[n]['losses'][s]:.6f}" for n in names])
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: wrote {out_dir}/losses.csv and summary.json, no PNG")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for n in names:
        ax.plot(runs[n]["losses"], label=f"{n} ({runs[n]['tokens_per_s']:,.0f} tokens/s)", lw=1.2)
    ax.axhline(chain_entropy(), color="gray", ls="--", lw=0.8, label="data entropy")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats)")
    ax.set_title(summary["title"], fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "loss_curves.png"), dpi=120)
    print(f"wrote {out_dir}/loss_curves.png, losses.csv and summary.json")


# ------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=None, help="attention heads (default hidden // 128)")
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--inter", type=int, default=512, help="intermediate size of each expert")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--data-vocab", type=int, default=2048,
                   help="token ids the synthetic chain uses (<= --vocab): fewer ids learn faster")
    p.add_argument("--no-rope", dest="rope", action="store_false")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-warmup", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--impl", choices=("both", "all") + IMPLS, default="both",
                   help="both: mok and baseline; all: mok, mok_fp8 (recipe blockwise) and baseline")
    p.add_argument("--recipe", choices=("bf16", "blockwise"), default="bf16",
                   help="mok's expert recipe (blockwise: FP8 E4M3 GEMMs with DeepSeek-V3's scales); the baseline stays bf16")
    p.add_argument("--fp8-backward", choices=("bf16", "dgrad", "all", "all_tiled"), default="dgrad",
                   help="with the blockwise recipe: which backward GEMMs run in FP8 (bf16: none; dgrad: the two "
                        "dgrad GEMMs, the fastest in bench_moe_layer.py v9; all: dgrad and weight gradients; "
                        "all_tiled: the same with fp8_wgrad='tiled')")
    p.add_argument("--out", default=os.path.join(ROOT, "examples", "out", "train_moe_lm"))
    p.add_argument("--timing-skip", type=int, default=5, help="first steps left out of tokens/s")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a tqdm bar")
    p.add_argument("--quick", action="store_true", help="tiny model and data, for a CPU smoke test")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.seq, args.layers = min(args.steps, 30), 4, 64, 2
        args.hidden, args.heads, args.experts, args.top_k, args.inter, args.vocab = 64, 4, 8, 2, 32, 256
        if args.recipe == "blockwise":  # whole 128-wide FP8 scale blocks, bf16
            args.hidden, args.inter, args.dtype = 128, 128, "bf16"
    if args.impl in ("all", "mok_fp8") and args.quick:
        args.hidden, args.inter, args.dtype = 128, 128, "bf16"
        args.lr, args.timing_skip, args.log_every = 3e-3, 3, 5
    args.data_vocab = min(args.data_vocab, args.vocab)
    args.heads = args.heads or max(1, args.hidden // 128)
    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        p.error(f"--hidden {args.hidden} must split into --heads {args.heads} heads of even size")
    return args


def main(argv=None):
    args = parse_args(argv)
    device = common.pick_device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    impls = {"both": ["mok", "baseline"], "all": list(IMPLS)}.get(args.impl, [args.impl])
    env = common.environment(device)
    common.print_environment(env)

    # One initial state for every implementation (built with mok layers; the keys are the same).
    torch.manual_seed(args.seed)
    init = build_model(args, "mok", device, dtype)
    total, active = count_params(init, args)
    init_state = {k: v.detach().clone() for k, v in init.state_dict().items()}
    del init
    data = markov_tokens(args.steps * args.batch, args.seq + 1, args.data_vocab, args.seed).view(
        args.steps, args.batch, args.seq + 1)
    if device.type == "cuda":
        data = data.pin_memory()
    print(f"model: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, {args.experts} experts x "
          f"inter {args.inter}, top-{args.top_k}, vocab {args.vocab}: {total / 1e6:.1f}M parameters "
          f"({active / 1e6:.1f}M active per token), {dtype}")
    print(f"data: {args.steps} steps x {args.batch} x {args.seq} tokens over {args.data_vocab} ids; "
          f"loss floor {chain_entropy():.3f} nats, start ~ln(V) = {math.log(args.vocab):.2f}")
    if "baseline" in impls and not grouped_mm_available(device.type, dtype):
        print(f"NOTE: torch._grouped_mm does not run on {device.type}/{dtype}: the baseline is the naive loop")

    runs = {}
    for impl in impls:
        model = build_model(args, impl, device, dtype)
        model.load_state_dict(init_state)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        losses, tps, step_s = train(model, data, args, impl, device)
        peak = torch.cuda.max_memory_allocated(device) / common.GIB if device.type == "cuda" else float("nan")
        tail = losses[-min(10, len(losses)):]
        runs[impl] = dict(losses=losses, tokens_per_s=tps, ms_per_step=step_s * 1e3, first_loss=losses[0],
                          final_loss=sum(tail) / len(tail), peak_gib=peak)
        del model
        common.free_memory(device)

    ref = runs.get("baseline", {}).get("tokens_per_s")
    rows = [dict(impl=n, tokens_per_s=r["tokens_per_s"], ms_per_step=r["ms_per_step"], first_loss=r["first_loss"],
                 final_loss=r["final_loss"], peak_gib=r["peak_gib"],
                 ratio=(r["tokens_per_s"] / ref) if ref else float("nan")) for n, r in runs.items()]
    columns = [("impl", "impl", ""), ("tokens_per_s", "tokens/s", ",.0f"), ("ms_per_step", "ms/step", ".1f"),
               ("first_loss", "first loss", ".3f"), ("final_loss", "final loss (last 10)", ".4f"),
               ("peak_gib", "peak GiB", ".2f"), ("ratio", "tokens/s vs baseline", ".2f")]
    print("\n" + common.format_table(rows, columns))
    summary = dict(title=f"MoE LM {total / 1e6:.0f}M params ({active / 1e6:.0f}M active), {args.layers}L "
                         f"E{args.experts} top-{args.top_k}, {args.batch}x{args.seq} tokens/step, {env['device']}"
                         + (f", mok recipe {args.recipe}" if args.recipe != "bf16" else "")
                         + (f", FP8 backward GEMMs: {args.fp8_backward}"
                            if args.recipe == "blockwise" or "mok_fp8" in runs else ""),
                   env=env, args=vars(args), params_total=total, params_active=active, loss_floor=chain_entropy(),
                   results={n: {k: v for k, v in r.items() if k != "losses"} for n, r in runs.items()})
    if "mok" in runs and "mok_fp8" in runs:
        # FP8 against BF16 on the same layers, init and data (mok is deterministic)
        f8, b16 = runs["mok_fp8"]["final_loss"], runs["mok"]["final_loss"]
        summary["final_loss_rel_diff_fp8_vs_bf16"] = abs(f8 - b16) / abs(b16)
        summary["tokens_per_s_ratio_fp8_vs_bf16"] = runs["mok_fp8"]["tokens_per_s"] / runs["mok"]["tokens_per_s"]
        print(f"final loss (last 10 steps): mok FP8 {f8:.4f}, mok BF16 {b16:.4f}, relative difference "
              f"{summary['final_loss_rel_diff_fp8_vs_bf16']:.2%}; tokens/s FP8 / BF16 "
              f"{summary['tokens_per_s_ratio_fp8_vs_bf16']:.2f}")
    if "mok" in runs and "baseline" in runs:
        a, b = runs["mok"]["losses"], runs["baseline"]["losses"]
        n = min(20, len(a))
        summary["max_abs_loss_diff_first_20_steps"] = max(abs(x - y) for x, y in zip(a[:n], b[:n]))
        summary["tokens_per_s_ratio_mok_vs_baseline"] = runs["mok"]["tokens_per_s"] / ref
        fa, fb = runs["mok"]["final_loss"], runs["baseline"]["final_loss"]
        summary["final_loss_rel_diff"] = abs(fa - fb) / abs(fb)
        print(f"final loss (last 10 steps): mok {fa:.4f}, baseline {fb:.4f}, relative difference "
              f"{summary['final_loss_rel_diff']:.2%}")
        print(f"\nmax |loss(mok) - loss(baseline)| over the first {n} steps: "
              f"{summary['max_abs_loss_diff_first_20_steps']:.4f} (same init and data; bf16 rounding differs)")
    write_outputs(args.out, runs, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
