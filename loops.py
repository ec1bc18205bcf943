"""The train / eval / inference loops (progress, periodic evaluation, checkpoints)."""
from __future__ import annotations

import time

import numpy as np

from data_parallel import gather_to_root
from metrics import log_loss, roc_auc
from progress import Progress, StepTimer


def step_collectives_text(trainer) -> str:
    """What a rank waits in during a training step, for the stall report."""
    names = trainer.step_collectives()
    dense = [n for n in names if n.startswith("dense_grad_")]
    shown = [n for n in names if n not in dense]
    if dense:
        shown.insert(shown.index("loss"), f"{len(dense)} dense_grad_*")
    return f"the training step's collectives ({', '.join(shown)})"


def evaluate(trainer, pipe) -> dict:
    """AUC and mean log loss over every row of the evaluation data. Only rank 0 gathers the
    predictions of all ranks (eval memory per rank does not grow with the world size); it
    computes the exact figures and broadcasts them."""
    comm = trainer.comm
    predictions, labels = [], []
    for batch in pipe.epoch():
        predictions.append(trainer.predict(batch).numpy())
        labels.append(batch[2].numpy())
    predictions = np.concatenate(predictions) if predictions else np.zeros(0, np.float32)
    labels = np.concatenate(labels) if labels else np.zeros(0, np.float32)
    predictions, labels = gather_to_root(comm, predictions), gather_to_root(comm, labels)
    figures = np.zeros(3)
    if comm.rank == 0:
        figures = np.array([roc_auc(labels, predictions), log_loss(labels, predictions),
                            labels.size], np.float64)
    auc, loss, samples = comm.broadcast_from_root(figures)
    return {"auc": float(auc), "validation_loss": float(loss), "eval_samples": int(samples)}


class _Reporter:
    """Progress lines and records; an interval's steps, time and all-to-all bytes are
    restarted together after an evaluation or a checkpoint."""

    def __init__(self, trainer, logger, total_steps: int, samples_per_step: int):
        self.trainer, self.logger = trainer, logger
        self.progress = Progress(total_steps, samples_per_step, clock=time.perf_counter)
        self.counts_bytes = hasattr(trainer.comm, "alltoall_bytes_sent")
        self.bytes_sent = self._bytes()

    def _bytes(self) -> int:
        return self.trainer.comm.alltoall_bytes_sent() if self.counts_bytes else 0

    def restart(self) -> None:
        self.progress.restart_interval()
        self.bytes_sent = self._bytes()

    def report(self, epoch: int, step: int, loss) -> None:
        self.trainer.check_finite()  # the only host sync of the training steps
        report = self.progress.report(step)
        lr = self.trainer.schedule(step - 1)
        loss = float(loss)
        record = {"loss": loss, "learning_rate": lr,
                  "samples_per_second": report["samples_per_second"]}
        if self.counts_bytes:
            sent = self._bytes()
            record["alltoall_bytes_per_step_rank0"] = ((sent - self.bytes_sent)
                                                       / max(report["interval_steps"], 1))
            self.bytes_sent = sent
        self.logger.log((epoch, step), record)
        self.logger.print(self.progress.line(step, report, epoch=epoch, loss=loss, lr=lr))


def next_position(step: int, epoch: int, batch_in_epoch: int, steps_per_epoch: int) -> dict:
    """Where a resumed run starts: the batch after the last one trained."""
    if batch_in_epoch == steps_per_epoch:
        epoch, batch_in_epoch = epoch + 1, 0
    return {"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch}


def _evaluate_and_log(trainer, eval_pipe, logger, epoch: int, step: int) -> dict:
    trainer.check_finite()
    with trainer.comm.waiting("the evaluation (all-to-all, gather and broadcast)", step):
        metrics = evaluate(trainer, eval_pipe)
    logger.log((epoch, step), metrics)
    logger.print(f"eval at step {step}: auc {metrics['auc']:.6f}  "
                 f"validation_loss {metrics['validation_loss']:.6f}")
    return metrics


def train(trainer, train_pipe, eval_pipe, logger, position: dict, flags) -> dict:
    steps_per_epoch = len(train_pipe)
    if steps_per_epoch == 0:
        raise ValueError(f"the training data has fewer rows than one batch "
                         f"(--batch_size {flags.batch_size})")
    total_steps = steps_per_epoch * flags.epochs
    if flags.max_steps > 0:
        total_steps = min(total_steps, flags.max_steps)
    eval_every = max(steps_per_epoch // flags.evals_per_epoch, 1)
    step, epoch, batch_in_epoch = (position["step"], position["epoch"],
                                   position["batch_in_epoch"])
    metrics, last_eval_step, train_start = {}, None, time.perf_counter()
    reporter = _Reporter(trainer, logger, total_steps, flags.batch_size)
    timer = StepTimer(flags.batch_size, flags.benchmark_warmup_steps, clock=time.perf_counter)

    def save():
        if flags.save_checkpoint_path:
            import checkpoint
            trainer.check_finite()
            with trainer.comm.waiting("the checkpoint's barrier", step):
                checkpoint.save(flags.save_checkpoint_path, trainer,
                                next_position(step, epoch, batch_in_epoch, steps_per_epoch))
            logger.log((epoch, step), {"checkpoint_saved": flags.save_checkpoint_path})
            logger.print(f"checkpoint saved at step {step}: {flags.save_checkpoint_path}")

    logger.print(f"training: {total_steps} steps ({steps_per_epoch} per epoch), global batch "
                 f"{flags.batch_size}, {trainer.comm.size} process(es)")
    collectives = step_collectives_text(trainer)
    while step < total_steps and epoch < flags.epochs:
        for batch in train_pipe.epoch(epoch, batch_in_epoch):
            with trainer.comm.waiting(collectives, step + 1), timer.step():
                loss = trainer.train_step(batch, step)
            step, batch_in_epoch = step + 1, batch_in_epoch + 1
            reporter.progress.step_done()
            if step % flags.print_freq == 0 or step == total_steps:
                reporter.report(epoch, step, loss)
            if batch_in_epoch % eval_every == 0 or batch_in_epoch == steps_per_epoch \
                    or step == total_steps:
                metrics, last_eval_step = _evaluate_and_log(trainer, eval_pipe, logger,
                                                            epoch, step), step
                reporter.restart()
            if flags.checkpoint_steps and step % flags.checkpoint_steps == 0:
                save()
                reporter.restart()
            if step >= total_steps:
                break  # the epoch is not advanced here: save() derives the next position
        else:
            epoch, batch_in_epoch = epoch + 1, 0
    if last_eval_step != step:
        metrics = _evaluate_and_log(trainer, eval_pipe, logger, epoch, step)
    elapsed = time.perf_counter() - train_start
    final = dict(metrics, step=step, training_seconds=elapsed, **timer.summary())
    logger.log((), final)
    throughput = (f", {final['throughput']:,.0f} samples/s over {final['timed_steps']} timed "
                  f"steps" if "throughput" in final else
                  f", no step after the {flags.benchmark_warmup_steps} warm-up steps timed")
    logger.print(f"done: step {step}, auc {metrics.get('auc', float('nan')):.6f}, "
                 f"{elapsed:.1f} s{throughput}")
    save()
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
