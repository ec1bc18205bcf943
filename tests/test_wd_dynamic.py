"""Wide & Deep with dynamic (open-vocabulary) tables: the planted signal is learned with
every table learning its ids, a test set whose multi-hot ids were never seen evaluates (they
read the rare row), and a resumed run equals an uninterrupted one, maps included."""
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from core.dllog import read_log
from test_wd_training import checkpoint_arrays, epoch_records, make_dataset, train

DYNAMIC = ["--dynamic_features", "all", "--dynamic_min_count", "2"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return make_dataset(str(tmp_path_factory.mktemp("wd_dynamic")), "planted", 3.0)


def with_unseen_test_ids(dataset, out):
    """A copy whose test multi-hot ids are shifted far beyond any training id."""
    shutil.copytree(dataset, out)
    for path in sorted(os.listdir(os.path.join(out, "test"))):
        path = os.path.join(out, "test", path)
        frame = pd.read_parquet(path)
        # int64 first: the stored ids are int8, and NumPy 2 does not widen for a large int
        frame["multihot_0"] = [np.asarray(v, np.int64) + 10**12 for v in frame["multihot_0"]]
        frame.to_parquet(path, row_group_size=1 << 16)
    return out


def test_learns_with_dynamic_tables_and_evaluates_unseen_ids(planted, tmp_path):
    learned = epoch_records(train(planted, str(tmp_path / "a"), "--num_epochs", "2",
                                  *DYNAMIC))
    assert learned[-1]["auc"] > 0.75
    state = checkpoint_arrays(str(tmp_path / "a"))
    keys = state["dynamic_map/multihot_0/keys"]
    assert len(keys) and keys.max() < 10**12  # ids of the training data hold rows
    unseen = with_unseen_test_ids(planted, str(tmp_path / "unseen"))
    evaluated = epoch_records(train(unseen, str(tmp_path / "b"), "--num_epochs", "2",
                                    *DYNAMIC))
    assert np.isfinite(evaluated[-1]["auc"]) and 0 < evaluated[-1]["auc"] < 1
    # the shifted test ids never got rows: evaluation reads, it does not insert
    state = checkpoint_arrays(str(tmp_path / "b"))
    assert state["dynamic_map/multihot_0/keys"].max() < 10**12


def test_resume_with_dynamic_tables_equals_uninterrupted(planted, tmp_path):
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    train(planted, full, "--num_epochs", "2", *DYNAMIC)
    train(planted, part, "--num_epochs", "1", *DYNAMIC)
    resumed = train(planted, part, "--num_epochs", "2", "--use_checkpoint", *DYNAMIC)
    a, b = checkpoint_arrays(full), checkpoint_arrays(part)
    assert a.keys() == b.keys() and any(k.startswith("dynamic_map/") for k in a)
    for k in a:
        if k.endswith(("/keys", "/pending_keys")):  # a hash map's export order is its own
            values = k.replace("pending_keys", "pending_counts").replace("/keys", "/rows")
            assert dict(zip(a[k], a[values])) == dict(zip(b[k], b[values])), k
        elif not k.endswith(("/rows", "/pending_counts")):
            np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-6, err_msg=k)
    assert epoch_records(resumed)[-1]["map12"] == pytest.approx(
        epoch_records(read_log(os.path.join(full, "log.json")))[-1]["map12"], abs=1e-9)
