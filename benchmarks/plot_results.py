"""Plots benchmarks/RESULTS.md's MoE-layer table (a bench_moe_layer.py JSON) as grouped bars of
fwd+bwd time per shape and implementation:

    python benchmarks/plot_results.py RESULT.json OUT.png ["TITLE"]"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst, title="MoE experts layer on one H200, bf16, balanced routing"):
    data = json.load(open(src))
    rows = data["results"] if isinstance(data, dict) and "results" in data else data
    shapes = sorted({r["shape"] for r in rows}, key=[r["shape"] for r in rows].index)
    impls = sorted({r["impl"] for r in rows}, key=[r["impl"] for r in rows].index)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        for ax, key in zip(axes, ("fwd_ms", "fwd_bwd_ms")):
            vals = [next((r.get(key) or 0 for r in rows if r["shape"] == s and r["impl"] == impl), 0) for s in shapes]
            ax.bar([j + i * width for j in range(len(shapes))], vals, width, label=impl)
    for ax, panel in zip(axes, ("forward (ms, lower is better)", "forward + backward (ms, lower is better)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes)
        ax.tick_params(axis="x", labelrotation=12)
        ax.set_title(panel)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:4])
