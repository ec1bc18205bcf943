"""Bad inputs to `sim.main` end with one line naming the culprit (exit status 2)."""
import os

import pytest
import yaml

from test_sim_training import run_main, synthetic


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return synthetic(tmp_path_factory.mktemp("sim_bad") / "data", "long", 100)


def edited(dataset, tmp_path, edit):
    """A copy of the dataset's spec (same files), changed by edit(raw dict)."""
    with open(os.path.join(dataset, "feature_spec.yaml")) as f:
        raw = yaml.safe_load(f)
    edit(raw)
    for chunks in raw["source_spec"].values():
        for chunk in chunks:
            chunk["files"] = [os.path.join(dataset, p) for p in chunk["files"]]
    path = tmp_path / "feature_spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def one_line_error(capsys, args):
    run_main(["--cpu", "--epochs", "1", "--global_batch_size", "32"] + args, status=2)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def set_dims(names, d):
    def edit(raw):
        for name in names:
            raw["feature_spec"][name]["dimensions"] = [d]
    return edit


def test_histories_of_different_lengths(dataset, tmp_path, capsys):
    spec = edited(dataset, tmp_path, set_dims(["neg_hist_item_id", "neg_hist_cat_id"], 50))
    line = one_line_error(capsys, ["--dataset_dir", dataset, "--feature_spec", spec,
                                   "--results_dir", str(tmp_path)])
    assert "neg_hist_item_id" in line and "length" in line


def test_stored_histories_longer_than_the_spec(dataset, tmp_path, capsys):
    names = ["hist_item_id", "hist_cat_id", "neg_hist_item_id", "neg_hist_cat_id"]
    spec = edited(dataset, tmp_path, set_dims(names, 95))
    line = one_line_error(capsys, ["--dataset_dir", dataset, "--feature_spec", spec,
                                   "--results_dir", str(tmp_path), "--long_seq_length", "85"])
    assert "hist_" in line and "95" in line


def test_long_seq_length_must_leave_a_short_part(dataset, tmp_path, capsys):
    line = one_line_error(capsys, ["--dataset_dir", dataset, "--results_dir", str(tmp_path),
                                   "--long_seq_length", "100"])
    assert "--long_seq_length" in line and "100" in line


def test_target_and_history_feature_counts_differ(dataset, tmp_path, capsys):
    def drop(raw):
        raw["channel_spec"]["negative_history"] = ["neg_hist_item_id"]
    spec = edited(dataset, tmp_path, drop)
    line = one_line_error(capsys, ["--dataset_dir", dataset, "--feature_spec", spec,
                                   "--results_dir", str(tmp_path)])
    assert "negative_history" in line and "target_item_features" in line


def test_empty_test_set(tmp_path, capsys):
    from core.columnar import write_columns
    from sim import contract
    from sim.synthetic import generate
    data = generate(50, 40, 4, 100, "long", 0)
    data["test"] = {k: (tuple(p[:0] for p in v) if isinstance(v, tuple) else v[:0])
                    for k, v in data["test"].items()}
    write_columns(str(tmp_path / "d"), contract.sim_spec(50, 40, 4, 100), data, "tfrecord",
                  ids_from_one=True)
    line = one_line_error(capsys, ["--dataset_dir", str(tmp_path / "d"),
                                   "--results_dir", str(tmp_path)])
    assert "'test'" in line and "0 rows" in line


def test_nan_loss_is_one_line_error(dataset, tmp_path, capsys):
    line = one_line_error(capsys, ["--dataset_dir", dataset, "--results_dir", str(tmp_path),
                                   "--lr", "1e30"])
    assert line.startswith("error: loss became") and "--lr" in line


def test_checkpoint_of_the_other_item_item_interaction(dataset, tmp_path, capsys):
    """A SIM checkpoint saved with the MLP activation unit is not loaded into the default
    dot-product model: one line naming the field. A DIEN one (same variables) loads."""
    small = ["--dataset_dir", dataset, "--stage_one_mlp_dims", "8", "--stage_two_mlp_dims",
             "8", "--aux_mlp_dims", "8"]
    run = ["--cpu", "--epochs", "1", "--global_batch_size", "32"] + small
    for model_type in ("sim", "dien"):
        run_main(run + ["--model_type", model_type, "--results_dir", str(tmp_path / "a"),
                        "--item_item_interaction", "activation_unit",
                        "--save_checkpoint_path", str(tmp_path / model_type)])
    line = one_line_error(capsys, small + ["--results_dir", str(tmp_path / "b"),
                                           "--load_checkpoint_path", str(tmp_path / "sim")])
    assert "item_item_interaction: checkpoint activation_unit, now dot" in line, line
    run_main(run + ["--model_type", "dien", "--results_dir", str(tmp_path / "c"),
                    "--load_checkpoint_path", str(tmp_path / "dien"), "--epochs", "2"])


def test_checkpoint_of_the_other_architecture(dataset, tmp_path, capsys):
    """A checkpoint records its architecture: loading a compact one into the default
    (reference) model, or a reference one into --architecture compact, is one line naming
    the field, both ways."""
    small = ["--dataset_dir", dataset, "--stage_one_mlp_dims", "8", "--stage_two_mlp_dims",
             "8", "--aux_mlp_dims", "8"]
    run = ["--cpu", "--epochs", "1", "--global_batch_size", "32"] + small
    for architecture in ("compact", "reference"):
        run_main(run + ["--architecture", architecture, "--results_dir", str(tmp_path / "a"),
                        "--save_checkpoint_path", str(tmp_path / architecture)])
    line = one_line_error(capsys, small + ["--results_dir", str(tmp_path / "b"),
                                           "--load_checkpoint_path", str(tmp_path / "compact")])
    assert "architecture: checkpoint compact, now reference" in line, line
    line = one_line_error(capsys, small + ["--results_dir", str(tmp_path / "b"),
                                           "--architecture", "compact",
                                           "--load_checkpoint_path",
                                           str(tmp_path / "reference")])
    assert "architecture: checkpoint reference, now compact" in line, line
