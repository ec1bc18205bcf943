"""--sharding for Wide & Deep and SIM: the planner of routed tables against hand-computed
placements; a checkpoint's row ranges; Wide & Deep (one-hot and multi-hot features) and DIN
(the SIM family's cheapest model: a user table, item tables shared by the target and the
history) trained with every table split by rows give the one-process losses per step and AUC
on 2 processes (one epoch, saved) and, resumed from that checkpoint, on 3 processes and on 1;
the SavedModel a split model exports serves like the one-process model's; --sharding
column_wise is one error line."""
import os
import re
import shutil
import sys

import numpy as np
import pytest

from conftest import HOROVODRUN, ROOT, bounded_run, horovodrun, require_or_skip
from core.dllog import read_log
from core.parallel.placement import PlanError, plan_routed_tables
from training.checkpoint import CheckpointError, assign_arrays



# ---- the planner -----------------------------------------------------------------------------
def layout(tables):
    return [(t.kind, t.bounds) for t in tables]


def test_row_wise_splits_every_table_with_a_row_per_rank_and_places_the_rest_whole():
    # 10 rows on 3 ranks: 0..3, 3..6, 6..10; 7 rows: 0..2, 2..4, 4..7; tables of 2 rows
    # (2 x 5 = 10 elements) and 1 row (1 element) have fewer rows than ranks: whole, the
    # larger on rank 0, then the smaller on the least loaded rank, 1
    tables = plan_routed_tables([10, 2, 7, 1], [4, 5, 3, 1], 3, "row_wise")
    assert layout(tables) == [("row_wise", (0, 3, 6, 10)), ("table_wise", (0, 2, 2, 2)),
                              ("row_wise", (0, 2, 4, 7)), ("table_wise", (0, 0, 1, 1))]
    assert tables[0].rows_on(2) == (6, 10) and tables[1].ranks() == [0]
    assert tables[3].rows_on(0) == (0, 0) and tables[3].rows_on(1) == (0, 1)


def test_table_wise_places_the_largest_table_first_on_the_least_loaded_rank():
    # elements 40 x 2 = 80, 30 x 1 = 30, 20 x 2 = 40, 5 x 2 = 10: 80 -> rank 0, 40 -> rank 1,
    # 30 -> rank 1 (40 < 80), 10 -> rank 1 (70 < 80)
    tables = plan_routed_tables([40, 30, 20, 5], [2, 1, 2, 2], 2, "table_wise")
    assert [t.ranks() for t in tables] == [[0], [1], [1], [1]]
    assert layout(tables)[0] == ("table_wise", (0, 40, 40))
    assert layout(tables)[1] == ("table_wise", (0, 0, 30))


def test_auto_replicates_small_tables_and_splits_the_others_by_rows():
    tables = plan_routed_tables([100, 101, 3], [2, 2, 1000], 4, "auto", replicated_elements=200)
    assert layout(tables) == [("data_parallel", ()), ("row_wise", (0, 25, 50, 75, 101)),
                              ("table_wise", (0, 3, 3, 3, 3))]


def test_one_process_and_data_parallel_hold_every_table_whole():
    for tables in (plan_routed_tables([10, 2], [4, 1], 1, "row_wise"),
                   plan_routed_tables([10, 2], [4, 1], 1, "table_wise"),
                   plan_routed_tables([10, 2], [4, 1], 3, "data_parallel")):
        assert [(t.kind, t.sharded, t.rows_on(1)) for t in tables] == [
            ("data_parallel", False, (0, 10)), ("data_parallel", False, (0, 2))]


def test_column_wise_is_refused_naming_the_alternatives():
    with pytest.raises(PlanError, match="column_wise is not offered .* use row_wise .*, "
                                        "table_wise .*, data_parallel or auto"):
        plan_routed_tables([10], [4], 2, "column_wise")


def test_a_restore_assigns_a_ranks_rows_and_refuses_another_row_count():
    import tensorflow as tf
    whole = np.arange(20, dtype=np.float32).reshape(10, 2)
    var = tf.Variable(np.zeros((3, 2), np.float32))
    assign_arrays({"t": var}, {"t": whole}, "ck", {"t": (4, 7, 10)})
    np.testing.assert_array_equal(var.numpy(), whole[4:7])
    with pytest.raises(CheckpointError, match=r"'t' has shape \(10, 2\), the model needs "
                                              r"\(11, 2\)"):
        assign_arrays({"t": var}, {"t": whole}, "ck", {"t": (4, 7, 11)})


# ---- training under horovodrun ---------------------------------------------------------------
def launch(np_, module, args, timeout=300):
    require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}")
    cmd = horovodrun(np_, sys.executable, "-m", module, *args)
    proc = bounded_run(cmd, timeout)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def losses(log) -> dict:
    return {r["step"][1]: r["data"]["loss"] for r in read_log(log)
            if r["type"] == "LOG" and len(r["step"]) == 2 and "loss" in r["data"]}


def aucs(log) -> dict:
    """step -> test AUC of each evaluation."""
    return {r["step"][1]: r["data"]["auc"] for r in read_log(log)
            if r["type"] == "LOG" and len(r["step"]) == 2 and "auc" in r["data"]}


def assert_same_steps(log, reference, steps):
    got, want = losses(log), losses(reference)
    assert sorted(got) == list(steps), sorted(got)
    for step in steps:
        assert abs(got[step] - want[step]) <= 1e-5, (step, got[step], want[step])
    for step, auc in aucs(log).items():
        assert abs(auc - aucs(reference)[step]) < 1e-6, (step, auc, aucs(reference)[step])


WD_FLAGS = ["--cpu", "--global_batch_size", "256", "--eval_batch_size", "512",
            "--deep_hidden_units", "16", "16", "--deep_learning_rate", "0.003",
            "--deep_warmup_epochs", "0.5", "--linear_learning_rate", "0.05", "--print_freq", "1",
            "--deep_dropout", "0", "--sharding", "row_wise"]


@pytest.fixture(scope="module")
def wd_runs(tmp_path_factory):
    """Two epochs in one process; the first epoch on 2 processes (its checkpoint saved at the
    epoch's end); the second epoch resumed from that checkpoint on 3 processes and on 1.
    Feature onehot_2 has 2 rows: split by rows on 2 processes, whole on one of 3 (the
    others hold none of its rows)."""
    from test_wd_training import make_dataset
    from wide_and_deep import generate_feature_spec
    base = tmp_path_factory.mktemp("wd_row_wise")
    assert generate_feature_spec.main(["--dst", str(base / "spec.yaml"), "--onehot",
                                       "40:8,30:4,2:4", "--multihot", "20:4",
                                       "--num_numerical", "3"]) == 0
    data = make_dataset(str(base), "data", 3.0, train_rows=1280, test_rows=512)
    return base, data, wd_full_then_split(base, data, WD_FLAGS)


def wd_full_then_split(base, data, flags) -> str:
    """Wide & Deep runs under base: 'full1' (2 epochs, 1 process), 'first2' (the first
    epoch on 2 processes, saved), 'resumed3' and 'resumed1' (the second epoch resumed from
    first2's checkpoint on 3 processes and on 1). Returns resumed3's output."""
    from wide_and_deep.main import main

    def args(name, epochs):
        return ["--dataset_path", data, "--num_epochs", str(epochs), "--model_dir",
                str(base / name / "model"), "--results_dir", str(base / name), *flags]
    assert main(args("full1", 2)) == 0
    launch(2, "wide_and_deep.main", args("first2", 1))
    for name in ("resumed1", "resumed3"):
        shutil.copytree(base / "first2" / "model" / "checkpoint",
                        base / name / "model" / "checkpoint")
    plan = launch(3, "wide_and_deep.main", args("resumed3", 2) + ["--use_checkpoint"]).stdout
    assert main(args("resumed1", 2) + ["--use_checkpoint"]) == 0
    return plan


def test_wide_deep_row_wise_on_2_and_3_processes_equals_1(wd_runs):
    base, _, plan = wd_runs
    assert re.search(r"onehot_1 +30 +5 +row_wise +all 3 ", plan), plan
    assert re.search(r"onehot_2 +2 +5 +table_wise +0 ", plan), plan
    assert_same_steps(base / "first2" / "log.json", base / "full1" / "log.json", range(1, 6))
    assert_same_steps(base / "resumed3" / "log.json", base / "full1" / "log.json", range(6, 11))
    one = losses(base / "full1" / "log.json")
    assert one[10] < one[1]  # it trained


def test_wide_deep_checkpoint_of_2_processes_resumes_on_1(wd_runs):
    base, _, _ = wd_runs
    assert_same_steps(base / "resumed1" / "log.json", base / "full1" / "log.json", range(6, 11))
    full, resumed = (np.load(base / n / "model" / "checkpoint" / "arrays.npz")
                     for n in ("full1", "resumed3"))
    assert sorted(full.files) == sorted(resumed.files)
    for name in full.files:  # whole tables: the 3 processes' rows gathered
        np.testing.assert_allclose(resumed[name], full[name], rtol=0, atol=1e-5, err_msg=name)


def test_wide_deep_split_model_exports_the_whole_model(wd_runs):
    base, data, _ = wd_runs
    assert_same_served(base, data)


def assert_same_served(base, data):
    """The SavedModels of runs 'resumed3' and 'full1' (wd_full_then_split) serve the first
    test rows alike."""
    import pandas as pd
    import tensorflow as tf
    test = pd.read_parquet(os.path.join(data, "test")).iloc[:64]
    features = {c: tf.constant(test[c].to_numpy(), tf.float32 if c.startswith("num") else
                               tf.int64) for c in test if c.startswith(("num", "onehot"))}
    lists = test["multihot_0"].to_list()
    features["multihot_0"] = tf.constant([list(r) + [0] * (3 - len(r)) for r in lists],
                                         tf.int64)
    features["multihot_0__length"] = tf.constant([len(r) for r in lists], tf.int32)
    served = [tf.saved_model.load(str(base / n / "model" / "saved_model")).signatures[
        "serving_default"](**features)["probabilities"].numpy() for n in ("full1", "resumed3")]
    np.testing.assert_allclose(served[1], served[0], rtol=0, atol=1e-5)


SIM_FLAGS = ["--cpu", "--global_batch_size", "48", "--stage_one_mlp_dims", "8",
             "--stage_two_mlp_dims", "8,4", "--aux_mlp_dims", "4", "--embedding_dim", "4",
             "--print_freq", "1", "--seed", "3", "--model_type", "din", "--sharding", "row_wise"]


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory):
    """As wd_runs, for DIN (the target and the history share the item tables), saving at the
    end of the run."""
    from sim.synthetic import write
    from test_sim_training import run_main
    base = tmp_path_factory.mktemp("sim_row_wise")
    data = str(base / "data")
    write(data, users=300, items=200, categories=8, history_length=100, signal="long", seed=1)

    def args(name, epochs):
        return ["--dataset_dir", data, "--epochs", str(epochs), "--results_dir",
                str(base / name), "--save_checkpoint_path", str(base / name / "ckpt"),
                *SIM_FLAGS]
    run_main(args("full1", 2) + ["--export_path", str(base / "full1" / "export")])
    launch(2, "sim.main", args("first2", 1))
    launch(3, "sim.main", args("resumed3", 2) + [
        "--load_checkpoint_path", str(base / "first2" / "ckpt"),
        "--export_path", str(base / "resumed3" / "export")])
    run_main(args("resumed1", 2) + ["--load_checkpoint_path", str(base / "first2" / "ckpt")])
    return base, data


def test_din_row_wise_on_2_and_3_processes_equals_1(sim_runs):
    base, _ = sim_runs
    steps = len(losses(base / "full1" / "log.json"))
    assert steps == 10
    assert_same_steps(base / "first2" / "log.json", base / "full1" / "log.json", range(1, 6))
    assert_same_steps(base / "resumed3" / "log.json", base / "full1" / "log.json", range(6, 11))


def test_din_checkpoint_of_2_processes_resumes_on_1_and_exports_whole(sim_runs):
    import tensorflow as tf

    from core.columnar import open_reader
    from core.sources import load_spec
    from sim.contract import SIM_CONTRACT
    base, data = sim_runs
    assert_same_steps(base / "resumed1" / "log.json", base / "full1" / "log.json", range(6, 11))
    batch = open_reader(load_spec(data, SIM_CONTRACT), "test", 20).get(0)
    served = []
    for name in ("full1", "resumed3"):
        serve = tf.saved_model.load(str(base / name / "export")).signatures["serving_default"]
        names = serve.structured_input_signature[1]
        served.append(serve(**{k: tf.constant(batch[k], names[k].dtype)
                               for k in names})["probabilities"].numpy())
    np.testing.assert_allclose(served[1], served[0], rtol=0, atol=1e-5)


def test_column_wise_is_one_error_line(tmp_path, capsys):
    from test_sim_training import run_main
    from test_wd_training import make_dataset
    from wide_and_deep.main import main
    wd = make_dataset(str(tmp_path), "wd", 0.0, train_rows=300, test_rows=100)
    assert main(["--dataset_path", wd, "--cpu", "--sharding", "column_wise", "--results_dir",
                 str(tmp_path / "r"), "--model_dir", str(tmp_path / "m")]) == 2
    errors = [capsys.readouterr().err.strip()]
    from sim.synthetic import write
    write(str(tmp_path / "sim"), users=20, items=20, categories=4, history_length=100,
          signal="none", seed=0)
    run_main(["--dataset_dir", str(tmp_path / "sim"), "--cpu", "--sharding", "column_wise",
              "--results_dir", str(tmp_path / "r")], status=2)
    errors.append(capsys.readouterr().err.strip())
    for error in errors:
        assert error.startswith("error: --sharding column_wise is not offered") and \
            "\n" not in error, error
        assert "use row_wise" in error and "data_parallel or auto" in error


def test_auto_splits_the_reference_shapes_three_largest_features_as_the_readme_says():
    from wide_and_deep.contract import embedding_dims, reference_spec
    spec = reference_spec()
    dims = embedding_dims(spec)
    names = [f for f in spec.feature_spec if f in dims]
    tables = plan_routed_tables([spec.cardinality(f) for f in names],
                                [dims[f] + 1 for f in names], 8)
    split = [f for f, t in zip(names, tables) if t.kind == "row_wise"]
    assert split == ["document_id", "document_id_promo", "ad_id"]
    assert all(t.kind == "data_parallel" for f, t in zip(names, tables) if f not in split)
    readme = open(os.path.join(ROOT, "wide_and_deep", "README.md")).read()
    assert "(of the reference shape's 16 features: `document_id`, `document_id_promo` and " \
           "`ad_id`)" in readme
