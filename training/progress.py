"""Training progress bookkeeping shared by every model family: samples/s over the interval
since the last report, and the ETA of the remaining steps.

The interval's clock and its step count live in one object and are reset together, so time
spent outside training (an evaluation, a checkpoint) can be excluded with restart_interval() without
the two drifting apart.
"""
from __future__ import annotations

import contextlib
import time


def format_seconds(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    def __init__(self, total_steps: int, samples_per_step: int, clock=time.perf_counter):
        self.total_steps, self.samples_per_step = int(total_steps), int(samples_per_step)
        self._clock = clock
        self._interval_start = clock()
        self._interval_steps = 0

    def step_done(self) -> None:
        self._interval_steps += 1

    def restart_interval(self) -> None:
        """Forget the current interval (e.g. after an evaluation): its steps and its time."""
        self._interval_start, self._interval_steps = self._clock(), 0

    def report(self, step: int) -> dict:
        """Throughput over the steps since the last report and the ETA of the steps left
        after `step`; starts the next interval."""
        elapsed = max(self._clock() - self._interval_start, 1e-9)
        steps = self._interval_steps
        throughput = steps * self.samples_per_step / elapsed
        eta = ((self.total_steps - step) * self.samples_per_step / throughput
               if throughput > 0 else float("inf"))
        self.restart_interval()
        return {"samples_per_second": throughput, "eta_seconds": eta, "interval_steps": steps}

    def line(self, step: int, report: dict, **values) -> str:
        """One console line: step/total, the given values, samples/s, ETA."""
        parts = [f"step {step}/{self.total_steps}"]
        for key, value in values.items():
            parts.append(f"{key} {value:.5g}" if isinstance(value, float) else f"{key} {value}")
        parts.append(f"samples/s {report['samples_per_second']:,.0f}")
        eta = report["eta_seconds"]
        parts.append(f"ETA {format_seconds(eta) if eta != float('inf') else '?'}")
        return "  ".join(parts)


class StepTimer:
    """The benchmark figure of a run, as NVIDIA's DLRM reports it: the rows of the timed steps
    over their time (with full batches: the batch over the mean step time); the timed steps
    are all steps after the first `warmup`. Each step is timed alone, so evaluations and
    checkpoints between steps are not counted."""

    def __init__(self, warmup: int, clock=time.perf_counter):
        self.warmup, self._clock = warmup, clock
        self.steps_seen, self.timed_steps, self.timed_samples, self.timed_seconds = 0, 0, 0, 0.0

    @contextlib.contextmanager
    def step(self, rows: int):
        start = self._clock()
        yield
        self.steps_seen += 1
        if self.steps_seen > self.warmup:
            self.timed_steps, self.timed_samples = self.timed_steps + 1, self.timed_samples + rows
            self.timed_seconds += self._clock() - start

    def summary(self) -> dict:
        """throughput (samples/s) and mean_step_time_ms; empty when no step was timed."""
        if not self.timed_steps:
            return {}
        return {"throughput": self.timed_samples / self.timed_seconds,
                "mean_step_time_ms": self.timed_seconds / self.timed_steps * 1e3,
                "timed_steps": self.timed_steps, "timed_samples": self.timed_samples,
                "timed_seconds": self.timed_seconds}
