"""Epoch loop (progress lines, per-epoch evaluation, checkpoints), evaluation with MAP@12,
and the training / evaluation throughput benchmarks."""
from __future__ import annotations

import time

import numpy as np

from data_parallel import gather_to_root
from metrics import log_loss, mean_average_precision_at_k, roc_auc
from progress import Progress

MAP_AT = 12


def evaluate(trainer, pipe, label: str, display: str = None) -> dict:
    """Log loss, AUC and (when `display` names the map feature) MAP@12 over every test row,
    gathered on rank 0 (other ranks return {})."""
    scores, labels, groups = [], [], []
    for batch in pipe.epoch():
        scores.append(trainer.predict(batch))
        labels.append(batch[label].numpy())
        if display:
            groups.append(batch[display].numpy())
    comm = trainer.comm
    scores = gather_to_root(comm, np.concatenate(scores).astype(np.float64))
    labels = gather_to_root(comm, np.concatenate(labels).astype(np.float64))
    groups = gather_to_root(comm, np.concatenate(groups)) if display else None
    if comm.rank != 0:
        return {}
    out = {"eval_loss": log_loss(labels, scores), "auc": roc_auc(labels, scores),
           "eval_samples": int(labels.size)}
    if display:
        out["map12"] = mean_average_precision_at_k(groups, labels, scores, MAP_AT)
    return out


def metrics_text(metrics: dict) -> str:
    return "  ".join(f"{k} {metrics[k]:.6f}" for k in ("train_loss", "eval_loss", "auc", "map12")
                     if k in metrics)


def train(trainer, train_pipe, eval_pipe, logger, save, position: dict, epochs: int,
          global_batch: int, evaluate_fn, print_freq: int = 100) -> dict:
    """Epochs position['epoch'] .. epochs-1; after each: evaluate, log, save(position)."""
    steps_per_epoch = len(train_pipe)
    step, metrics = position["step"], {}
    progress = Progress(steps_per_epoch * epochs, global_batch)
    for epoch in range(position["epoch"], epochs):
        losses = []
        for batch in train_pipe.epoch(epoch):
            losses.append(trainer.train_step(batch, step))
            step += 1
            progress.step_done()
            if step % print_freq == 0:
                report = progress.report(step)
                logger.log((epoch, step), {"loss": losses[-1],
                                           "samples_per_second": report["samples_per_second"]})
                logger.print(progress.line(step, report, epoch=epoch, loss=losses[-1]))
        metrics = dict(evaluate_fn(), train_loss=float(np.mean(losses)))
        logger.log((epoch, step), metrics)
        logger.print(f"epoch {epoch} (step {step}): {metrics_text(metrics)}")
        save({"epoch": epoch + 1, "step": step})
        progress.restart_interval()
    return metrics


def benchmark(run_step, pipe, warmup_steps: int, steps: int) -> dict:
    """Samples/s of `run_step(batch, step)` over `steps` steps after `warmup_steps`, cycling
    through the data's epochs; samples are the rows of the global batches (a last, partial
    batch counts its rows)."""
    def batches():
        epoch = 0
        while True:
            yield from pipe.epoch(epoch)
            epoch += 1

    source = batches()
    for step in range(warmup_steps):
        run_step(next(source), step)
    samples, start = 0, time.perf_counter()
    for step in range(warmup_steps, warmup_steps + steps):
        batch = next(source)
        run_step(batch, step)
        samples += int(batch[pipe.GLOBAL_ROWS])
    elapsed = time.perf_counter() - start
    return {"samples_per_second": samples / elapsed, "samples": samples, "steps": steps,
            "seconds": elapsed}
