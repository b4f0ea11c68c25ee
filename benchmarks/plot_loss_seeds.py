"""Loss curves of examples/train_moe_lm.py runs with different seeds, mok against the baseline, one
panel per seed: python benchmarks/plot_loss_seeds.py OUT.png SEED=LOSSES.csv [SEED=LOSSES.csv ...]
(each CSV as train_moe_lm.py writes it: step, loss_mok, loss_baseline)."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return ([int(r["step"]) for r in rows], [float(r["loss_mok"]) for r in rows],
            [float(r["loss_baseline"]) for r in rows])


def main(dst, runs):
    fig, axes = plt.subplots(1, len(runs), figsize=(4.5 * len(runs), 3.6), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs):
        seed, path = run.split("=", 1)
        steps, mok, base = read(path)
        ax.plot(steps, base, label="baseline (torch._grouped_mm)", color="tab:gray")
        ax.plot(steps, mok, label="mok", color="tab:blue", linestyle="--")
        tail = lambda v: sum(v[-10:]) / len(v[-10:])  # noqa: E731
        ax.set_title(f"seed {seed}: final mok {tail(mok):.3f}, baseline {tail(base):.3f}")
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training loss")
    axes[0][0].legend()
    fig.suptitle("train_moe_lm.py, 200 steps, one H200: same init and data per seed, bf16")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
