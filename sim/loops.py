"""Train (test AUC after every epoch), evaluate and benchmark inference for SimTrainer."""
from __future__ import annotations

import time

import numpy as np

from dataloader import DictPipeline
from data_parallel import gather_to_root
from metrics import log_loss, roc_auc
from progress import Progress
from sim.data import label as batch_label
from sim.data import model_inputs


def evaluate(trainer, spec, dataset) -> dict:
    """AUC and log loss over every test row (all ranks' rows gathered); {} off rank 0."""
    predictions, labels = [], []
    for batch in dataset:
        predictions.append(trainer.predict(model_inputs(spec, batch)).numpy())
        labels.append(batch_label(spec, batch).numpy())
    predictions = gather_to_root(trainer.comm, np.concatenate(predictions))
    labels = gather_to_root(trainer.comm, np.concatenate(labels))
    if labels is None:
        return {}
    return {"auc": roc_auc(labels, predictions), "test_loss": log_loss(labels, predictions),
            "test_samples": int(labels.size)}


def _train_batches(pipe, epoch, repeat_count, max_batches):
    """The epoch's batches: the training data `repeat_count` times, at most max_batches."""
    count = 0
    for _ in range(repeat_count):
        for batch in pipe.epoch(epoch):
            if max_batches and count >= max_batches:
                return
            count += 1
            yield batch


def train(trainer, spec, train_pipe, test_dataset, logger, position: dict, opts) -> dict:
    """opts: epochs, global_batch_size, repeat_count, max_batches_per_epoch, print_freq,
    benchmark, benchmark_warmup_steps, benchmark_steps. position: {'epoch', 'step'} to
    resume from (whole epochs)."""
    per_epoch = len(train_pipe) * opts.repeat_count
    if opts.max_batches_per_epoch:
        per_epoch = min(per_epoch, opts.max_batches_per_epoch)
    total = per_epoch * opts.epochs
    if opts.benchmark:
        total = min(total, opts.benchmark_warmup_steps + opts.benchmark_steps)
    progress = Progress(total, opts.global_batch_size)
    step, metrics, timed = position["step"], None, []
    for epoch in range(position["epoch"], opts.epochs):
        rows = 0  # training rows of the epoch (all ranks), logged with its evaluation
        for batch in _train_batches(train_pipe, epoch, opts.repeat_count,
                                    opts.max_batches_per_epoch):
            if step >= total:
                break
            start = time.perf_counter()
            loss = trainer.train_step(model_inputs(spec, batch), batch_label(spec, batch),
                                      batch[DictPipeline.GLOBAL_ROWS], step)
            timed.append((time.perf_counter() - start, int(batch[DictPipeline.GLOBAL_ROWS])))
            rows += timed[-1][1]
            step += 1
            progress.step_done()
            if step % opts.print_freq == 0 or step == total:
                report = progress.report(step)
                logger.log((epoch, step), {"loss": loss,
                                           "samples_per_second": report["samples_per_second"]})
                logger.print(progress.line(step, report, epoch=epoch, loss=loss))
        if opts.benchmark and step >= total:
            break
        metrics = evaluate(trainer, spec, test_dataset)
        if metrics:
            metrics["train_samples"] = rows
        logger.log((epoch, step), metrics)
        if metrics:
            logger.print(f"epoch {epoch}: test auc {metrics['auc']:.6f}  test_loss "
                         f"{metrics['test_loss']:.6f}")
        progress.restart_interval()
        position = {"epoch": epoch + 1, "step": step}
    if metrics is None:  # stopped inside the first epoch (--benchmark) or nothing to train
        metrics = evaluate(trainer, spec, test_dataset)
    final = dict(metrics, step=step)
    if opts.benchmark:
        final.update(_benchmark_figures(timed[opts.benchmark_warmup_steps:]))
    return final, position


def _benchmark_figures(timed) -> dict:
    if not timed:
        raise ValueError("--benchmark: no steps after --benchmark_warmup_steps; lower it or "
                         "raise --benchmark_steps / the data size")
    seconds = np.array([t for t, _ in timed])
    samples = sum(n for _, n in timed)
    return {"train_samples_per_second": samples / seconds.sum(),
            "train_step_seconds_mean": float(seconds.mean()), "benchmark_steps": len(timed)}


def benchmark_inference(trainer, spec, dataset, warmup: int, steps: int) -> dict:
    """Latency of predict() on the test batches (cycled), result copied to the host."""
    batches = [(model_inputs(spec, b), len(batch_label(spec, b))) for b in dataset.take(8)]
    if not batches:
        raise ValueError("--mode inference: the test data has no batch")
    for i in range(warmup):
        trainer.predict(batches[i % len(batches)][0]).numpy()
    latencies, samples = [], 0
    for i in range(steps):
        inputs, rows = batches[i % len(batches)]
        start = time.perf_counter()
        trainer.predict(inputs).numpy()
        latencies.append(time.perf_counter() - start)
        samples += rows
    latencies = np.array(latencies)
    return {"inference_samples_per_second": samples / latencies.sum(),
            **{f"p{q}_latency_seconds": float(np.percentile(latencies, q))
               for q in (90, 95, 99)}}
