"""The three SavedModels with ids outside their tables: the batch is served, each such id
reads the documented row (0; for SIM the padding id 0) and is counted in out_of_range_ids;
a Wide & Deep multi-hot length above its hotness is refused naming the feature."""
import numpy as np
import pytest
import tensorflow as tf

from test_sim_training import run_main as run_sim_main
from test_training import main_in_process

CARDINALITIES = (200, 500, 50)


def served(serve, inputs):
    out = serve(**{k: tf.constant(v) for k, v in inputs.items()})
    return out["probabilities"].numpy(), int(out["out_of_range_ids"].numpy())


def test_dlrm_out_of_range_ids_read_row_zero(tmp_path):
    exported = tmp_path / "saved_model"
    main_in_process(["--mode", "deploy", "--dataset_type", "synthetic",
                     "--synthetic_dataset_cardinalities", ",".join(map(str, CARDINALITIES)),
                     "--synthetic_dataset_num_numerical_features", "4", "--embedding_dim", "8",
                     "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1", "--cpu",
                     "--saved_model_output_path", str(exported),
                     "--log_path", str(tmp_path / "log.json")])
    serve = tf.saved_model.load(str(exported)).signatures["serving_default"]
    rng = np.random.default_rng(0)
    numerical = rng.standard_normal((6, 4)).astype(np.float32)
    ids = np.stack([rng.integers(1, c, 6) for c in CARDINALITIES], axis=1)
    outside = ids.copy()
    outside[0, 0], outside[2, 1], outside[2, 2], outside[5, 0] = 200, -1, 10**12, -7
    replaced = outside.copy()
    replaced[(outside < 0) | (outside >= np.array(CARDINALITIES))] = 0
    got, count = served(serve, {"numerical": numerical, "categorical": outside})
    want, zero = served(serve, {"numerical": numerical, "categorical": replaced})
    assert count == 4 and zero == 0
    assert np.all(np.isfinite(got)) and np.array_equal(got, want)
    in_range, _ = served(serve, {"numerical": numerical, "categorical": ids})
    assert np.array_equal(got[[1, 3, 4]], in_range[[1, 3, 4]])  # untouched rows unchanged


@pytest.fixture(scope="module")
def wide_deep_model(tmp_path_factory):
    from wide_and_deep import generate_feature_spec, synthetic
    from wide_and_deep.main import main
    root = tmp_path_factory.mktemp("wd_serving")
    spec = str(root / "spec.yaml")
    assert generate_feature_spec.main(["--dst", spec, "--onehot", "40:8,30:4",
                                       "--multihot", "20:4", "--num_numerical", "2"]) == 0
    assert synthetic.main(["--feature_spec", spec, "--dst", str(root / "data"),
                           "--train_rows", "1000", "--test_rows", "300"]) == 0
    assert main(["--dataset_path", str(root / "data"), "--model_dir", str(root / "model"),
                 "--results_dir", str(root), "--cpu", "--num_epochs", "1",
                 "--global_batch_size", "256", "--eval_batch_size", "300",
                 "--deep_hidden_units", "8"]) == 0
    return tf.saved_model.load(str(root / "model" / "saved_model")).signatures["serving_default"]


def wide_deep_inputs(serve, rows=5, seed=0):
    rng = np.random.default_rng(seed)
    specs = serve.structured_input_signature[1]
    inputs = {}
    for name, spec in specs.items():
        if spec.dtype == tf.float32:
            inputs[name] = rng.standard_normal(rows).astype(np.float32)
        elif name.endswith("__length"):
            inputs[name] = np.full(rows, 2, np.int32)
        else:
            inputs[name] = rng.integers(0, 20, tuple(d or rows for d in spec.shape)) \
                .astype(np.int64)
    return inputs


def test_wide_deep_out_of_range_ids_read_row_zero(wide_deep_model):
    inputs = wide_deep_inputs(wide_deep_model)
    onehot = sorted(k for k in inputs if k.startswith("onehot"))[0]
    outside = dict(inputs)
    outside[onehot] = inputs[onehot].copy()
    outside[onehot][1] = 40  # cardinality 40: ids 0..39
    outside["multihot_0"] = inputs["multihot_0"].copy()
    outside["multihot_0"][3, 0] = -2  # within the row's length 2: counted
    outside["multihot_0"][4, 2] = 99  # past the row's length: padding, read as 0, not counted
    replaced = {k: v.copy() for k, v in outside.items()}
    replaced[onehot][1] = 0
    replaced["multihot_0"][3, 0] = 0
    replaced["multihot_0"][4, 2] = 0
    got, count = served(wide_deep_model, outside)
    want, zero = served(wide_deep_model, replaced)
    assert count == 2 and zero == 0
    assert np.all(np.isfinite(got)) and np.array_equal(got, want)


def test_wide_deep_multihot_longer_than_its_hotness_names_the_feature(wide_deep_model):
    inputs = wide_deep_inputs(wide_deep_model)
    inputs["multihot_0__length"][2] = 4  # hotness 3
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="feature multihot_0: a length above its hotness 3"):
        served(wide_deep_model, inputs)


def test_sim_out_of_range_ids_read_the_padding_id(tmp_path):
    from sim.synthetic import write
    data, export = str(tmp_path / "data"), str(tmp_path / "saved_model")
    write(data, users=300, items=200, categories=8, history_length=100)
    run_sim_main(["--dataset_dir", data, "--cpu", "--results_dir", str(tmp_path / "r"),
                  "--epochs", "1", "--global_batch_size", "128", "--stage_one_mlp_dims", "16",
                  "--stage_two_mlp_dims", "16,8", "--aux_mlp_dims", "8", "--export_path",
                  export])
    from core.columnar import open_reader
    from core.sources import load_spec
    from sim.contract import SIM_CONTRACT, TARGET_CHANNEL, POSITIVE_CHANNEL
    spec = load_spec(data, SIM_CONTRACT)
    serve = tf.saved_model.load(export).signatures["serving_default"]
    names = serve.structured_input_signature[1]
    batch = open_reader(spec, "test", 4).get(0)
    inputs = {k: np.asarray(batch[k]).astype(np.int64) for k in names}
    target, history = spec.channel(TARGET_CHANNEL)[0], spec.channel(POSITIVE_CHANNEL)[0]
    outside = {k: v.copy() for k, v in inputs.items()}
    outside[target][0] = spec.id_limit(target) + 1  # ids 0..cardinality are valid
    outside[history][2, -1] = -3
    replaced = {k: v.copy() for k, v in outside.items()}
    replaced[target][0] = replaced[history][2, -1] = 0
    got, count = served(serve, outside)
    want, zero = served(serve, replaced)
    assert count == 2 and zero == 0
    assert np.all(np.isfinite(got)) and np.array_equal(got, want)
