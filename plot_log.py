"""Training curves from a DLLogger log: loss per step and AUC per evaluation, as a PNG.

  python plot_log.py dlrm_log.json --out curves.png
"""
from __future__ import annotations

import argparse
import os
import sys

from dllog import read_log


def curves(records):
    loss, auc = [], []
    for r in records:
        if r["type"] != "LOG" or not isinstance(r["step"], list) or len(r["step"]) != 2:
            continue
        step, data = r["step"][1], r["data"]
        if "loss" in data:
            loss.append((step, data["loss"]))
        if "auc" in data:
            auc.append((step, data["auc"]))
    return loss, auc


def plot(log_path: str, out_path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    loss, auc = curves(read_log(log_path))
    if not loss and not auc:
        raise ValueError(f"{log_path}: no loss or auc records to plot")
    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(11, 4))
    if loss:
        ax_loss.plot(*zip(*loss), color="tab:blue")
    ax_loss.set(title="training loss", xlabel="step", ylabel="binary cross-entropy")
    if auc:
        ax_auc.plot(*zip(*auc), marker="o", color="tab:green")
    ax_auc.set(title="evaluation AUC", xlabel="step", ylabel="ROC AUC")
    for ax in (ax_loss, ax_auc):
        ax.grid(alpha=0.3)
    fig.suptitle(os.path.basename(log_path))
    fig.tight_layout()
    tmp = out_path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out_path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="DLLogger JSON-lines log written by main.py --log_path")
    parser.add_argument("--out", default="curves.png", help="PNG to write")
    args = parser.parse_args(argv)
    try:
        plot(args.log, args.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
