"""The train / eval / inference loops (progress, periodic evaluation, checkpoints)."""
from __future__ import annotations

import time

import numpy as np

from metrics import log_loss, roc_auc


def format_seconds(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def evaluate(trainer, pipe) -> dict:
    """AUC and mean log loss over every row of the evaluation data (all ranks gathered)."""
    comm = trainer.comm
    predictions, labels = [], []
    for batch in pipe.epoch():
        predictions.append(trainer.predict(batch).numpy())
        labels.append(batch[2].numpy())
    predictions = np.concatenate(predictions) if predictions else np.zeros(0, np.float32)
    labels = np.concatenate(labels) if labels else np.zeros(0, np.float32)
    predictions = np.asarray(comm.allgather(predictions))
    labels = np.asarray(comm.allgather(labels))
    return {"auc": roc_auc(labels, predictions), "validation_loss": log_loss(labels, predictions),
            "eval_samples": int(labels.size)}


def train(trainer, train_pipe, eval_pipe, logger, position: dict, flags) -> dict:
    steps_per_epoch = len(train_pipe)
    if steps_per_epoch == 0:
        raise ValueError(f"the training data has fewer rows than one batch "
                         f"(--batch_size {flags.batch_size})")
    total_steps = steps_per_epoch * flags.epochs
    if flags.max_steps > 0:
        total_steps = min(total_steps, flags.max_steps)
    eval_every = max(steps_per_epoch // flags.evals_per_epoch, 1)
    step = position["step"]
    start_epoch, start_batch = position["epoch"], position["batch_in_epoch"]
    metrics, last_eval_step = {}, None
    interval_start, interval_steps, train_start = time.time(), 0, time.time()
    samples_per_step = flags.batch_size
    bytes_sent = 0

    def save(epoch, batch_in_epoch):
        if flags.save_checkpoint_path:
            import checkpoint
            if batch_in_epoch == steps_per_epoch:
                epoch, batch_in_epoch = epoch + 1, 0
            checkpoint.save(flags.save_checkpoint_path, trainer,
                            {"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch})
            logger.log((epoch, step), {"checkpoint_saved": flags.save_checkpoint_path})
            logger.print(f"checkpoint saved at step {step}: {flags.save_checkpoint_path}")

    logger.print(f"training: {total_steps} steps ({steps_per_epoch} per epoch), global batch "
                 f"{flags.batch_size}, {trainer.comm.size} process(es)")
    epoch, batch_in_epoch = start_epoch, start_batch
    for epoch in range(start_epoch, flags.epochs):
        if step >= total_steps:
            break
        first = start_batch if epoch == start_epoch else 0
        batch_in_epoch = first
        for batch in train_pipe.epoch(epoch, first):
            loss = trainer.train_step(batch, step)
            step += 1
            batch_in_epoch += 1
            interval_steps += 1
            if step % flags.print_freq == 0 or step == total_steps:
                now = time.time()
                throughput = interval_steps * samples_per_step / (now - interval_start)
                eta = (total_steps - step) * samples_per_step / throughput
                lr = trainer.schedule(step - 1)
                record = {"loss": loss, "learning_rate": lr, "samples_per_second": throughput}
                if hasattr(trainer.comm, "alltoall_bytes_sent"):
                    sent = trainer.comm.alltoall_bytes_sent()
                    record["alltoall_bytes_per_step_rank0"] = (sent - bytes_sent) / interval_steps
                    bytes_sent = sent
                logger.log((epoch, step), record)
                logger.print(f"step {step}/{total_steps}  epoch {epoch}  loss {loss:.5f}  "
                             f"lr {lr:.4g}  samples/s {throughput:,.0f}  "
                             f"ETA {format_seconds(eta)}")
                interval_start, interval_steps = time.time(), 0
            if batch_in_epoch % eval_every == 0 or batch_in_epoch == steps_per_epoch \
                    or step == total_steps:
                metrics = evaluate(trainer, eval_pipe)
                last_eval_step = step
                logger.log((epoch, step), metrics)
                logger.print(f"eval at step {step}: auc {metrics['auc']:.6f}  "
                             f"validation_loss {metrics['validation_loss']:.6f}")
                interval_start = time.time()
            if flags.checkpoint_steps and step % flags.checkpoint_steps == 0:
                save(epoch, batch_in_epoch)
            if step >= total_steps:
                break
    if last_eval_step != step:
        metrics = evaluate(trainer, eval_pipe)
    elapsed = time.time() - train_start
    final = dict(metrics, step=step, training_seconds=elapsed)
    logger.log((), final)
    logger.print(f"done: step {step}, auc {metrics.get('auc', float('nan')):.6f}, "
                 f"{elapsed:.1f} s")
    save(epoch, batch_in_epoch)
    return final


def benchmark_inference(trainer, pipe, steps: int, warmup: int = 10, distinct: int = 8) -> dict:
    """Latency of the prediction step alone: a few batches are loaded once and cycled, and
    every timing includes copying the result to the host."""
    batches = []
    for batch in pipe.epoch():
        batches.append(batch)
        if len(batches) == distinct:
            break
    if not batches:
        raise ValueError("no evaluation data for the inference benchmark")
    for i in range(warmup):
        trainer.predict(batches[i % len(batches)]).numpy()
    latencies, samples = [], 0
    for i in range(steps):
        batch = batches[i % len(batches)]
        start = time.perf_counter()
        trainer.predict(batch).numpy()
        latencies.append(time.perf_counter() - start)
        samples += int(batch[0].shape[0])
    latencies = np.asarray(latencies)
    return {"mean_inference_throughput": samples / latencies.sum(),
            "mean_inference_latency": float(latencies.mean()),
            "p90_inference_latency": float(np.percentile(latencies, 90)),
            "p95_inference_latency": float(np.percentile(latencies, 95)),
            "p99_inference_latency": float(np.percentile(latencies, 99))}
