"""Dynamic (open-vocabulary) tables: the TensorFlow map against a pure-Python model of the
semantics (core/dynamic.py's module doc) over random streams with repeats, new ids and a
full table; state round trips."""
import numpy as np
import pytest

from core import runtime

runtime.configure()
import tensorflow as tf  # noqa: E402

from core.dynamic import DynamicTable  # noqa: E402
from core.feature_spec import DynamicSpec, FeatureSpec, FeatureSpecError  # noqa: E402


class DictModel:
    """The semantics with a dict and counters, one id at a time where the order matters."""

    def __init__(self, capacity, min_count):
        self.capacity, self.min_count = capacity, min_count
        self.row_of, self.id_of, self.last_used, self.pending = {}, {}, {}, {}
        self.clock = 0

    def train(self, batch):
        self.clock += 1
        distinct = list(dict.fromkeys(batch))  # first appearance order
        counts = {i: batch.count(i) for i in distinct}
        for i in distinct:
            if i in self.row_of:
                self.last_used[self.row_of[i]] = self.clock
        new_rows = []
        for i in distinct:
            if i in self.row_of:
                continue
            seen = self.pending.get(i, 0) + counts[i]
            row = self._free_row() if seen >= self.min_count else None
            if row is None:
                self.pending[i] = seen
                continue
            self.pending.pop(i, None)
            if row in self.id_of:
                del self.row_of[self.id_of[row]]
            self.row_of[i], self.id_of[row], self.last_used[row] = row, i, self.clock
            new_rows.append(row)
        return [self.row_of.get(i, 0) for i in batch], new_rows

    def _free_row(self):
        for row in range(1, self.capacity):
            if row not in self.id_of:
                return row
        evictable = [r for r in range(1, self.capacity) if self.last_used[r] < self.clock]
        return min(evictable, key=lambda r: (self.last_used[r], r)) if evictable else None

    def lookup(self, ids):
        return [self.row_of.get(i, 0) for i in ids]


@pytest.mark.parametrize("capacity,min_count", [(50, 1), (50, 3), (7, 2), (1, 1)])
def test_table_agrees_with_the_dict_model(capacity, min_count):
    rng = np.random.default_rng(capacity * 10 + min_count)
    table = DynamicTable(capacity, DynamicSpec(min_count=min_count))
    # one trace for all batch lengths (a trace per length took most of the time)
    train = tf.function(table.train_lookup, input_signature=[tf.TensorSpec([None], tf.int64)])
    model = DictModel(capacity, min_count)
    for step in range(40):
        # a drifting id range: repeats, new ids, and (capacity 7) a full table; 64-bit ids
        ids = (rng.zipf(1.3, size=rng.integers(1, 30)) + step * 3) * (2**40 + 7) - 2**62
        rows, new_rows = train(tf.constant(ids, tf.int64))
        expected_rows, expected_new = model.train([int(i) for i in ids])
        assert rows.numpy().tolist() == expected_rows, step
        assert new_rows.numpy().tolist() == expected_new, step
        probe = np.concatenate([ids, [-5, 2**63 - 1]])
        assert table.lookup(tf.constant(probe)).numpy().tolist() == model.lookup(
            [int(i) for i in probe])
    counters = table.state()["counters"]
    assert counters[1] == 40  # one clock tick per training batch


def test_state_round_trip_gives_the_same_future():
    rng = np.random.default_rng(3)
    stream = [rng.integers(0, 40, size=12) for _ in range(30)]
    first = DynamicTable(16, DynamicSpec(min_count=2))
    for ids in stream[:15]:
        first.train_lookup(tf.constant(ids, tf.int64))
    second = DynamicTable(16, DynamicSpec(min_count=2))
    second.load(first.state())
    for ids in stream[15:]:
        a, new_a = first.train_lookup(tf.constant(ids, tf.int64))
        b, new_b = second.train_lookup(tf.constant(ids, tf.int64))
        assert a.numpy().tolist() == b.numpy().tolist()
        assert new_a.numpy().tolist() == new_b.numpy().tolist()


def test_redraw_is_uniform_in_the_table_bound_and_repeatable():
    table = DynamicTable(100)
    weights = tf.Variable(tf.zeros([100, 8]))
    table.redraw(weights, tf.constant([3, 5], tf.int64), seed=1)
    drawn = weights.numpy()
    assert np.all(drawn[[3, 5]] != 0) and np.all(np.abs(drawn[[3, 5]]) <= 0.1)
    assert np.all(np.delete(drawn, [3, 5], axis=0) == 0)
    again = tf.Variable(tf.zeros([100, 8]))
    table.redraw(again, tf.constant([3, 5], tf.int64), seed=1)
    np.testing.assert_array_equal(again.numpy(), drawn)  # same clock, same seed


def test_spec_dynamic_key_and_its_errors():
    spec = FeatureSpec.get_default(1, [100, 50]).with_dynamic(["cat_1"], DynamicSpec(3))
    assert spec.dynamic("cat_1") == DynamicSpec(min_count=3, eviction="lru")
    assert spec.dynamic("cat_0") is None
    assert spec.id_limit("cat_1") is None and spec.id_limit("cat_0") == 99
    again = FeatureSpec(**spec.to_dict())
    assert again.validate().dynamic("cat_1").min_count == 3
    for bad, message in (({"min_count": 0}, "min_count must be an integer >= 1"),
                         ({"eviction": "fifo"}, "eviction must be one of"),
                         ({"size": 3}, "dynamic must be a mapping")):
        raw = spec.to_dict()
        raw["feature_spec"]["cat_1"]["dynamic"] = bad
        with pytest.raises(FeatureSpecError, match=message):
            FeatureSpec(**raw).validate()
    raw = spec.to_dict()
    raw["feature_spec"]["cat_1"]["cardinality"] = 0
    with pytest.raises(FeatureSpecError, match="cardinality must be a positive"):
        from dlrm_contract import DLRM_CONTRACT
        FeatureSpec(**raw).validate(DLRM_CONTRACT)
    with pytest.raises(FeatureSpecError, match="dynamic feature 'label' has no table"):
        spec.with_dynamic(["label"])
