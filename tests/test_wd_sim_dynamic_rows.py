"""Dynamic (open-vocabulary) tables of Wide & Deep and SIM on several processes: each rank
holds a share of a dynamic table's rows and admits the ids a hash deals it. A Wide & Deep
model with a dynamic one-hot and a dynamic multi-hot feature, and DIN with every table
dynamic (item tables shared by the target and the history; 0 the padding), with min_count 2:
the first epoch on 2 processes (saved), the second resumed on 1 process (and for Wide & Deep
on 3), give the losses per step and AUC of 2 epochs in one process; every id admitted holds
the same vector as in one process; no table evicts (its capacity exceeds the data's ids)."""
import os

import numpy as np
import pytest
import yaml

from core.parallel.placement import PlanError, plan_routed_tables
from test_wd_sim_row_wise import (assert_same_served, assert_same_steps, launch, losses,
                                  wd_full_then_split)

MIN_COUNT = ["--dynamic_min_count", "2"]


def widen(dataset: str, features, rows: int) -> None:
    """The dataset's spec with `features` of `rows` rows: a dynamic table's capacity above
    the ids the data holds, so no share ever evicts."""
    path = os.path.join(dataset, "feature_spec.yaml")
    with open(path) as f:
        spec = yaml.safe_load(f)
    for name in features:
        spec["feature_spec"][name]["cardinality"] = rows
    with open(path, "w") as f:
        yaml.safe_dump(spec, f, sort_keys=False)


def by_id(saved, table: str, variables) -> dict:
    """{id: (its rows of each variable)} of a checkpoint's dynamic table."""
    keys, rows = saved[f"dynamic_map/{table}/keys"], saved[f"dynamic_map/{table}/rows"]
    return {int(k): [saved[v][r] for v in variables] for k, r in zip(keys, rows)}


def assert_same_maps(saved, reference, table: str, variables) -> None:
    """The same ids admitted, each holding the same vectors (its rows may differ), and the
    same ids pending with the same counts; no eviction."""
    got, want = by_id(saved, table, variables), by_id(reference, table, variables)
    assert sorted(got) == sorted(want) and len(want) > 5, (table, len(got), len(want))
    for key, vectors in want.items():
        for g, w, v in zip(got[key], vectors, variables):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-5, err_msg=f"{v} id {key}")
    pending = [{int(k): int(c) for k, c in zip(s[f"dynamic_map/{table}/pending_keys"],
                                               s[f"dynamic_map/{table}/pending_counts"])}
               for s in (saved, reference)]
    assert pending[0] == pending[1], table
    for s in (saved, reference):
        assert s[f"dynamic_map/{table}/counters"][3] == 0, table  # evictions


def test_a_dynamic_table_is_split_by_rows_whatever_the_sharding():
    # 10 rows on 3 ranks: 0..3, 3..6, 6..10, even where every other table is replicated;
    # one process holds it whole; 5 rows cannot give 3 ranks a rare row and a row each
    tables = plan_routed_tables([10, 40], [4, 4], 3, "data_parallel", hashed_tables=[0])
    assert [(t.kind, t.bounds) for t in tables] == [("row_wise", (0, 3, 6, 10)),
                                                    ("data_parallel", ())]
    assert not plan_routed_tables([10], [4], 1, "row_wise", hashed_tables=[0])[0].sharded
    with pytest.raises(PlanError, match="dynamic table 0 has 5 rows: 3 ranks need at least "
                                        "2 rows each"):
        plan_routed_tables([5], [4], 3, "auto", hashed_tables=[0])


WD_FLAGS = ["--cpu", "--global_batch_size", "256", "--eval_batch_size", "512",
            "--deep_hidden_units", "16", "16", "--deep_learning_rate", "0.003",
            "--deep_warmup_epochs", "0.5", "--linear_learning_rate", "0.05", "--print_freq", "1",
            "--deep_dropout", "0", "--dynamic_features", "onehot_0,multihot_0", *MIN_COUNT]


@pytest.fixture(scope="module")
def wd_runs(tmp_path_factory):
    """Two epochs in one process; the first on 2 processes (saved at its end); the second
    resumed from that checkpoint on 3 processes and on 1."""
    from test_wd_training import make_dataset
    from wide_and_deep import generate_feature_spec
    base = tmp_path_factory.mktemp("wd_dynamic_rows")
    assert generate_feature_spec.main(["--dst", str(base / "spec.yaml"), "--onehot",
                                       "40:8,30:4", "--multihot", "20:4",
                                       "--num_numerical", "3"]) == 0
    data = make_dataset(str(base), "data", 3.0, train_rows=1280, test_rows=512)
    widen(data, ["onehot_0", "multihot_0"], 120)  # int8 ids
    wd_full_then_split(base, data, WD_FLAGS)
    return base, data


def wd_checkpoint(base, name):
    return np.load(base / name / "model" / "checkpoint" / "arrays.npz")


def test_wide_deep_dynamic_features_on_2_and_3_processes_equal_1(wd_runs):
    base, _ = wd_runs
    full = base / "full1" / "log.json"
    assert_same_steps(base / "first2" / "log.json", full, range(1, 6))
    assert_same_steps(base / "resumed3" / "log.json", full, range(6, 11))
    assert losses(full)[10] < losses(full)[1]  # it trained
    for feature in ("onehot_0", "multihot_0"):
        assert_same_maps(wd_checkpoint(base, "resumed3"), wd_checkpoint(base, "full1"),
                         feature, [f"wide/{feature}", f"deep/{feature}"])


def test_wide_deep_dynamic_checkpoint_of_2_processes_resumes_on_1(wd_runs):
    base, _ = wd_runs
    assert_same_steps(base / "resumed1" / "log.json", base / "full1" / "log.json", range(6, 11))
    for feature in ("onehot_0", "multihot_0"):
        assert_same_maps(wd_checkpoint(base, "resumed1"), wd_checkpoint(base, "full1"),
                         feature, [f"wide/{feature}", f"deep/{feature}"])


def test_wide_deep_dynamic_split_model_exports_the_whole_model_with_its_maps(wd_runs):
    assert_same_served(*wd_runs)


SIM_FLAGS = ["--cpu", "--global_batch_size", "48", "--stage_one_mlp_dims", "8",
             "--stage_two_mlp_dims", "8,4", "--aux_mlp_dims", "4", "--embedding_dim", "4",
             "--print_freq", "1", "--seed", "3", "--model_type", "din",
             "--dynamic_features", "all", *MIN_COUNT]
SIM_TABLES = {"user_table_0": ["user_id"], "item_table_0": ["item_id", "hist_item_id",
                                                               "neg_hist_item_id"],
              "item_table_1": ["cat_id", "hist_cat_id", "neg_hist_cat_id"]}


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory):
    """As wd_runs, for DIN, saving at the end of each run; the second epoch resumed on 1
    process only (3 processes: Wide & Deep's runs)."""
    from sim.synthetic import write
    from test_sim_training import run_main
    base = tmp_path_factory.mktemp("sim_dynamic_rows")
    data = str(base / "data")
    write(data, users=300, items=200, categories=8, history_length=100, signal="long", seed=1)
    widen(data, [f for features in SIM_TABLES.values() for f in features], 1000)

    def args(name, epochs):
        return ["--dataset_dir", data, "--epochs", str(epochs), "--results_dir",
                str(base / name), "--save_checkpoint_path", str(base / name / "ckpt"),
                *SIM_FLAGS]
    run_main(args("full1", 2))
    launch(2, "sim.main", args("first2", 1))
    run_main(args("resumed1", 2) + ["--load_checkpoint_path", str(base / "first2" / "ckpt")])
    return base


def sim_checkpoint(base, name):
    return np.load(base / name / "ckpt" / "arrays.npz")


def test_din_dynamic_tables_on_2_processes_equal_1(sim_runs):
    base = sim_runs
    full = base / "full1" / "log.json"
    assert len(losses(full)) == 10
    assert_same_steps(base / "first2" / "log.json", full, range(1, 6))
    saved = sim_checkpoint(base, "first2")
    for table in SIM_TABLES:  # ids admitted, or seen once and waiting (users, in one epoch)
        held = [saved[f"dynamic_map/{table}/{k}"] for k in ("keys", "pending_keys")]
        assert 0 not in np.concatenate(held)  # padding is never inserted
        assert sum(map(len, held)) > 5, table


def test_din_dynamic_checkpoint_of_2_processes_resumes_on_1(sim_runs):
    base = sim_runs
    assert_same_steps(base / "resumed1" / "log.json", base / "full1" / "log.json", range(6, 11))
    for table in SIM_TABLES:
        assert_same_maps(sim_checkpoint(base, "resumed1"), sim_checkpoint(base, "full1"),
                         table, [f"table/{table}"])
