"""SIM with dynamic (open-vocabulary) tables: item and category ids that are 64-bit hashes
(negative ones included; 0 stays padding) train and evaluate, test rows whose history ids
were never seen read the rare row, and the maps go through a checkpoint exactly."""
import os

import numpy as np

from core.columnar import open_reader, write_columns
from core.sources import length_key, load_spec
from sim.contract import SIM_CONTRACT
from test_sim_training import final_auc, synthetic, train

HASH = -7046029254386353131  # odd: distinct ids stay distinct, most of them negative


def hashed_copy(source, out, shift_test_history=False):
    """The dataset with every nonzero id hashed to a scattered int64 (shift_test_history:
    the test histories' ids also moved beyond any training id), every table dynamic."""
    spec = load_spec(source, SIM_CONTRACT)
    mappings = {}
    for mapping in ("train", "test"):
        reader = open_reader(spec, mapping, 10**6)
        batch = reader.get(0)
        columns = {}
        for name in spec.feature_spec:
            values = batch[name]
            if name != spec.label_feature:
                shift = 10**6 if shift_test_history and mapping == "test" and \
                    spec.dimension(name) else 0
                values = np.where(values != 0, (values + shift) * HASH, 0)
            columns[name] = (values, batch[length_key(name)]) if spec.dimension(name) \
                else values
        mappings[mapping] = columns
    dynamic = spec.with_dynamic(["all"])
    write_columns(out, dynamic, mappings, "tfrecord")
    return out


def test_hashed_ids_train_and_unseen_history_ids_evaluate(tmp_path):
    base = synthetic(tmp_path / "base", "long", 600, seed=4)
    data = hashed_copy(base, str(tmp_path / "hashed"))
    records = train(data, tmp_path / "a", "--model_type", "din", "--epochs", "3",
                    "--save_checkpoint_path", str(tmp_path / "ck"))
    assert final_auc(records) > 0.6  # the long-history signal, learned through the maps
    with np.load(tmp_path / "ck" / "arrays.npz") as saved:
        keys = saved["dynamic_map/item_table_0/keys"]
    assert len(keys) > 100 and (keys < 0).any() and 0 not in keys  # padding never inserted
    unseen = hashed_copy(base, str(tmp_path / "unseen"), shift_test_history=True)
    records = train(unseen, tmp_path / "b", "--model_type", "din", "--epochs", "1")
    assert 0 <= final_auc(records) <= 1


def test_resume_with_dynamic_tables_is_exact(tmp_path):
    base = synthetic(tmp_path / "base", "long", 300, seed=5)
    data = hashed_copy(base, str(tmp_path / "hashed"))
    full = train(data, tmp_path / "full", "--model_type", "sim", "--epochs", "2",
                 "--dynamic_min_count", "2", "--dynamic_features", "all")
    train(data, tmp_path / "one", "--model_type", "sim", "--epochs", "1", "--dynamic_min_count",
          "2", "--dynamic_features", "all", "--save_checkpoint_path", str(tmp_path / "ck"))
    resumed = train(data, tmp_path / "two", "--model_type", "sim", "--epochs", "2",
                    "--dynamic_min_count", "2", "--dynamic_features", "all",
                    "--load_checkpoint_path", str(tmp_path / "ck"))
    assert abs(final_auc(full) - final_auc(resumed)) < 1e-6
    assert os.path.exists(tmp_path / "ck" / "arrays.npz")
