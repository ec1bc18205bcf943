"""Model selection in the one training loop (training/selection.py): the best evaluation is
kept, patience stops training, and a run resumed from any checkpoint decides exactly as an
uninterrupted one. A fake trainer whose state is the number of steps it trained, and an
evaluation whose AUC is a scripted function of that state, make the expected outcome a
hand computation."""
import copy
import math

import numpy as np
import pytest

from core.parallel.comm import Communicator
from training import loop
from training.selection import Selection, best_state_path

STEPS_PER_EPOCH = 4


class CountingTrainer:
    """The model's state is how many steps it trained."""

    def __init__(self):
        self.comm, self.trained = Communicator(), 0

    def train_step(self, batch, step):
        self.trained += 1
        return 0.5

    def learning_rates(self, step):
        return {"learning_rate": 0.1}

    def global_rows(self, batch):
        return 10

    def step_collectives(self):
        return ["loss"]

    def check_diverged(self):
        pass


class Data:
    def __len__(self):
        return STEPS_PER_EPOCH

    def epoch(self, epoch=0, start_batch=0):
        return iter(range(start_batch, STEPS_PER_EPOCH))


class Logger:
    def __init__(self):
        self.records, self.lines = [], []

    def log(self, step, data):
        self.records.append((step, dict(data)))

    def print(self, line):
        self.lines.append(line)


class Store:
    """Checkpoints in memory: path -> (trained steps, position)."""

    def __init__(self, trainer):
        self.trainer, self.saved = trainer, {}

    def checkpoints(self, path="run/ckpt"):
        return loop.Checkpoints(path, self.save, self.restore)

    def save(self, path, position):
        self.saved[path] = (self.trainer.trained, copy.deepcopy(position))

    def restore(self, path):
        self.trainer.trained, position = copy.deepcopy(self.saved[path])
        return position


def auc_of(curve):
    """An evaluation whose AUC after epoch e (state 4(e+1) steps) is curve[e]."""
    return lambda trainer: (lambda: {"auc": curve[trainer.trained // STEPS_PER_EPOCH - 1],
                                     "validation_loss": 0.5, "eval_samples": 10})


def run(curve, epochs, store=None, position=None, logger=None, **config):
    store = store or Store(CountingTrainer())
    logger = logger or Logger()
    final, after = loop.train(store.trainer, Data(), auc_of(curve)(store.trainer), logger,
                              loop.LoopConfig(epochs=epochs, batch_size=10, print_freq=100,
                                              **config),
                              position or {"step": 0, "epoch": 0}, store.checkpoints())
    return final, after, store, logger


def evaluated_steps(logger):
    return [step[1] for step, data in logger.records if step and "auc" in data]


CURVE = [0.60, 0.80, 0.70, 0.65, 0.90, 0.95]  # peaks at epoch 1, then higher from epoch 4


def test_keep_best_ends_on_the_best_evaluations_state():
    final, after, store, logger = run(CURVE[:4], epochs=4, keep_best=True)
    assert evaluated_steps(logger) == [4, 8, 12, 16]
    assert store.trainer.trained == 8  # the state after epoch 1
    assert store.saved["run/ckpt"][0] == 8 and store.saved[best_state_path("run/ckpt")][0] == 8
    assert final["auc"] == 0.80 and final["kept_epoch"] == 1 and final["kept_step"] == 8
    assert final["step"] == 16 and "stopped_early" not in final
    assert after["step"] == 8 and after["epoch"] == 2  # resuming it continues after epoch 1
    assert any("kept the best evaluation, epoch 1 (step 8)" in line for line in logger.lines)


def test_without_keep_best_the_last_state_is_saved_and_the_best_is_named():
    final, _, store, logger = run(CURVE[:4], epochs=4)
    assert store.trainer.trained == 16 and store.saved["run/ckpt"][0] == 16
    assert best_state_path("run/ckpt") not in store.saved
    assert final["auc"] == 0.65 and final["best_step"] == 8 and final["best_auc"] == 0.80
    assert "kept_step" not in final


@pytest.mark.parametrize("patience,stop_step", [(1, 12), (2, 16), (3, 24)])
def test_patience_stops_after_that_many_evaluations_without_improvement(patience, stop_step):
    final, _, store, logger = run(CURVE, epochs=6, early_stopping_patience=patience)
    # a hand count of the curve: better at epochs 0 and 1, two worse, better at 4 and 5;
    # patience 3 outlasts the dip and trains all 6 epochs
    expected = [4 * (e + 1) for e in range(6)][:stop_step // 4]
    assert evaluated_steps(logger) == expected and final["step"] == stop_step
    assert final.get("stopped_early") == (1 if stop_step < 24 else None)
    if patience == 3:
        assert final["best_step"] == 24 and final["best_auc"] == 0.95


def test_patience_with_keep_best_saves_the_best_state_with_its_own_counters():
    """The kept state's position is the best evaluation's (nothing after it counted), and
    it records that the run stopped early."""
    final, after, store, _ = run(CURVE, epochs=6, early_stopping_patience=2, keep_best=True)
    trained, position = store.saved["run/ckpt"]
    assert trained == 8 and final["kept_step"] == 8 and final["step"] == 16
    assert position["step"] == 8 and position["selection"]["best"] == 0.80
    assert position["selection"]["since_best"] == 0 and position["selection"]["stopped_early"]


@pytest.mark.parametrize("interrupt_after_epoch", [1, 2, 3])
def test_resume_across_an_early_stop_is_exact(interrupt_after_epoch):
    """Ended by max_steps after epoch 0, 1 or 2 (where the best was epoch 1: that run ends on
    its kept state, and the resumed one retrains epoch 2), then resumed from its checkpoint
    in a new process: the same evaluations, stop, kept state and checkpoint as one
    uninterrupted run."""
    config = dict(early_stopping_patience=2, keep_best=True)
    full, _, full_store, full_log = run(CURVE, epochs=6, **config)
    _, _, store, first_log = run(CURVE, epochs=6, max_steps=4 * interrupt_after_epoch, **config)
    store.trainer.trained = None  # a new process: only the checkpoint carries the state
    position = store.restore("run/ckpt")
    resumed, _, _, second_log = run(CURVE, epochs=6, store=store, position=position, **config)
    assert sorted(set(evaluated_steps(first_log) + evaluated_steps(second_log))) == \
        evaluated_steps(full_log) == [4, 8, 12, 16]
    assert store.saved["run/ckpt"] == full_store.saved["run/ckpt"]
    for key in ("auc", "kept_step", "kept_epoch", "stopped_early", "step"):
        assert resumed[key] == full[key]


def test_a_run_resumed_after_its_early_stop_trains_nothing():
    _, _, store, _ = run(CURVE, epochs=6, early_stopping_patience=1)
    trained, position = store.saved["run/ckpt"]
    final, _, _, logger = run(CURVE, epochs=6, store=store, position=position,
                              early_stopping_patience=1)
    assert store.trainer.trained == trained == 12 and final["step"] == 12
    assert any("stopped early" in line for line in logger.lines)
    assert store.saved["run/ckpt"][1]["selection"] == position["selection"]


def test_keep_best_without_a_checkpoint_path_is_refused():
    store = Store(CountingTrainer())
    with pytest.raises(ValueError, match="checkpoint path"):
        loop.train(store.trainer, Data(), auc_of(CURVE)(store.trainer), Logger(),
                   loop.LoopConfig(epochs=1, batch_size=10, keep_best=True),
                   {"step": 0, "epoch": 0}, store.checkpoints(path=None))


def reference_best(values):
    """A pure-Python statement of the rule: the first index of the highest non-NaN value."""
    finite = [(v, -i) for i, v in enumerate(values) if not math.isnan(v)]
    return -max(finite)[1] if finite else None


@pytest.mark.parametrize("seed", range(20))
def test_selection_picks_the_first_highest_value_and_counts_since(seed):
    rng = np.random.default_rng(seed)
    values = list(rng.choice([0.5, 0.6, 0.7, float("nan")], size=8))
    selection = Selection("auc")
    for i, value in enumerate(values):
        selection.update({"auc": value}, epoch=i, step=10 * i)
    best = reference_best(values)
    assert selection.best_epoch == (-1 if best is None else best)
    assert selection.since_best == (len(values) if best is None else len(values) - 1 - best)


def test_a_missing_selection_metric_is_named():
    with pytest.raises(ValueError, match="'ndcg10' is not among .*auc"):
        Selection("ndcg10").update({"auc": 0.7}, 0, 1)


def test_a_saved_selection_of_another_metric_or_without_a_kept_state_starts_afresh():
    saved = {"selection": Selection("auc", best=0.9, best_epoch=3, best_step=30).state()}
    assert Selection.resumed("map12", 2, saved).best is None
    assert Selection.resumed("auc", 2, saved).best == 0.9
    # a run without keep_best kept no state to end on: keep_best starts the selection anew
    assert Selection.resumed("auc", 2, saved, keep_best=True).best is None
    kept = {"selection": Selection("auc", best=0.9, best_step=30, kept_at="/c.best").state()}
    assert Selection.resumed("auc", 2, kept, keep_best=True).kept_at == "/c.best"


def test_the_kept_state_is_restored_from_where_it_was_saved():
    """Resumed from one checkpoint path and saving to another, the run ends on the state
    kept beside the first one (the selection records where)."""
    _, _, store, _ = run(CURVE, epochs=6, max_steps=12, keep_best=True)
    store.trainer.trained = None  # a new process: only the checkpoint carries the state
    position = store.restore("run/ckpt")
    final, _ = loop.train(store.trainer, Data(), auc_of(CURVE)(store.trainer), Logger(),
                          loop.LoopConfig(epochs=3, batch_size=10, keep_best=True),
                          position, store.checkpoints("elsewhere/ckpt"))
    assert store.trainer.trained == 8 and final["kept_step"] == 8
    assert store.saved["elsewhere/ckpt"][0] == 8


def test_held_out_test_data_is_evaluated_once_at_the_kept_state():
    """With a validation split the loop selects on validation only; the test evaluator runs
    once, after training, on the kept state, and its figures land in the final record."""
    store, calls = Store(CountingTrainer()), []

    def test():
        calls.append(store.trainer.trained)
        return {"auc": store.trainer.trained / 100, "validation_loss": 0.3, "eval_samples": 7}
    final, _ = loop.train(store.trainer, Data(), auc_of(CURVE)(store.trainer), Logger(),
                          loop.LoopConfig(epochs=6, batch_size=10, keep_best=True,
                                          early_stopping_patience=2),
                          {"step": 0, "epoch": 0}, store.checkpoints(), test)
    assert calls == [8]  # the state kept after epoch 1, not the last one (16)
    assert final["test_auc"] == 0.08 and final["test_loss"] == 0.3 and final["test_samples"] == 7
    assert final["auc"] == 0.80  # the validation figure that chose it


def test_the_kept_evaluation_is_named_with_its_own_protocols_figures():
    """Selected on the seen-removed lists: their hit rate is shown beside their NDCG, the
    figures of the other protocol only after."""
    selection = Selection("filtered_ndcg@10")
    figures = {"ndcg@10": 0.05, "hr@10": 0.10, "filtered_ndcg@10": 0.07, "filtered_hr@10": 0.11}
    selection.update(figures, epoch=2, step=30)
    assert selection.text() == ("epoch 2 (step 30): filtered_ndcg@10 0.070000  "
                                "filtered_hr@10 0.110000  hr@10 0.100000")
    assert loop.metrics_text(figures, selection.shown()) == (
        "hr@10 0.100000  ndcg@10 0.050000  filtered_ndcg@10 0.070000  filtered_hr@10 0.110000")
