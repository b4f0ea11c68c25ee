"""python -m mok: build a small MoE language model, check mok against the reference (forward and
backward), train it for a few hundred steps (on the GPU if there is one) and print a table."""
import argparse
import contextlib
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

import mok
from mok import reference

TEXT = (
    "Mixture-of-Experts layers route every token to a few experts out of many. "
    "mok runs the router, the grouped expert GEMMs with fused SwiGLU and the weighted combine "
    "as its own kernels, forward and backward, with no host synchronisation. "
).encode()


class RMSNorm(nn.Module):
    def __init__(self, dim, **kw):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **kw))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.weight


class TinyMoELM(nn.Module):
    """Byte-level LM: embedding, `layers` blocks of (RMSNorm -> mok.MoE) with residuals, head.
    impl="reference" runs the same parameters through mok.reference (a per-expert loop)."""

    def __init__(self, hidden, inter, experts, top_k, layers, impl="mok", **kw):
        super().__init__()
        self.impl = impl
        self.embed = nn.Embedding(256, hidden, **kw)
        self.norms = nn.ModuleList([RMSNorm(hidden, **kw) for _ in range(layers)])
        self.moes = nn.ModuleList([mok.MoE(hidden, inter, experts, top_k, **kw) for _ in range(layers)])
        self.head = nn.Linear(hidden, 256, bias=False, **kw)

    def forward(self, tokens):
        h = self.embed(tokens)
        for norm, moe in zip(self.norms, self.moes):
            z = norm(h)
            if self.impl == "mok":
                h = h + moe(z)
            else:
                h = h + reference.moe_layer(z, moe.router.weight, moe.experts.gate_up_proj, moe.experts.down_proj,
                                            moe.top_k, renormalize=moe.router.norm_topk_prob)
        return self.head(h)


def batches(batch, seq, device, seed=0):
    data = torch.tensor(list(TEXT * (1 + batch * (seq + 1) // len(TEXT))), dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        chunk = torch.stack([data[s : s + seq + 1] for s in starts.tolist()])
        yield chunk[:, :-1].to(device), chunk[:, 1:].to(device)


def loss_of(model, x, y):
    return F.cross_entropy(model(x).float().reshape(-1, 256), y.reshape(-1))


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def grads_of(model, x, y, amp):
    model.zero_grad(set_to_none=True)
    with amp:
        out = model(x)
        loss_of(model, x, y).backward()
    return out.detach(), [p.grad.detach().clone() for p in model.parameters()]


def check_against_reference(cfg, device, dtype, amp):
    """One batch through mok, through the reference in the same precision (the per-expert loop,
    same autocast) and through the reference in float64. mok passes when its error against float64
    is at most twice the same-precision reference's error plus a small tolerance (the rule of the
    test suite): top-k routing flips at near ties make bf16 errors larger than one GEMM's."""
    torch.manual_seed(1)
    model = TinyMoELM(**cfg, device=device, dtype=dtype)
    same = TinyMoELM(**cfg, impl="reference", device=device, dtype=dtype)
    same.load_state_dict(model.state_dict())
    ref = TinyMoELM(**cfg, impl="reference", dtype=torch.float64)
    ref.load_state_dict({k: v.double().cpu() for k, v in model.state_dict().items()})
    x, y = next(batches(4, 64, device, seed=7))
    out, grads = grads_of(model, x, y, amp)
    out_same, grads_same = grads_of(same, x, y, amp)
    out_ref, grads_ref = grads_of(ref, x.cpu(), y.cpu(), contextlib.nullcontext())
    out_err = (rel_err(out.cpu(), out_ref), rel_err(out_same.cpu(), out_ref))
    g_err = [(rel_err(g.cpu(), r), rel_err(s.cpu(), r)) for g, s, r in zip(grads, grads_same, grads_ref)]
    worst = max(g_err, key=lambda e: e[0] - 2 * e[1])
    return out_err, worst


def time_steps(model, opt, data, steps, sync, amp):
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        x, y = next(data)
        with amp:
            loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    sync()
    return (time.perf_counter() - start) * 1e3 / steps, [float(v) for v in losses]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ref-steps", type=int, default=5, help="steps timed for the reference (it is slow)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if on_gpu and not mok.has_cuda_kernels():
        raise SystemExit("mok was built without CUDA kernels; reinstall where nvcc and a CUDA torch exist")
    # On the GPU: fp32 master weights, bf16 compute under autocast (mok's kernels run in bf16).
    dtype = torch.float32
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if on_gpu else contextlib.nullcontext()
    cfg = (dict(hidden=512, inter=1024, experts=16, top_k=2, layers=4) if on_gpu
           else dict(hidden=64, inter=128, experts=8, top_k=2, layers=2))
    batch, seq = (16, 256) if on_gpu else (8, 64)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)

    out_err, grad_err = check_against_reference(cfg, device, dtype, amp)

    torch.manual_seed(0)
    model = TinyMoELM(**cfg, device=device, dtype=dtype)
    ref_model = TinyMoELM(**cfg, impl="reference", device=device, dtype=dtype)
    ref_model.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=3e-3)
    time_steps(model, opt, batches(batch, seq, device, seed=3), 3, sync, amp)  # warm-up
    ref_ms, _ = time_steps(ref_model, ref_opt, batches(batch, seq, device, seed=3), args.ref_steps, sync, amp)
    mok_ms, losses = time_steps(model, opt, batches(batch, seq, device), args.steps, sync, amp)

    tokens = batch * seq
    tol = 1e-2 if on_gpu else 1e-4
    ok_out = out_err[0] <= 2 * out_err[1] + tol
    ok_grad = grad_err[0] <= 2 * grad_err[1] + tol
    rows = [
        ("device", torch.cuda.get_device_name(device) if on_gpu else "cpu"),
        ("precision", "bf16 autocast, fp32 weights" if on_gpu else "float32"),
        ("model", f"{cfg['layers']} MoE layers, H={cfg['hidden']} I={cfg['inter']} E={cfg['experts']} "
                  f"K={cfg['top_k']}, {tokens} tokens/step"),
        ("rel. error vs fp64: output, mok / same-precision ref",
         f"{out_err[0]:.2e} / {out_err[1]:.2e} ({'ok' if ok_out else 'FAIL'})"),
        ("rel. error vs fp64: worst gradient, mok / same-precision ref",
         f"{grad_err[0]:.2e} / {grad_err[1]:.2e} ({'ok' if ok_grad else 'FAIL'})"),
        ("ms per step, mok", f"{mok_ms:.2f}"),
        ("ms per step, reference (per-expert loop)", f"{ref_ms:.2f}"),
        ("tokens/s, mok", f"{tokens / mok_ms * 1e3:,.0f}"),
        ("tokens/s, reference", f"{tokens / ref_ms * 1e3:,.0f}"),
        (f"loss, step 1 -> step {args.steps}", f"{losses[0]:.3f} -> {sum(losses[-10:]) / len(losses[-10:]):.3f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    ok = ok_out and ok_grad and math.isfinite(losses[-1]) and losses[-1] < losses[0]
    if not ok:
        raise SystemExit("mok demo: FAILED (see the table)")


if __name__ == "__main__":
    main()
