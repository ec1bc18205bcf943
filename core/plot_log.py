"""Training curves from a DLLogger log: loss per step (labelled with what the run's loss
is), AUC (and MAP@12 when logged; retrieval: NDCG@10 and HR@10) per evaluation, with the kept (or best) evaluation marked,
as a PNG.

  python plot_log.py dlrm_log.json --out curves.png
"""
from __future__ import annotations

import argparse
import os
import sys

from core.cli import run_cli
from core.dllog import read_log
from core.files import write_error


# evaluation metrics drawn when the log has them: key -> (panel title, y label)
EVAL_PANELS = {"auc": ("evaluation AUC", "ROC AUC"),
               "map12": ("evaluation MAP@12", "mean average precision at 12"),
               "ndcg@10": ("evaluation NDCG@10", "NDCG at 10 (full ranking)"),
               "hr@10": ("evaluation HR@10", "hit rate at 10 (full ranking)")}


def curves(records):
    """(training loss [(step, value)], {eval metric: [(step, value)]}) from the per-step
    records ([epoch, step]) of a log."""
    loss, evals = [], {key: [] for key in EVAL_PANELS}
    for r in records:
        if r["type"] != "LOG" or not isinstance(r["step"], list) or len(r["step"]) != 2:
            continue
        step, data = r["step"][1], r["data"]
        if "loss" in data:
            loss.append((step, data["loss"]))
        for key, points in evals.items():
            if key in data:
                points.append((step, data[key]))
    return loss, {k: v for k, v in evals.items() if v}


def run_facts(records) -> tuple:
    """(what the loss is, (step, label) of the evaluation to mark or None, {metric: the
    held-out test's figure}) from the run's records without a step: its loss_name, and its
    final record's kept (else best) step and test figures (when selection read a validation
    split)."""
    loss_name, marked, held_out = "binary cross-entropy", None, {}
    for r in records:
        if r["type"] != "LOG" or r["step"] != []:
            continue
        data = r["data"]
        loss_name = data.get("loss_name", loss_name)
        if "kept_step" in data:
            marked = (data["kept_step"], f"kept: epoch {data['kept_epoch']}")
        elif "best_step" in data:
            marked = (data["best_step"], f"best: epoch {data['best_epoch']} (not kept)")
        held_out = {k: data[f"test_{k}"] for k in EVAL_PANELS if f"test_{k}" in data}
    return loss_name, marked, held_out


def plot(log_path: str, out_path: str) -> None:
    """Training loss, then one panel per evaluation metric found (AUC when none is)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    records = read_log(log_path)
    loss, evals = curves(records)
    loss_name, marked, held_out = run_facts(records)
    if not loss and not evals:
        raise ValueError(f"{log_path}: no loss or {', '.join(EVAL_PANELS)} records to plot")
    panels = list(evals) or ["auc"]
    fig, axes = plt.subplots(1, 1 + len(panels), figsize=(5.5 * (1 + len(panels)), 4))
    if loss:
        axes[0].plot(*zip(*loss), color="tab:blue")
    axes[0].set(title="training loss", xlabel="step", ylabel=loss_name)
    for ax, key, color in zip(axes[1:], panels, ("tab:green", "tab:orange")):
        if key in evals:
            ax.plot(*zip(*evals[key]), marker="o", color=color)
            at = dict(evals[key]).get(marked[0]) if marked else None
            if at is not None:
                test = f" (held-out test {held_out[key]:.4f})" if key in held_out else ""
                ax.plot([marked[0]], [at], marker="*", markersize=16, color="tab:red",
                        linestyle="none", label=f"{marked[1]}: {at:.4f}{test}")
                ax.legend(loc="best")
        title, ylabel = EVAL_PANELS[key]
        if held_out:
            title = title.replace("evaluation", "validation")
        ax.set(title=title, xlabel="step", ylabel=ylabel)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(os.path.basename(log_path))
    fig.tight_layout()
    tmp = out_path + ".tmp.png"
    try:
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, out_path)
    except OSError as e:  # a full disk: the previous PNG stays, no partial one is left
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise write_error(out_path, e) from None
    finally:
        plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="DLLogger JSON-lines log written by main.py --log_path")
    parser.add_argument("--out", default="curves.png", help="PNG to write")
    args = parser.parse_args(argv)

    def work():
        plot(args.log, args.out)
        return f"wrote {args.out}"
    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
