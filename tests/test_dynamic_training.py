"""DLRM with dynamic tables end to end: ids nobody counted (64-bit hashes) train, resume
exactly mid-epoch, serve (unseen and negative ids read the rare row, checked against a numpy
forward pass), and continue on a second day's data where new ids get rows."""
import os

import numpy as np
import pytest

from core.feature_spec import FeatureSpec
from datasets import SplitBinaryWriter
from test_training import assert_resumed_losses_equal, final_metrics, run_main, step_losses

NUM = 4
CAPACITY = 64
MODEL = ["--embedding_dim", "8", "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1",
         "--cpu", "--batch_size", "128", "--valid_batch_size", "256", "--warmup_steps", "0",
         "--optimizer", "adam", "--learning_rate", "0.01", "--seed", "5", "--print_freq", "1",
         "--dynamic_features", "all", "--dynamic_min_count", "2"]


def hashed(values):
    """Distinct small values -> scattered 64-bit ids (negative ones included)."""
    return (np.asarray(values, np.int64) * np.int64(0x9E3779B97F4A7C15 - 2**64)) ^ 0x5bd1e995


def write_day(path, vocabulary, rows, seed, static=()):
    """Two tables of hashed ids drawn from `vocabulary` values (the tables in `static`: the
    values themselves, < CAPACITY, in a static table); the label is the parity of the first
    table's value, so that table must learn its ids."""
    rng = np.random.default_rng(seed)
    values = [rng.choice(vocabulary, rows) for _ in range(2)]
    label = (values[0] % 2).astype(bool)
    spec = FeatureSpec.get_default(NUM, [CAPACITY, CAPACITY], label_dtype="bool")
    for name in spec.categorical_features:
        spec.feature_spec[name]["dtype"] = "int64"
    spec = spec.with_dynamic([n for t, n in enumerate(spec.categorical_features)
                              if t not in static])
    numerical = rng.standard_normal((rows, NUM)).astype(np.float16)
    with SplitBinaryWriter(str(path), spec) as writer:
        for mapping, part in (("train", slice(0, rows * 3 // 4)), ("test", slice(rows * 3 // 4,
                                                                                   rows))):
            writer.write(mapping, numerical[part],
                         [v[part] if t in static else hashed(v[part])
                          for t, v in enumerate(values)], label[part])
    return str(path)


def test_resume_mid_epoch_is_exact(tmp_path):
    data = write_day(tmp_path / "d", np.arange(150), 2048, 0)  # 150 ids, 63 rows: evictions
    # a pending ring of 64 slots for 150 ids: it forgets ids
    common = [*MODEL, "--dataset_path", data, "--epochs", "2", "--dynamic_pending_per_row", "1"]
    run_main(*common, "--log_path", str(tmp_path / "full.json"))
    ckpt = tmp_path / "ckpt"
    run_main(*common, "--max_steps", "7", "--save_checkpoint_path", str(ckpt),
             "--log_path", str(tmp_path / "first.json"))
    assert sorted(f for f in os.listdir(ckpt) if f.startswith("dynamic_")) == \
        ["dynamic_0.npz", "dynamic_1.npz"]
    run_main(*common, "--restore_checkpoint_path", str(ckpt),
             "--log_path", str(tmp_path / "second.json"))
    assert_resumed_losses_equal(tmp_path, 24)
    saved = np.load(ckpt / "dynamic_0.npz")
    assert saved["counters"][3] > 0  # the test covers a full table
    assert len(saved["pending_keys"]) == CAPACITY  # and a full pending ring


def numpy_probabilities(ckpt, numerical, categorical):
    """DLRM's forward pass in numpy from the checkpoint's arrays, ids mapped by the saved maps
    (an id without a row reads row 0)."""
    dense = np.load(ckpt / "dense.npz")
    embedded = []
    for t in range(categorical.shape[1]):
        state = np.load(ckpt / f"dynamic_{t}.npz")
        row_of = dict(zip(state["keys"].tolist(), state["rows"].tolist()))
        rows = [row_of.get(int(i), 0) for i in categorical[:, t]]
        embedded.append(np.load(ckpt / f"table_{t}.npy")[rows])
    x = np.pad(numerical, [(0, 0), (0, 8 - NUM)])
    for i in range(2):
        x = np.maximum(x @ dense[f"bottom_mlp/{i}/kernel"] + dense[f"bottom_mlp/{i}/bias"], 0)
    vectors = np.stack([x] + embedded, axis=1)
    gram = np.einsum("brc,bsc->brs", vectors, vectors)
    i, j = np.tril_indices(3, -1)
    y = np.concatenate([x, gram[:, i, j]], axis=1)
    y = np.pad(y, [(0, 0), (0, dense["top_mlp/0/kernel"].shape[0] - y.shape[1])])
    y = np.maximum(y @ dense["top_mlp/0/kernel"] + dense["top_mlp/0/bias"], 0)
    y = y @ dense["top_mlp/1/kernel"] + dense["top_mlp/1/bias"]
    return 1 / (1 + np.exp(-y[:, 0]))


@pytest.fixture(scope="module")
def day_zero(tmp_path_factory):
    """The checkpoint of 4 epochs over a day of ids 0..39, and its log: served, and the day
    that the next day's training continues from (read only)."""
    out = tmp_path_factory.mktemp("day0")
    data = write_day(out / "d", np.arange(40), 2048, 1)
    run_main(*MODEL, "--dataset_path", data, "--save_checkpoint_path", str(out / "ckpt"),
             "--epochs", "4", "--log_path", str(out / "train.json"))
    return data, out / "ckpt", out / "train.json"


def test_served_model_answers_unseen_and_negative_ids(day_zero, tmp_path):
    import tensorflow as tf
    data, ckpt, log = day_zero
    assert final_metrics(log)["auc"] > 0.75
    exported = tmp_path / "saved_model"
    run_main(*MODEL, "--dataset_path", data, "--mode", "deploy", "--restore_checkpoint_path",
             str(ckpt), "--saved_model_output_path", str(exported),
             "--log_path", str(tmp_path / "deploy.json"))
    serving = tf.saved_model.load(str(exported)).signatures["serving_default"]
    rng = np.random.default_rng(2)
    numerical = rng.standard_normal((6, NUM)).astype(np.float32)
    seen = hashed([3, 4, 5, 6, 7, 8])
    categorical = np.stack([seen, [-1, -2**63, 2**63 - 1, 12345, seen[0], -7]], axis=1)
    served = serving(numerical=tf.constant(numerical), categorical=tf.constant(
        categorical, tf.int64))["probabilities"].numpy()
    assert np.all(np.isfinite(served))
    np.testing.assert_allclose(served, numpy_probabilities(ckpt, numerical, categorical),
                               rtol=1e-4, atol=1e-5)


def test_day_one_ids_get_rows_of_their_own(day_zero, tmp_path):
    _, ck0, _ = day_zero  # ids 0..39
    day1 = write_day(tmp_path / "day1", np.arange(30, 60), 1024, 4)
    before = set(np.load(ck0 / "dynamic_0.npz")["keys"].tolist())
    run_main(*MODEL, "--dataset_path", day1, "--restore_checkpoint_path", str(ck0),
             "--continue_on_new_data", "--save_checkpoint_path", str(tmp_path / "ck1"),
             "--log_path", str(tmp_path / "day1.json"))
    after = set(np.load(tmp_path / "ck1" / "dynamic_0.npz")["keys"].tolist())
    day1_only = set(hashed(np.arange(40, 60)).tolist())
    assert not before & day1_only
    assert day1_only <= after  # every id first seen on day 1 holds a row
    assert sorted(step_losses(tmp_path / "day1.json")) == list(range(1, 7))  # a new run


@pytest.mark.parametrize("extra,message", [
    (["--dynamic_min_count", "0"], "--dynamic_min_count must be >= 1, found 0"),
    (["--dynamic_pending_per_row", "0"], "--dynamic_pending_per_row must be >= 1, found 0"),
    (["--dynamic_features", "nope"], "dynamic feature 'nope' has no table"),
    (["--xla"], "--xla compiles fixed shapes"),
])
def test_bad_dynamic_settings_are_one_line(tmp_path, extra, message):
    data = write_day(tmp_path / "d", np.arange(10), 512, 5)
    args = [a for a in MODEL if a not in ("all", "--dynamic_features")] \
        if "--dynamic_features" in extra else MODEL
    proc = run_main(*args, "--dataset_path", data, *extra, expect_ok=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1].startswith("error: ") and message in lines[-1]


def test_bad_dynamic_spec_entries_are_one_line(tmp_path):
    import yaml
    data = write_day(tmp_path / "d", np.arange(10), 512, 6)
    for entry, message in (({"min_count": 0}, "min_count must be an integer >= 1"),
                           ({"eviction": "lfu"}, "eviction must be one of ['lru']")):
        raw = yaml.safe_load(open(os.path.join(data, "feature_spec.yaml")))
        raw["feature_spec"]["cat_0"]["dynamic"] = entry
        yaml.safe_dump(raw, open(os.path.join(data, "feature_spec.yaml"), "w"))
        proc = run_main(*MODEL[:-4], "--dataset_path", data, expect_ok=False)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1]
