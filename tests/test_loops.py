"""The training loop with fake trainer/data and a fake clock: throughput after evaluations
and the checkpoint position when --max_steps ends on an epoch boundary."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

import checkpoint
import loops
from comm import Communicator


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Value:
    def __init__(self, array):
        self.array = array

    def numpy(self):
        return self.array


class FakeTrainer:
    """Every training step takes 1 s of the fake clock."""

    def __init__(self, clock):
        self.clock, self.comm = clock, Communicator()
        self.schedule = lambda step: 0.1

    def train_step(self, batch, step):
        self.clock.now += 1.0
        return 0.5

    def step_collectives(self):
        return ["loss"]

    def predict(self, batch):
        return Value(np.array([0.2, 0.7, 0.4], np.float32))

    def check_finite(self):
        pass


class FakePipe:
    """`batches` batches per epoch; one pass (an evaluation) takes `seconds` of the clock."""

    def __init__(self, batches, clock, seconds=0.0):
        self.batches, self.clock, self.seconds, self.started = batches, clock, seconds, []

    def __len__(self):
        return self.batches

    def epoch(self, epoch=0, start_batch=0):
        self.started.append((epoch, start_batch))
        self.clock.now += self.seconds
        for _ in range(start_batch, self.batches):
            yield None, (), Value(np.array([0.0, 1.0, 1.0], np.float32)), 3


class FakeLogger:
    def __init__(self):
        self.records = []

    def log(self, step, data):
        self.records.append((step, data))

    def print(self, line):
        pass


def flags(**overrides):
    values = dict(batch_size=100, epochs=1, max_steps=-1, evals_per_epoch=1, print_freq=1,
                  checkpoint_steps=0, save_checkpoint_path=None, benchmark_warmup_steps=100)
    return SimpleNamespace(**{**values, **overrides})


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(time, "perf_counter", fake)
    monkeypatch.setattr(time, "time", fake)
    return fake


def test_samples_per_second_is_not_inflated_by_evaluations(clock):
    logger = FakeLogger()
    # 8 steps, evaluations (100 s each) after steps 4 and 8, reports after steps 3, 6, 8
    loops.train(FakeTrainer(clock), FakePipe(8, clock), FakePipe(1, clock, seconds=100.0),
                logger, {"step": 0, "epoch": 0, "batch_in_epoch": 0},
                flags(evals_per_epoch=2, print_freq=3))
    reported = {step[1]: data["samples_per_second"] for step, data in logger.records
                if "samples_per_second" in data}
    # every step is 100 samples in 1 s, whatever happened between the reports
    assert reported == {3: 100.0, 6: 100.0, 8: 100.0}


def test_final_record_has_the_mean_throughput_of_the_steps_after_warmup(clock):
    logger = FakeLogger()
    # 8 steps of 1 s; an evaluation of 100 s after step 4 and 8; 3 warm-up steps
    final = loops.train(FakeTrainer(clock), FakePipe(8, clock),
                        FakePipe(1, clock, seconds=100.0), logger,
                        {"step": 0, "epoch": 0, "batch_in_epoch": 0},
                        flags(evals_per_epoch=2, benchmark_warmup_steps=3))
    assert final["timed_steps"] == 5
    assert final["throughput"] == pytest.approx(100.0)  # 100 samples per 1 s step
    assert final["mean_step_time_ms"] == pytest.approx(1000.0)
    assert logger.records[-1] == ((), final)


def test_no_throughput_when_no_step_is_past_warmup(clock):
    final = loops.train(FakeTrainer(clock), FakePipe(4, clock), FakePipe(1, clock),
                        FakeLogger(), {"step": 0, "epoch": 0, "batch_in_epoch": 0},
                        flags(benchmark_warmup_steps=4))
    assert "throughput" not in final and final["step"] == 4


def test_max_steps_on_an_epoch_boundary_saves_the_next_epoch(clock, monkeypatch, tmp_path):
    saved = []
    monkeypatch.setattr(checkpoint, "save", lambda path, trainer, position: saved.append(
        dict(position)))
    train = FakePipe(4, clock)
    loops.train(FakeTrainer(clock), train, FakePipe(1, clock), FakeLogger(),
                {"step": 0, "epoch": 0, "batch_in_epoch": 0},
                flags(epochs=3, max_steps=4, save_checkpoint_path=str(tmp_path / "c")))
    assert saved == [{"step": 4, "epoch": 1, "batch_in_epoch": 0}]
    resumed = FakePipe(4, clock)
    final = loops.train(FakeTrainer(clock), resumed, FakePipe(1, clock), FakeLogger(),
                        saved[0], flags(epochs=3, save_checkpoint_path=str(tmp_path / "c")))
    assert resumed.started == [(1, 0), (2, 0)] and final["step"] == 12
    assert saved[-1] == {"step": 12, "epoch": 3, "batch_in_epoch": 0}
