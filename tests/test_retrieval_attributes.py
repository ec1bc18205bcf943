"""Item attributes in the retrieval family: prepare_dataset --item_attributes against a
pure-Python reading of the JSON (dense and mapped ids, padding, items without an entry, keys
ignored), its one-line errors, the encoder's item vectors (the item's row plus the mean of its
attributes' rows) against numpy, and retrieval.main --item_attributes end to end: the
README's commands train, evaluate and export; the SavedModel scores with the augmented
vectors; --resume ends where an uninterrupted run does; recommend rebuilds the model."""
import json
import os
import re
import sys

import numpy as np
import pytest

from conftest import ROOT, bounded_run
from retrieval import data, prepare_dataset

DENSE_LINES = "1 3 5 2 7\n2 5 2 8\n3 1 3 8 9\n4 8 9 3\n"  # catalogue 1..9; 4 and 6 unused
DENSE_JSON = {"3": [40, 12, 40], "5": [7], "2": [], "9": [12, 99], "4": [5], "11": [1, 2],
              "8": [7, 40]}
MAP_LINES = "alice x y z\nbob y w x\ncarol z q\n"
MAP_JSON = {"y": [3, -1], "q": [3], "nope": [2], "x": []}


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def prepare(tmp_path, lines: str, attributes: dict, *flags):
    """(status, the dataset dir) of prepare_dataset on the lines and the JSON."""
    src = write(tmp_path / "in.txt", lines)
    found = write(tmp_path / "attributes.json", json.dumps(attributes))
    dst = str(tmp_path / "out")
    status = prepare_dataset.main(["--src", src, "--format", "lines", "--item_attributes",
                                   found, "--dst", dst, *flags])
    return status, dst


# ---- the reference: plain Python --------------------------------------------------------
def reference_table(entries: dict, row_of, rows: int) -> tuple:
    """(rows [rows][attributes 1..A], raw ids of 1..A, keys ignored): each kept item's
    attributes once each in the file's order, renumbered by increasing raw id."""
    kept, ignored = {}, 0
    for key, values in entries.items():
        row = row_of(key)
        if row is None:
            ignored += 1
            continue
        once = []
        for v in values:
            if v not in once:
                once.append(v)
        kept[row] = once
    raw = sorted(set(v for values in kept.values() for v in values))
    table = [[] for _ in range(rows)]
    for row, values in kept.items():
        table[row] = [raw.index(v) + 1 for v in values]
    return table, raw, ignored


def stored(dst: str) -> tuple:
    """(table rows without their padding, raw ids, metadata) as the dataset holds them."""
    spec = data.load(dst)
    with np.load(os.path.join(dst, "item_attributes.npz")) as a:
        table, raw = a["table"], a["raw_ids"]
    meta = spec.metadata["item_attributes"]
    assert table.shape == (spec.metadata["items"] + 1, meta["max_per_item"])
    for row in table:  # 0-padded on the right only
        assert list(row) == sorted(row, key=lambda v: v == 0)
    return [[int(v) for v in row if v] for row in table], list(raw), meta


def test_dense_ids_against_a_plain_reading(tmp_path, capsys):
    status, dst = prepare(tmp_path, DENSE_LINES, DENSE_JSON)
    assert status == 0
    table, raw, meta = stored(dst)
    want, want_raw, ignored = reference_table(
        DENSE_JSON, lambda k: int(k) if int(k) <= 9 else None, 10)
    assert (table, raw) == (want, want_raw)
    assert table[3] == [raw.index(40) + 1, raw.index(12) + 1]  # 40 twice: once
    assert table[1] == table[2] == table[6] == table[7] == [] and table[4] == [1]
    assert ignored == meta["ignored_keys"] == 1
    assert meta["attributes"] == 5 and meta["max_per_item"] == 2
    assert meta["items_with_attributes"] == 5
    assert "5 distinct, 5 items with some (at most 2), 1 keys ignored" in capsys.readouterr().out
    attributes = data.item_attributes(data.load(dst))
    assert attributes.count == 5
    assert [[int(v) for v in row if v] for row in attributes.table] == want


def test_mapped_ids_go_through_the_item_map(tmp_path):
    status, dst = prepare(tmp_path, MAP_LINES, MAP_JSON, "--ids", "map")
    assert status == 0
    with open(os.path.join(dst, "item_ids.tsv")) as f:
        rows = {raw: int(row) for row, raw in (line.rstrip("\n").split("\t") for line in f)}
    assert rows == {"x": 1, "y": 2, "z": 3, "w": 4, "q": 5}
    table, raw, meta = stored(dst)
    assert (table, raw, meta["ignored_keys"]) == reference_table(MAP_JSON, rows.get, 6)
    assert raw == [-1, 3] and table[2] == [2, 1] and table[5] == [2] and table[1] == []


def test_a_dataset_without_attributes_has_none(tmp_path):
    src = write(tmp_path / "in.txt", DENSE_LINES)
    assert prepare_dataset.main(["--src", src, "--format", "lines", "--dst",
                                 str(tmp_path / "plain")]) == 0
    assert data.item_attributes(data.load(str(tmp_path / "plain"))) is None


# ---- errors: one `error:` line naming the file and the entry, nothing written -------------
ERRORS = {
    # name: (JSON text, extra flags, what the line must name)
    "not_json": ('{"3": [1,}', [], ["not JSON", "line 1"]),
    "not_an_object": ("[[3, 1]]", [], ["expected a JSON object", "found list"]),
    "value_not_a_list": ('{"3": 5}', [], ["item '3'", "expected a list", "found 5"]),
    "value_with_a_string": ('{"5": [1], "3": [1, "b"]}', [], ["item '3'", 'found [1, "b"]']),
    "value_with_a_float": ('{"3": [1.0]}', [], ["item '3'", "found [1.0]"]),
    "value_with_a_bool": ('{"3": [true]}', [], ["item '3'", "found [true]"]),
    "value_an_object": ('{"3": {"a": 1}}', [], ["item '3'", 'found {"a": 1}']),
    "value_an_empty_object": ('{"3": {}}', [], ["item '3'", "found {}"]),
    "dense_key_not_an_id": ('{"3": [1], "x3": [2]}', [], ["key 'x3'",
                                                          "positive integer item id"]),
    "dense_key_zero": ('{"0": [2]}', [], ["key '0'", "positive integer item id"]),
    "one_item_twice": ('{"3": [1], "03": [2]}', [], ["key '03'", "item 3", "key '3'"]),
    "no_attribute_for_any_item": ('{"12": [1], "3": []}', [], ["no attribute for any item"]),
    "raw_ids": ('{"3": [1]}', ["--ids", "raw"], ["--item_attributes", "--ids raw"]),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_a_malformed_file_is_one_line(tmp_path, capsys, case):
    text, flags, names = ERRORS[case]
    src = write(tmp_path / "in.txt", DENSE_LINES)
    found = write(tmp_path / "attributes.json", text)
    status = prepare_dataset.main(["--src", src, "--format", "lines", "--item_attributes",
                                   found, "--dst", str(tmp_path / "out"), *flags])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    for part in names + ([found] if case != "raw_ids" else []):
        assert part in lines[0], lines[0]
    assert sorted(os.listdir(tmp_path)) == ["attributes.json", "in.txt"]


def test_a_missing_file_is_one_line(tmp_path, capsys):
    src = write(tmp_path / "in.txt", DENSE_LINES)
    status = prepare_dataset.main(["--src", src, "--format", "lines", "--item_attributes",
                                   str(tmp_path / "nope.json"), "--dst", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and "nope.json" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


# ---- the encoder ----------------------------------------------------------------------------
TABLE = np.array([[0, 0, 0], [2, 0, 0], [0, 0, 0], [1, 3, 4], [4, 2, 0], [3, 3, 0]])
HISTORIES = np.array([[0, 0, 1, 3, 4, 5], [2, 5, 3, 3, 1, 4]])


def augmented(items: np.ndarray, attributes: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Each row of the item table plus the mean of its attributes' rows (none: plus 0)."""
    out = items.copy()
    for r, ids in enumerate(table):
        ids = [a for a in ids if a]
        if ids:
            out[r] += np.mean([attributes[a] for a in ids], 0)
    return out


@pytest.mark.parametrize("model", ["sasrec", "hstu"])
def test_item_vectors_are_the_item_row_plus_the_mean_of_its_attributes(model):
    import tensorflow as tf
    from retrieval.model import Encoder, RetrievalConfig
    config = RetrievalConfig(model=model, items=5, length=6, width=8, dropout=0.0,
                             normalize=True, temperature=0.5, attributes=4, seed=3)
    encoder = Encoder(config, attributes=TABLE)
    assert "attribute_embeddings" in encoder.named
    attributes = encoder.attributes.numpy()
    assert attributes.shape == (5, 8) and not attributes[0].any()
    encoder.attributes[0].assign(np.full(8, 7.0, np.float32))  # the padding is never read
    want = augmented(encoder.items.numpy(), attributes, TABLE)
    np.testing.assert_allclose(encoder.item_vectors().numpy(), want, rtol=1e-6, atol=1e-6)
    # the same model without attributes, its item table the augmented one: the same history
    # vectors and scores, so both the history and the catalogue read the augmented vectors
    twin = Encoder(RetrievalConfig(**{**config.__dict__, "attributes": 0}))
    for name, variable in twin.named.items():
        variable.assign(want if name == "item_embeddings" else encoder.named[name])
    ids = tf.constant(HISTORIES, tf.int64)
    np.testing.assert_allclose(encoder.encode(ids).numpy(), twin.encode(ids).numpy(),
                               rtol=1e-5, atol=1e-5)
    vectors = encoder.encode(ids)[:, -1]
    queries = vectors.numpy() / np.linalg.norm(vectors.numpy(), axis=1, keepdims=True) / 0.5
    table = want[1:] / np.linalg.norm(want[1:], axis=1, keepdims=True)
    np.testing.assert_allclose(encoder.scores(vectors).numpy(), queries @ table.T,
                               rtol=1e-4, atol=1e-4)


def test_attributes_and_their_count_go_together():
    from retrieval.model import Encoder, RetrievalConfig
    with pytest.raises(ValueError, match="attributes"):
        Encoder(RetrievalConfig(items=5, attributes=4))
    with pytest.raises(ValueError, match="attributes"):
        Encoder(RetrievalConfig(items=5), attributes=TABLE)


# ---- retrieval.main --item_attributes end to end -------------------------------------------
ITEMS = 30
TINY = ["--embedding_dim", "16", "--batch_size", "32", "--eval_batch_size", "64",
        "--max_sequence_length", "8", "--print_freq", "3", "--cpu", "--lr", "0.01",
        "--dropout_rate", "0.1", "--epochs", "3", "--early_stopping_patience", "0"]


def readme_commands() -> list:
    """The inline commands of retrieval/README.md's attributes section, in order."""
    text = open(os.path.join(ROOT, "retrieval", "README.md")).read()
    section = text.split("\n## Item attributes", 1)[1].split("\n## ", 1)[0]
    return [c.split() for c in re.findall(r"`(python -m retrieval\.[^`]*)`", section)]


def successor_lines(users: int) -> str:
    """Next item = the previous one's successor (mod ITEMS) from a random start."""
    rng = np.random.default_rng(0)
    lines = []
    for user in range(1, users + 1):
        start, length = rng.integers(ITEMS), rng.integers(5, 12)
        lines.append(" ".join(map(str, [user] + [(start + i) % ITEMS + 1
                                                 for i in range(length)])))
    return "\n".join(lines) + "\n"


def at_toy_size(argv: list, base, files: dict) -> list:
    out = [sys.executable]
    for arg in argv[1:]:
        out.append(files[arg] if arg in files else
                   f"{base}{arg}" if arg.startswith("/tmp/") else arg)
    return out + (TINY if "retrieval.main" in argv else [])


def run(argv: list):
    proc = bounded_run(argv, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The README's commands (prepare, train, export) on successor data whose items have
    attributes (a third of them none): {dataset, out, the training command}."""
    base = tmp_path_factory.mktemp("attributes")
    files = {"Beauty.txt": write(base / "seq.txt", successor_lines(300)),
             "Beauty_item2attributes.json": write(base / "attributes.json", json.dumps(
                 {str(i): [i % 4 + 1, 10 + i % 5] for i in range(1, ITEMS + 1) if i % 3}))}
    commands = [at_toy_size(c, base, files) for c in readme_commands()]
    assert [c[2] for c in commands] == ["retrieval.prepare_dataset", "retrieval.main",
                                        "retrieval.main"]
    outputs = [run(c).stdout for c in commands]
    assert "item attributes: 9 distinct, 20 items with some" in outputs[0]
    dataset, out = (c[c.index(flag) + 1] for c, flag in zip(commands[1:], ("--dataset_dir",
                                                                          "--output_dir")))
    return {"dataset": dataset, "out": out, "train": commands[1]}


def checkpoint_arrays(out: str) -> dict:
    with np.load(os.path.join(out, "checkpoint", "arrays.npz")) as a:
        return {k: a[k] for k in a.files}


def test_the_readme_commands_train_evaluate_and_export(trained):
    results = json.load(open(os.path.join(trained["out"], "results.json")))
    assert results["valid"]["hr@10"] > 10 / ITEMS  # above chance
    arrays = checkpoint_arrays(trained["out"])
    assert arrays["attribute_embeddings"].shape == (10, 16)
    assert "attribute_embeddings/m" in arrays and not arrays["attribute_embeddings"][0].any()
    assert os.path.isdir(os.path.join(trained["out"], "saved_model"))


def test_the_saved_model_scores_with_the_augmented_item_vectors(trained):
    """Served scores = (history vector, normalised, / temperature) . (item row + mean of its
    attribute rows, normalised), by hand from the checkpoint's arrays; the history vector of
    the same model without attributes whose table is the augmented one."""
    import tensorflow as tf
    from retrieval.model import Encoder, RetrievalConfig
    arrays = checkpoint_arrays(trained["out"])
    spec = data.load(trained["dataset"])
    table = data.item_attributes(spec).table
    want = augmented(arrays["item_embeddings"], arrays["attribute_embeddings"], table)
    saved = np.load(os.path.join(trained["out"], "saved_model", "item_embeddings.npz"))
    normalised = want[1:] / np.linalg.norm(want[1:], axis=1, keepdims=True)
    np.testing.assert_array_equal(saved["ids"], np.arange(1, ITEMS + 1))
    np.testing.assert_allclose(saved["embeddings"], normalised, rtol=1e-5, atol=1e-5)

    twin = Encoder(RetrievalConfig(model="hstu", items=ITEMS, length=8, width=16))
    for name, variable in twin.named.items():
        variable.assign(want if name == "item_embeddings" else arrays[name])
    histories = np.array([[3, 4, 5, 6, 7, 8, 9, 10], [0, 0, 0, 0, 0, 28, 29, 30]])
    vectors = twin.encode(tf.constant(histories, tf.int64))[:, -1].numpy()
    scores = vectors / np.linalg.norm(vectors, axis=1, keepdims=True) / 0.05 @ normalised.T
    served = tf.saved_model.load(os.path.join(trained["out"], "saved_model"))
    top = served.signatures["serving_default"](item_ids=tf.constant(histories, tf.int64))
    k = top["top_k_ids"].shape[1]
    np.testing.assert_allclose(top["top_k_scores"].numpy(), -np.sort(-scores, 1)[:, :k],
                               rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(top["top_k_ids"].numpy()[:, 0], np.argmax(scores, 1) + 1)


def test_resumed_run_ends_where_an_uninterrupted_one_does(trained, tmp_path):
    command = trained["train"]
    cut = str(tmp_path / "cut")
    at = command.index("--output_dir") + 1
    run(command[:at] + [cut] + command[at + 1:] + ["--max_steps", "15"])
    run(command[:at] + [cut] + command[at + 1:] + ["--resume"])
    assert json.load(open(os.path.join(cut, "results.json"))) == \
        json.load(open(os.path.join(trained["out"], "results.json")))
    straight, resumed = checkpoint_arrays(trained["out"]), checkpoint_arrays(cut)
    assert sorted(straight) == sorted(resumed)
    for name in straight:
        np.testing.assert_array_equal(straight[name], resumed[name], err_msg=name)


def test_recommend_rebuilds_the_retrieval_model_with_its_attributes(trained):
    from recommend.stages import load_retrieval
    model = load_retrieval(trained["out"], data.load(trained["dataset"]))
    saved = np.load(os.path.join(trained["out"], "saved_model", "item_embeddings.npz"))
    np.testing.assert_allclose(model.catalogue().numpy(), saved["embeddings"], rtol=1e-6,
                               atol=1e-6)


def test_asked_on_a_dataset_without_attributes_is_one_line(tmp_path):
    src = write(tmp_path / "seq.txt", successor_lines(20))
    assert prepare_dataset.main(["--src", src, "--format", "lines", "--dst",
                                 str(tmp_path / "plain")]) == 0
    out = tmp_path / "run"
    proc = bounded_run([sys.executable, "-m", "retrieval.main", "--dataset_dir",
                        str(tmp_path / "plain"), "--output_dir", str(out), "--item_attributes",
                        "--cpu"], timeout=120, cwd=ROOT)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1].startswith("error: --item_attributes"), lines
    assert "has no item attributes" in lines[-1] and not out.exists()


def test_a_dataset_with_attributes_trains_with_them_unless_told_not_to(trained, tmp_path):
    """The flag's default follows the dataset; the log records what was used, which is what
    recommend.main rebuilds the retrieval model from."""
    from core.dllog import read_log
    command = [a for a in trained["train"] if a != "--item_attributes"]
    at = command.index("--output_dir") + 1
    used = {}
    for name, extra in (("default", []), ("off", ["--noitem_attributes"])):
        out = str(tmp_path / name)
        run(command[:at] + [out] + command[at + 1:] + ["--max_steps", "2"] + extra)
        logged = [r["data"] for r in read_log(os.path.join(out, "log.json"))
                  if r.get("type") == "PARAMETER"][0]
        used[name] = (logged["item_attributes"], "attribute_embeddings" in checkpoint_arrays(out))
    assert used == {"default": (True, True), "off": (False, False)}
    # the run without them is evaluated without them (its log says so), unless told otherwise
    evaluate = command[:at] + [str(tmp_path / "off")] + command[at + 1:] + ["--mode", "eval"]
    run(evaluate)
    proc = bounded_run(evaluate + ["--item_attributes"], timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and "attribute" in proc.stderr.strip().splitlines()[-1], \
        proc.stderr[-2000:]
