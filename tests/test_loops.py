"""The one training loop (training/loop.py) with a fake trainer, fake data and a fake clock:
throughput after evaluations, checkpoint positions, repeated passes, epoch means, benchmark
runs."""
import time

import numpy as np
import pytest

from core.parallel.comm import Communicator
from training import loop as loops


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

    def __array__(self, dtype=None, copy=None):  # as a tf.Tensor converts
        return self.array if dtype is None else self.array.astype(dtype)

    def __len__(self):
        return len(self.array)


class FakeTrainer:
    """Every training step takes 1 s of the fake clock."""

    def __init__(self, clock):
        self.clock, self.comm = clock, Communicator()

    def learning_rates(self, step):
        return {"learning_rate": 0.1}

    @staticmethod
    def label(batch):
        return batch[2].numpy()

    @staticmethod
    def global_rows(batch):
        return batch[3]

    def train_step(self, batch, step):
        self.clock.now += 1.0
        return float(step)  # the loss: step-dependent, to check the epoch means

    def step_collectives(self):
        return ["loss"]

    def predict(self, batch):
        return Value(np.array([0.2, 0.7, 0.4], np.float32))

    def check_diverged(self):
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
            yield None, (), Value(np.array([0.0, 1.0, 1.0], np.float32)), 100


class FakeLogger:
    def __init__(self):
        self.records = []

    def log(self, step, data):
        self.records.append((step, data))

    def print(self, line):
        pass


START = {"step": 0, "epoch": 0, "batch_in_epoch": 0}


def train(clock, train_pipe, eval_pipe, logger=None, position=START, save=None, **config):
    """loops.train with the fake trainer; config: LoopConfig fields over small defaults;
    save(position): the checkpoint function (its positions without the selection's state)."""
    trainer = FakeTrainer(clock)
    values = dict(epochs=1, batch_size=100, print_freq=1, benchmark_warmup_steps=100)
    checkpoints = None if save is None else loops.Checkpoints(
        "ckpt", lambda path, position: save({k: v for k, v in position.items()
                                             if k != "selection"}), None)
    final, _ = loops.train(trainer, train_pipe,
                           lambda: loops.evaluate(trainer, eval_pipe.epoch()),
                           logger or FakeLogger(), loops.LoopConfig(**{**values, **config}),
                           position, checkpoints)
    return final


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(time, "perf_counter", fake)
    monkeypatch.setattr(time, "time", fake)
    return fake


def test_samples_per_second_is_not_inflated_by_evaluations(clock):
    logger = FakeLogger()
    # 8 steps, evaluations (100 s each) after steps 4 and 8, reports after steps 3, 6, 8
    train(clock, FakePipe(8, clock), FakePipe(1, clock, seconds=100.0), logger,
          evals_per_epoch=2, print_freq=3)
    reported = {step[1]: data["samples_per_second"] for step, data in logger.records
                if "samples_per_second" in data}
    # every step is 100 samples in 1 s, whatever happened between the reports
    assert reported == {3: 100.0, 6: 100.0, 8: 100.0}


def test_final_record_has_the_mean_throughput_of_the_steps_after_warmup(clock):
    logger = FakeLogger()
    # 8 steps of 1 s; an evaluation of 100 s after step 4 and 8; 3 warm-up steps
    final = train(clock, FakePipe(8, clock), FakePipe(1, clock, seconds=100.0), logger,
                  evals_per_epoch=2, benchmark_warmup_steps=3)
    assert final["timed_steps"] == 5
    assert final["throughput"] == pytest.approx(100.0)  # 100 samples per 1 s step
    assert final["mean_step_time_ms"] == pytest.approx(1000.0)
    assert logger.records[-1] == ((), final)


def test_no_throughput_when_no_step_is_past_warmup(clock):
    final = train(clock, FakePipe(4, clock), FakePipe(1, clock), benchmark_warmup_steps=4)
    assert "throughput" not in final and final["step"] == 4


def test_max_steps_on_an_epoch_boundary_saves_the_next_epoch(clock):
    saved = []
    save = lambda position: saved.append(dict(position))  # noqa: E731
    train(clock, FakePipe(4, clock), FakePipe(1, clock), save=save, epochs=3, max_steps=4)
    assert saved == [{"step": 4, "epoch": 1, "batch_in_epoch": 0}]
    resumed = FakePipe(4, clock)
    final = train(clock, resumed, FakePipe(1, clock), position=saved[0], save=save, epochs=3)
    assert resumed.started == [(1, 0), (2, 0)] and final["step"] == 12
    assert saved[-1] == {"step": 12, "epoch": 3, "batch_in_epoch": 0}


def test_repeated_passes_capped_per_epoch_resume_inside_the_second_pass(clock):
    """repeat_count 2 over 4 batches, capped at 6 per epoch: an epoch is pass 1 then 2 batches
    of pass 2; resuming at batch 5 starts pass 2 at its batch 1."""
    data = FakePipe(4, clock)
    train(clock, data, FakePipe(1, clock), epochs=2, repeat_count=2, batches_per_epoch=6)
    assert data.started == [(0, 0), (0, 0), (1, 0), (1, 0)]
    resumed = FakePipe(4, clock)
    final = train(clock, resumed, FakePipe(1, clock), epochs=2, repeat_count=2,
                  batches_per_epoch=6, position={"step": 5, "epoch": 0, "batch_in_epoch": 5})
    assert resumed.started == [(0, 1), (1, 0), (1, 0)] and final["step"] == 12


def test_evaluation_records_carry_the_epochs_mean_training_loss(clock):
    logger = FakeLogger()
    train(clock, FakePipe(4, clock), FakePipe(1, clock), logger, epochs=2)
    evaluations = [(step, data) for step, data in logger.records if "auc" in data and step]
    # the fake's loss of step s (0-based) is s: epoch 0 steps 0..3, epoch 1 steps 4..7
    assert [(step, data["train_loss"]) for step, data in evaluations] == [
        ((0, 4), 1.5), ((1, 8), 5.5)]
    assert evaluations[0][1]["eval_samples"] == 3 and evaluations[1][1]["train_samples"] == 400


def test_benchmark_run_cycles_the_data_without_evaluating_or_saving(clock):
    data, evaluation, saved = FakePipe(4, clock), FakePipe(1, clock), []
    final = train(clock, data, evaluation, save=saved.append, epochs=1,
                  benchmark_warmup_steps=3, benchmark_steps=6)
    assert final["step"] == 9 and final["timed_steps"] == 6 and final["timed_samples"] == 600
    assert data.started == [(0, 0), (1, 0), (2, 0)]
    assert evaluation.started == [] and saved == [] and "auc" not in final


def test_checkpoint_every_epoch_saves_each_epoch_once(clock):
    saved = []
    train(clock, FakePipe(4, clock), FakePipe(1, clock), epochs=2,
          checkpoint_every_epoch=True, save=lambda position: saved.append(position["step"]))
    assert saved == [4, 8]
