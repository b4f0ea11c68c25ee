"""Shared test and benchmark inputs: `enumerate_*` lists of cases, `make_*` builders.

Routing kinds cover the ragged cases every kernel must survive: balanced random routing, an expert
with no tokens, one expert taking every token (as far as top-k allows), Zipf-like skew."""
from dataclasses import dataclass

import torch

# Tolerances on ||out - ref|| / ||ref|| against the float64 reference, per dtype.
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}


@dataclass(frozen=True)
class MoECase:
    T: int
    H: int
    I: int
    E: int
    K: int
    routing: str = "random"

    def __str__(self):
        return f"T{self.T}-H{self.H}-I{self.I}-E{self.E}-K{self.K}-{self.routing}"


def enumerate_moe_cases(small=True):
    cases = [
        MoECase(0, 32, 16, 4, 2),  # no tokens
        MoECase(1, 32, 16, 4, 1),  # one token, K = 1
        MoECase(1, 32, 16, 4, 4),  # K = E
        MoECase(37, 48, 40, 6, 2, "empty_expert"),
        MoECase(53, 64, 24, 5, 1, "one_expert"),
        MoECase(64, 130, 66, 8, 3, "zipf"),  # H, I not multiples of 128 (nor of 8)
        MoECase(150, 96, 136, 16, 4, "random"),  # more rows than one plan tile
    ]
    if not small:
        cases += [MoECase(1024, 256, 384, 32, 8, "random"), MoECase(777, 200, 100, 9, 2, "zipf")]
    return cases


def make_routing(T, K, E, kind="random", generator=None, device="cpu"):
    """topk_idx [T, K] int64 with distinct experts per token, following the routing kind."""
    g = generator
    if T == 0:
        return torch.empty(0, K, dtype=torch.int64, device=device)
    if kind == "random":
        idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    elif kind == "empty_expert":  # expert E-1 (and expert 0 for K < E-1) never chosen
        pool = torch.arange(1, E - 1) if K <= E - 2 else torch.arange(E - 1)
        idx = torch.stack([pool[torch.randperm(len(pool), generator=g)[:K]] for _ in range(T)])
    elif kind == "one_expert":  # expert 2 in every token's first slot
        rest = torch.tensor([e for e in range(E) if e != 2])
        idx = torch.stack([torch.cat([torch.tensor([2]), rest[torch.randperm(len(rest), generator=g)[: K - 1]]])
                           for _ in range(T)])
    elif kind == "zipf":
        p = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** 1.2
        idx = torch.stack([torch.multinomial(p, K, replacement=False, generator=g) for _ in range(T)])
    else:
        raise ValueError(kind)
    return idx.to(device)


def make_moe_inputs(case: MoECase, dtype, device="cpu", seed=None, requires_grad=False):
    """(x, topk_idx, topk_w, gate_up [E, 2I, H], down [E, H, I]) with fresh random values."""
    g = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(0, 2**31, ()).item()))
    T, H, I, E, K = case.T, case.H, case.I, case.E, case.K
    x = torch.randn(T, H, generator=g, dtype=torch.float64)
    gate_up = torch.randn(E, 2 * I, H, generator=g, dtype=torch.float64) / H**0.5
    down = torch.randn(E, H, I, generator=g, dtype=torch.float64) / I**0.5
    idx = make_routing(T, K, E, case.routing, g)
    w = torch.rand(T, K, generator=g, dtype=torch.float64) + 0.1
    out = [t.to(device=device, dtype=dtype) for t in (x, gate_up, down)]
    x, gate_up, down = out
    w = w.to(device=device, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    if requires_grad:
        for t in (x, gate_up, down, w):
            t.requires_grad_(True)
    return x, idx.to(device), w, gate_up, down


def rel_err(out, ref):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    if ref.numel() == 0:
        return 0.0
    denom = ref.norm()
    if denom == 0:
        return float(out.norm())
    return float((out - ref).norm() / denom)



def topk_w_grad_of_rows(experts, g, x, idx, gate_up, down):
    """float64 [T, K] d_topk_w[t, k] = <g_t, rows_t,k>, with rows_t,k the expert outputs that
    `experts` (an MoE experts function: x, idx, w, gate_up, down -> y) itself computes for pair
    (t, k), taken one k at a time with weight 1.

    The reference for the topk_w gradient of an FP8 or MXFP8 recipe. Comparing it with a float64
    emulation is ill-conditioned: each entry is a dot product over H that can cancel, and the
    emulation's act can land in another E4M3 code or block scale than the kernel's (its h is
    rounded to bf16 after another fp32 summation order), which moves rows by an E4M3 step; with
    T = 1 that one event is the whole gradient (5-15% seen on the H200). The rows themselves are
    checked against the emulation through y; per row the recipes quantise and sum the same way
    whatever the other rows, so a K = 1 call gives the rows of the K-way call bit for bit."""
    T, K = idx.shape
    ones = torch.ones(T, 1, dtype=torch.float32, device=x.device)
    g64 = g.detach().double().cpu()
    with torch.no_grad():
        cols = [(experts(x.detach(), idx[:, k:k + 1].contiguous(), ones, gate_up.detach(), down.detach())
                 .double().cpu() * g64).sum(dim=1) for k in range(K)]
    return torch.stack(cols, dim=1) if cols else torch.zeros(T, 0, dtype=torch.float64)


def topk_w_err(got, ref, g, x, idx, gate_up, down):
    """||got - ref|| of a topk_w gradient measured against its Cauchy-Schwarz scale
    sqrt(sum_t,k (||g_t|| ||rows_t,k||)^2), rows in float64 BF16 math: a dot product that cancels
    does not inflate the error, and a wrong row or expert still errs by ~1/sqrt(H)."""
    from mok import reference

    x64, gu64, dn64 = (t.detach().double().cpu() for t in (x, gate_up, down))
    idx = idx.detach().cpu()
    T, K = idx.shape
    ones = torch.ones(T, 1, dtype=torch.float64)
    rows_norm = torch.stack([reference.moe_experts(x64, idx[:, k:k + 1], ones, gu64, dn64).norm(dim=1)
                             for k in range(K)], dim=1)
    scale = (g.detach().double().cpu().norm(dim=1)[:, None] * rows_norm).norm()
    diff = (got.detach().double().cpu() - ref.detach().double().cpu()).norm()
    return float(diff / scale) if scale > 0 else float(diff)


def make_gather_case(T, K, R, device, gen):
    """(src_of_row [R] int32, w [T, K] fp32) for the ops on a plan's gathered rows: src_of_row as a plan
    makes it (t * K + k, -1 for padding) with the last pair's row repeated; routing weights as the
    backward's d_rows = gather(dy, w) has them, with a zero, a negative, a NaN and huge ones (products
    that round, overflow or saturate)."""
    src = torch.randint(-1, T * K, (R,), generator=gen, dtype=torch.int32)
    if T * K:
        src[: min(R, 5)] = T * K - 1
    w = torch.rand(T, K, generator=gen) * 4 - 1
    w.view(-1)[::5] = 0
    w.view(-1)[3::11] = float("nan")
    w.view(-1)[1::13] = 3e38
    return src.to(device), w.to(device)
