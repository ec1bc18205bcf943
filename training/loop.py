"""The one training loop of every family: progress, evaluation, checkpoints, the benchmark
figures; and evaluation and the inference benchmark on their own.

A family gives a `Trainer` (engine.py), its data as step-ready batches (`len(data)`,
`data.epoch(epoch, start_batch)`), a function that evaluates, and a LoopConfig made from its
flags. Every family logs the same metric names (the seed's, DLRM's):
  per step       loss, learning_rate (or <group>_learning_rate), samples_per_second
  evaluation     auc, validation_loss, eval_samples, map12 (Wide & Deep); train_loss and
                 train_samples (mean loss and rows of the epoch's steps so far)
  selection      best_epoch, best_step and the selection metric's best value (best_<metric>)
                 after each evaluation (training/selection.py)
  final          the kept evaluation (with keep_best; else the last), kept_epoch, kept_step,
                 test_auc, test_loss, test_samples, test_map12 (the held-out test data at
                 that state, when the data has a validation split to select on), step,
                 training_seconds, throughput, mean_step_time_ms, timed_steps, timed_samples
  inference      mean_inference_throughput, mean_inference_latency, p90/p95/p99_inference_latency
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from core.cli import ERROR_STATUS
from core.parallel.comm import PeerStopped
from training.interrupt import StopOnSignal
from training.metrics import log_loss, mean_average_precision_at_k, roc_auc
from training.progress import Progress, StepTimer
from training.selection import Selection, best_state_path

MAP_AT = 12


def gather_to_root(comm, array: np.ndarray):
    """Every rank's rows concatenated in rank order on rank 0 (None elsewhere); only rank 0
    holds them, so evaluation memory per rank does not grow with the world size."""
    gathered = comm.gather_to_root(np.asarray(array))
    return np.asarray(gathered) if comm.rank == 0 else None


@dataclass(frozen=True)
class LoopConfig:
    epochs: int
    batch_size: int                     # global rows of a step (progress, ETA)
    print_freq: int = 100
    evals_per_epoch: int = 1            # the last one at the epoch's end
    max_steps: int = 0                  # 0: no limit
    batches_per_epoch: int = 0          # 0: every batch of the data (times repeat_count)
    repeat_count: int = 1               # passes over the data in one epoch
    checkpoint_steps: int = 0           # also save every this many steps
    checkpoint_every_epoch: bool = False
    benchmark_warmup_steps: int = 0     # steps left out of the final throughput
    benchmark_steps: int = 0            # > 0: a benchmark run: warm-up + this many steps,
    #                                     cycling the data, no evaluation or checkpoint
    selection_metric: str = "auc"       # the validation figure that picks the best evaluation
    keep_best: bool = False             # end on the best evaluation's state (checkpoint, export)
    early_stopping_patience: int = 0    # > 0: stop after this many evaluations without a better one

    def steps_per_epoch(self, data_batches: int) -> int:
        steps = data_batches * max(self.repeat_count, 1)
        return min(steps, self.batches_per_epoch) if self.batches_per_epoch else steps

    def total_steps(self, steps_per_epoch: int) -> int:
        if self.benchmark_steps:
            return self.benchmark_warmup_steps + self.benchmark_steps
        total = steps_per_epoch * self.epochs
        return min(total, self.max_steps) if self.max_steps > 0 else total


@dataclass(frozen=True)
class Checkpoints:
    """A family's checkpoints: save(path, position) writes the training state, restore(path)
    loads it and returns its position; `path` is the run's checkpoint (None: none is saved)."""
    path: Optional[str]
    save: Callable[[str, dict], None]
    restore: Callable[[str], dict]


def evaluate(trainer, batches, groups=None) -> dict:
    """AUC, mean log loss and (when `groups(batch)` gives display ids) MAP@12 over every row
    of `batches`. Rank 0 alone gathers every rank's predictions (evaluation memory per rank
    does not grow with the world size), computes the figures and broadcasts them."""
    comm = trainer.comm
    predictions, labels, group_ids = [], [], []
    for batch in batches:
        predictions.append(np.asarray(trainer.predict(batch), np.float64))
        labels.append(np.asarray(trainer.label(batch), np.float64))
        if groups:
            group_ids.append(np.asarray(groups(batch)))
    predictions, labels = (gather_to_root(comm, _concat(a)) for a in (predictions, labels))
    group_ids = gather_to_root(comm, _concat(group_ids)) if groups else None
    figures = np.zeros(4)
    if comm.rank == 0:
        figures[:3] = roc_auc(labels, predictions), log_loss(labels, predictions), labels.size
        if groups:
            figures[3] = mean_average_precision_at_k(group_ids, labels, predictions, MAP_AT)
    auc, loss, samples, map_at = comm.broadcast_from_root(figures)
    out = {"auc": float(auc), "validation_loss": float(loss), "eval_samples": int(samples)}
    return dict(out, map12=float(map_at)) if groups else out


def _concat(arrays):
    return np.concatenate(arrays) if arrays else np.zeros(0)


# an evaluation's keys -> the held-out test's (the final record holds both); any other key k
# (retrieval's hr@K, ndcg@K, mrr) -> test_k
TEST_KEYS = {"validation_loss": "test_loss", "eval_samples": "test_samples"}
# the figures a progress line shows, when an evaluation has them
SHOWN = ("train_loss", "auc", "validation_loss", "map12", "hr@10", "ndcg@10")


def test_key(key: str) -> str:
    return TEST_KEYS.get(key, f"test_{key}")


def metrics_text(metrics: dict, also=()) -> str:
    return "  ".join(f"{k} {metrics[k]:.6f}" for k in dict.fromkeys((*SHOWN, *also))
                     if k in metrics)


def log_result(logger, title: str, metrics: dict) -> None:
    """The final record of an evaluation or a benchmark, logged and printed in one line."""
    logger.log((), metrics)
    logger.print(f"{title}: " + ", ".join(f"{k} {v:.6g}" for k, v in metrics.items()))


def step_collectives_text(trainer) -> str:
    """What a rank waits in during a training step, for the stall report."""
    names = trainer.step_collectives()
    dense = [n for n in names if n.startswith("dense_grad_")]
    shown = [n for n in names if n not in dense]
    if dense:
        shown.insert(shown.index("loss"), f"{len(dense)} dense_grad_*")
    return f"the training step's collectives ({', '.join(shown)})"


def next_position(step: int, epoch: int, batch_in_epoch: int, steps_per_epoch: int) -> dict:
    """Where a resumed run starts: the batch after the last one trained."""
    if batch_in_epoch == steps_per_epoch:
        epoch, batch_in_epoch = epoch + 1, 0
    return {"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch}


def epoch_batches(data, epoch: int, start: int, steps_per_epoch: int, repeat_count: int):
    """Batches start.. of an epoch: `repeat_count` passes over the data, at most
    steps_per_epoch batches."""
    passes = (data.epoch(epoch, max(start - p * len(data), 0))
              for p in range(max(repeat_count, 1)) if start < (p + 1) * len(data))
    return itertools.islice(itertools.chain.from_iterable(passes), steps_per_epoch - start)


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
        self.trainer.check_diverged()  # the only host sync of the training steps
        report = self.progress.report(step)
        rates = self.trainer.learning_rates(step - 1)
        loss = float(loss)
        record = {"loss": loss, **rates, "samples_per_second": report["samples_per_second"]}
        if self.counts_bytes:
            sent = self._bytes()
            record["alltoall_bytes_per_step_rank0"] = ((sent - self.bytes_sent)
                                                       / max(report["interval_steps"], 1))
            self.bytes_sent = sent
        self.logger.log((epoch, step), record)
        shown = {k.replace("learning_rate", "lr"): v for k, v in rates.items()}
        self.logger.print(self.progress.line(step, report, epoch=epoch, loss=loss, **shown))


class _Run:
    """One call of train(): the position, the counters and what happens between steps."""

    def __init__(self, trainer, data, evaluator, logger, config: LoopConfig, position,
                 checkpoints: Optional[Checkpoints], test: Optional[Callable[[], dict]]):
        self.trainer, self.data, self.evaluator, self.test = trainer, data, evaluator, test
        self.stop = StopOnSignal(trainer.comm.rank, kept=self._kept_text)
        self.logger, self.config, self.checkpoints = logger, config, checkpoints
        if config.keep_best and not (checkpoints and checkpoints.path):
            raise ValueError("keeping the best evaluation's state needs a checkpoint path "
                             "(the state is kept beside the run's checkpoint)")
        self.steps_per_epoch = config.steps_per_epoch(len(data))
        if self.steps_per_epoch == 0:
            raise ValueError(f"the training data has fewer rows than one batch "
                             f"(global batch {config.batch_size})")
        self.total_steps = config.total_steps(self.steps_per_epoch)
        self.eval_every = max(self.steps_per_epoch // config.evals_per_epoch, 1)
        self.step, self.epoch = position["step"], position["epoch"]
        self.start_step = self.step
        self.batch_in_epoch = position.get("batch_in_epoch", 0)
        self.selection = Selection.resumed(config.selection_metric,
                                           config.early_stopping_patience, position,
                                           config.keep_best)
        self.metrics, self.last_eval_step, self.last_saved_step = {}, None, None
        self.reporter = _Reporter(trainer, logger, self.total_steps, config.batch_size)
        self.timer = StepTimer(config.benchmark_warmup_steps, clock=time.perf_counter)
        # the epoch's step losses are kept as they come (adding them would cost an op per
        # step) and summed when an evaluation reports their mean; rows (all ranks) on the host
        self.epoch_losses, self.epoch_rows = [], 0

    @property
    def benchmark(self) -> bool:
        return self.config.benchmark_steps > 0

    @property
    def finished(self) -> bool:
        return self.step >= self.total_steps or self.selection.stopped_early

    def evaluate(self, select: bool = True) -> None:
        """One evaluation; `select`: it takes part in model selection (not when it only
        re-evaluates a state a resumed run has already judged)."""
        self.trainer.check_diverged()
        with self.trainer.comm.waiting("the evaluation (gather and broadcast)", self.step):
            metrics = self.evaluator()
        if self.epoch_losses:
            metrics.update(train_loss=float(np.mean([np.asarray(loss, np.float64)
                                                     for loss in self.epoch_losses])),
                           train_samples=self.epoch_rows)
        self.metrics, self.last_eval_step = metrics, self.step
        self.logger.log((self.epoch, self.step), metrics)
        was_stopped = self.selection.stopped_early
        improved = select and self.selection.update(metrics, self.epoch, self.step)
        self.logger.print(f"eval at step {self.step} (epoch {self.epoch}): "
                          f"{metrics_text(metrics, self.selection.shown())}"
                          f"{self._selection_text(select, improved)}")
        if improved and self.config.keep_best:
            self.selection.kept_at = best_state_path(self.checkpoints.path)
            self._save_to(self.selection.kept_at, "the best state's barrier")
        if self.selection.stopped_early and not was_stopped:
            self.logger.print(f"early stopping at step {self.step}: no better "
                              f"{self.selection.metric} in {self.selection.since_best} "
                              f"evaluations; the best: {self.selection.text()}")
        self.reporter.restart()

    def _selection_text(self, select: bool, improved: bool) -> str:
        if not select:
            return ""
        if improved:
            return "  (best so far)"
        return (f"  (best: epoch {self.selection.best_epoch}, "
                f"{self.selection.since_best} evaluation(s) since)")

    def position(self) -> dict:
        """Where a resumed run starts, with the selection's counters."""
        return dict(next_position(self.step, self.epoch, self.batch_in_epoch,
                                  self.steps_per_epoch), selection=self.selection.state())

    def _save_to(self, path: str, barrier: str) -> None:
        self.trainer.check_diverged()  # a diverged state is never saved
        with self.stop.saving, self.trainer.comm.waiting(barrier, self.step):
            self.stop.check(self.step)  # a signal's line, once out, names the last save
            self.checkpoints.save(path, self.position())
            if path == self.checkpoints.path:  # before an interrupt's line names it
                self.last_saved_step = self.step
        self.logger.log((self.epoch, self.step), {"checkpoint_saved": path})
        self.logger.print(f"checkpoint saved at step {self.step}: {path}")
        self.reporter.restart()

    def _kept_text(self) -> str:
        """What an interrupt now leaves at the checkpoint path."""
        path = self.checkpoints.path if self.checkpoints else None
        if not path or self.benchmark:
            return "this run writes no checkpoint"
        if self.last_saved_step is None:
            return f"this run has saved no checkpoint yet; what {path} held before it stays"
        return f"the checkpoint of step {self.last_saved_step} stays at {path}"

    def save(self) -> None:
        if self.checkpoints is None or not self.checkpoints.path or self.benchmark \
                or self.last_saved_step == self.step:
            return
        self._save_to(self.checkpoints.path, "the checkpoint's barrier")

    def after_step(self, loss, rows: int) -> None:
        config, end_of_epoch = self.config, self.batch_in_epoch == self.steps_per_epoch
        self.epoch_losses.append(loss)
        self.epoch_rows += rows
        if self.step % config.print_freq == 0 or self.step == self.total_steps:
            self.reporter.report(self.epoch, self.step, loss)
        if self.benchmark:
            return
        if self.batch_in_epoch % self.eval_every == 0 or end_of_epoch \
                or self.step == self.total_steps:
            self.evaluate()
        if (config.checkpoint_steps and self.step % config.checkpoint_steps == 0) or \
                (config.checkpoint_every_epoch and end_of_epoch):
            self.save()

    def run_epoch(self) -> None:
        collectives = step_collectives_text(self.trainer)
        for batch in epoch_batches(self.data, self.epoch, self.batch_in_epoch,
                                   self.steps_per_epoch, self.config.repeat_count):
            rows = self.trainer.global_rows(batch)
            with self.trainer.comm.waiting(collectives, self.step + 1), self.timer.step(rows):
                loss = self.trainer.train_step(batch, self.step)
            self.step, self.batch_in_epoch = self.step + 1, self.batch_in_epoch + 1
            self.reporter.progress.step_done()
            self.stop.check(self.step)  # before the step's evaluation or checkpoint
            self.after_step(loss, rows)
            if self.finished:
                return  # the epoch is not advanced here: position() derives the next one
        self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        self.epoch_losses, self.epoch_rows = [], 0

    def run(self) -> dict:
        config, start = self.config, time.perf_counter()
        self.logger.print(f"training: {self.total_steps} steps ({self.steps_per_epoch} per "
                          f"epoch), global batch {config.batch_size}, "
                          f"{self.trainer.comm.size} process(es)")
        self.logger.log((), {"loss_name": getattr(self.trainer, "loss_name", "loss")})
        if self.selection.stopped_early:
            self.logger.print(f"this run had stopped early (patience spent; the state of "
                              f"step {self.step}): no step to train")
        with self.stop:
            try:
                while not self.finished and (self.benchmark or self.epoch < config.epochs):
                    self.run_epoch()
            except PeerStopped:
                if self.stop.stopped_by_signal(wait_s=self.stop.grace_s):
                    raise SystemExit(ERROR_STATUS) from None  # the signal's line is out
                raise
        self.trainer.check_diverged()
        if not self.benchmark and self.last_eval_step != self.step:
            self.evaluate(select=self.step != self.start_step)
        trained_steps, elapsed = self.step, time.perf_counter() - start
        if not self.benchmark and config.keep_best:
            self._restore_best()
        final = dict(self.metrics, step=trained_steps, training_seconds=elapsed,
                     **self.timer.summary(), **self._kept_fields(), **self._held_out_test())
        self.logger.log((), final)
        self.logger.print(f"done: step {trained_steps}, {self._final_text(final)}, "
                          f"{elapsed:.1f} s{_throughput_text(final, config)}")
        self.save()
        return final

    def _restore_best(self) -> None:
        """End on the best evaluation's state: load it (unless it is the current one) with
        the position and counters it was saved with, so the final checkpoint and export are
        that state, and a run resumed from it retrains (and re-evaluates) what followed it
        exactly as this run did. Only whether patience was spent is carried over."""
        best = self.selection
        if best.best_step < 0:
            return
        if best.best_step != self.step:
            position = self.checkpoints.restore(best.kept_at)
            self.step, self.epoch = position["step"], position["epoch"]
            self.batch_in_epoch = position.get("batch_in_epoch", 0)
            self.selection = Selection.resumed(best.metric, best.patience, position, True)
            self.selection.stopped_early = best.stopped_early
            self.last_saved_step = None
            self.logger.print(f"kept the best evaluation's state: {best.text()}")
        self.metrics = dict(best.best_figures)

    def _held_out_test(self) -> dict:
        """The test data's figures at the final (kept) state, when selection read a separate
        validation split: the figures to report, never looked at while choosing."""
        if self.test is None or self.benchmark:
            return {}
        with self.trainer.comm.waiting("the held-out test (gather and broadcast)", self.step):
            figures = self.test()
        held_out = {test_key(k): v for k, v in figures.items()}
        self.logger.print(f"held-out test at the final state (step {self.step}): " + "  ".join(
            f"{test_key(k)} {figures[k]:.6f}" for k in SHOWN[1:] if k in figures))
        return held_out

    def _kept_fields(self) -> dict:
        best = self.selection
        if self.benchmark or best.best_step < 0:
            return {}
        fields = {"best_epoch": best.best_epoch, "best_step": best.best_step,
                  f"best_{best.metric}": best.best}
        if self.config.keep_best:
            fields.update(kept_epoch=best.best_epoch, kept_step=best.best_step)
        return dict(fields, stopped_early=1) if best.stopped_early else fields

    def _final_text(self, final: dict) -> str:
        if self.benchmark or not self.metrics:
            return "no evaluation"
        if self.config.keep_best:
            return f"kept the best evaluation, {self.selection.text()}"
        last = metrics_text(final)
        if self.selection.best_step in (-1, self.last_eval_step):
            return last
        return f"{last} (best: {self.selection.text()}; --keep_best would keep it)"


def _throughput_text(final: dict, config: LoopConfig) -> str:
    if "throughput" not in final:
        return f", no step after the {config.benchmark_warmup_steps} warm-up steps timed"
    return f", {final['throughput']:,.0f} samples/s over {final['timed_steps']} timed steps"


def train(trainer, data, evaluator, logger, config: LoopConfig, position: dict,
          checkpoints: Optional[Checkpoints] = None,
          test: Optional[Callable[[], dict]] = None) -> tuple:
    """Train from `position` ({'step', 'epoch'[, 'batch_in_epoch', 'selection']}) to the end
    of the config's epochs or steps, or an early stop; evaluator() -> metrics dict of the
    data model selection reads; test() -> the same of held-out test data, evaluated once at
    the final state (None: none). Returns the final record and the position after it (the
    kept state's, with keep_best)."""
    run = _Run(trainer, data, evaluator, logger, config, position, checkpoints, test)
    return run.run(), run.position()


def benchmark_inference(trainer, batches, steps: int, warmup: int = 10,
                        distinct: int = 8) -> dict:
    """Latency of the prediction step alone: `distinct` batches are loaded once and cycled
    (the input pipeline is not timed), and every timing includes copying the result to the
    host. Rows are this rank's rows of each batch."""
    loaded = list(itertools.islice(iter(batches), distinct))
    if not loaded:
        raise ValueError("no evaluation data for the inference benchmark")
    for i in range(warmup):
        np.asarray(trainer.predict(loaded[i % len(loaded)]))
    latencies, samples = [], 0
    for i in range(steps):
        batch = loaded[i % len(loaded)]
        start = time.perf_counter()
        np.asarray(trainer.predict(batch))
        latencies.append(time.perf_counter() - start)
        samples += len(trainer.label(batch))
    latencies = np.asarray(latencies)
    return {"mean_inference_throughput": samples / latencies.sum(),
            "mean_inference_latency": float(latencies.mean()),
            **{f"p{q}_inference_latency": float(np.percentile(latencies, q))
               for q in (90, 95, 99)},
            "timed_steps": steps, "timed_samples": samples,
            "timed_seconds": float(latencies.sum())}
