"""The retrieval CLI end to end on small prepared datasets: it learns, resumes exactly, two
processes give one process's figures, the exported SavedModel's top-k is a brute force over
its saved item table, and a dynamic item table takes and serves raw ids."""
import json
import os
import sys

import numpy as np
import pytest

from core.dllog import read_log
from conftest import HOROVODRUN, bounded_run, horovodrun, require_or_skip

ITEMS = 30
PROTOCOLS = ("valid", "test", "valid_filtered", "test_filtered")
METRIC_KEYS = {"hr@1", "hr@5", "hr@10", "hr@20", "hr@50", "ndcg@5", "ndcg@10", "ndcg@20",
               "ndcg@50", "mrr"}
TINY = ["--embedding_dim", "16", "--batch_size", "32", "--eval_batch_size", "64",
        "--max_sequence_length", "8", "--print_freq", "3", "--cpu", "--lr", "0.01",
        "--dropout_rate", "0.1"]


def successor_lines(users: int, seed: int = 0, offset: int = 0, scale: int = 1) -> list:
    """`user item item ...` lines whose next item is the previous one's successor (mod
    ITEMS), from a random start: a pattern a retrieval model can learn. Ids scaled and
    offset (raw ids) on request."""
    rng = np.random.default_rng(seed)
    lines = []
    for user in range(1, users + 1):
        start, length = rng.integers(ITEMS), rng.integers(5, 12)
        items = [(start + i) % ITEMS + 1 for i in range(length)]
        lines.append(" ".join(str(v) for v in [user] + [i * scale + offset for i in items]))
    return lines


def prepare(tmp_path, name: str, lines: list, *flags) -> str:
    src, dst = tmp_path / f"{name}.txt", tmp_path / name
    src.write_text("\n".join(lines) + "\n")
    proc = bounded_run([sys.executable, "-m", "retrieval.prepare_dataset", "--src", str(src),
                        "--format", "lines", "--dst", str(dst), *flags], timeout=120)
    assert proc.returncode == 0, proc.stderr
    return str(dst)


def retrieval(*args, timeout=300, launcher=()):
    proc = bounded_run([*launcher, sys.executable, "-m", "retrieval.main", *args],
                       timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("retrieval"), "successors", successor_lines(300))


def results(out) -> dict:
    return json.load(open(os.path.join(out, "results.json")))


@pytest.mark.parametrize("model,amp", [("sasrec", False), ("hstu", False), ("hstu", True)])
def test_learns_the_successor_pattern_and_reports_the_kept_epoch(data, tmp_path, model, amp):
    """--amp: bfloat16 compute where the CPU has it, else float32 (said in one line)."""
    out = str(tmp_path / model)
    proc = retrieval("--model", model, "--dataset_dir", data, "--output_dir", out,
                     "--epochs", "8", *TINY, *(["--amp"] if amp else []))
    got = results(out)
    assert set(got) == {*PROTOCOLS, "best_epoch", "selected_on"}
    assert got["selected_on"] == "ndcg@10"
    for split in PROTOCOLS:
        assert set(got[split]) == METRIC_KEYS, split
    for plain, filtered in (("valid", "valid_filtered"), ("test", "test_filtered")):
        # removing the other seen items can only lift the target
        for key, value in got[plain].items():
            assert got[filtered][key] >= value, (filtered, key)
    # chance: 10 of 30 items; the pattern makes the next item certain
    assert got["test"]["hr@10"] > 0.8, proc.stdout[-2000:]
    log = read_log(os.path.join(out, "log.json"))
    evals = {r["step"][0]: r["data"]["ndcg@10"] for r in log
             if isinstance(r["step"], list) and len(r["step"]) == 2 and "ndcg@10" in r["data"]}
    assert got["best_epoch"] == max(evals, key=lambda e: (evals[e], -e))
    assert got["valid"]["ndcg@10"] == pytest.approx(evals[got["best_epoch"]])
    assert os.path.isfile(os.path.join(out, "curves.png"))


def test_filter_seen_selects_on_the_seen_removed_protocol_and_eval_rewrites_the_figures(
        data, tmp_path):
    out = str(tmp_path / "filtered")
    retrieval("--model", "sasrec", "--dataset_dir", data, "--output_dir", out, "--epochs", "4",
              "--filter_seen", *TINY)
    trained = results(out)
    assert trained["selected_on"] == "filtered_ndcg@10"
    log = read_log(os.path.join(out, "log.json"))
    evals = {r["step"][0]: r["data"]["filtered_ndcg@10"] for r in log
             if isinstance(r["step"], list) and len(r["step"]) == 2
             and "filtered_ndcg@10" in r["data"]}
    assert trained["best_epoch"] == max(evals, key=lambda e: (evals[e], -e))
    os.unlink(os.path.join(out, "results.json"))
    retrieval("--model", "sasrec", "--dataset_dir", data, "--output_dir", out, "--mode", "eval",
              *TINY)
    assert results(out) == trained


def test_resumed_run_ends_where_an_uninterrupted_one_does(data, tmp_path):
    """Cut mid-epoch, under the default learning-rate decay (which --epochs sets)."""
    common = ["--model", "sasrec", "--dataset_dir", data, *TINY,
              "--early_stopping_patience", "0", "--epochs", "4"]
    straight, cut = str(tmp_path / "straight"), str(tmp_path / "cut")
    retrieval(*common, "--output_dir", straight)
    retrieval(*common, "--output_dir", cut, "--max_steps", "15")
    retrieval(*common, "--output_dir", cut, "--resume")
    assert results(cut) == results(straight)
    with np.load(os.path.join(straight, "checkpoint", "arrays.npz")) as a, \
            np.load(os.path.join(cut, "checkpoint", "arrays.npz")) as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_linear_lr_decay_falls_to_zero_at_the_last_epoch(data, tmp_path):
    out = str(tmp_path / "decayed")
    retrieval("--model", "sasrec", "--dataset_dir", data, "--output_dir", out, *TINY,
              "--epochs", "3", "--lr_decay", "linear", "--print_freq", "1",
              "--early_stopping_patience", "0")
    logged = {r["step"][1]: (r["step"][0], r["data"]["learning_rate"])
              for r in read_log(os.path.join(out, "log.json"))
              if isinstance(r["step"], list) and "learning_rate" in r["data"]}
    steps_per_epoch = max(step for step, (epoch, _) in logged.items() if epoch == 0)
    total = 3 * steps_per_epoch
    assert max(logged) == total
    for step, (_, rate) in logged.items():
        update = step - 1  # the rate logged after a step is the one that step used
        assert rate == pytest.approx(0.01 * (total - update) / total), step


def one_and_two_processes(common, tmp_path) -> str:
    """Train `common` in tmp_path/one on one process and tmp_path/two on two; the kept epoch
    and the figures agree. Returns the two processes' output."""
    require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}")
    retrieval(*common, "--output_dir", str(tmp_path / "one"))
    two_processes = retrieval(*common, "--output_dir", str(tmp_path / "two"),
                              launcher=horovodrun(2), timeout=400)
    one, two = results(tmp_path / "one"), results(tmp_path / "two")
    assert one["best_epoch"] == two["best_epoch"]
    # the ranks sum gradients in another order: a near tie may flip for one of 300 users
    for split in ("valid", "test"):
        for key, value in one[split].items():
            assert two[split][key] == pytest.approx(value, abs=1.01 / 300), (split, key)
    return two_processes.stdout


def test_two_processes_give_the_figures_of_one(data, tmp_path):
    one_and_two_processes(["--model", "hstu", "--dataset_dir", data, *TINY, "--epochs", "2"],
                          tmp_path)
    losses = [[r["data"]["loss"] for r in read_log(str(tmp_path / run / "log.json"))
               if "loss" in r["data"] and isinstance(r["step"], list)] for run in ("one", "two")]
    # the same steps: equal at first, then apart by the drift of the sums' order (scores
    # over the temperature amplify it)
    np.testing.assert_allclose(losses[0][:2], losses[1][:2], rtol=1e-5)
    np.testing.assert_allclose(losses[0], losses[1], rtol=3e-3)


def test_exported_top_k_is_a_brute_force_over_the_saved_table(data, tmp_path):
    import tensorflow as tf
    out = str(tmp_path / "run")
    common = ["--model", "hstu", "--dataset_dir", data, "--output_dir", out, *TINY]
    retrieval(*common, "--epochs", "8")
    retrieval(*common, "--mode", "export", "--top_k", "5")
    loaded = tf.saved_model.load(os.path.join(out, "saved_model"))
    # right-padded, longer than the model's 8 positions, and left-padded histories
    histories = tf.constant([[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 0],
                             [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 29, 30]], tf.int64)
    top = loaded.signatures["serving_default"](item_ids=histories)
    query = loaded.signatures["encode"](item_ids=histories)["query"].numpy()
    saved = np.load(os.path.join(out, "saved_model", "item_embeddings.npz"))
    scores = query @ saved["embeddings"].T
    want = saved["ids"][np.argsort(-scores, axis=1, kind="stable")[:, :5]]
    np.testing.assert_array_equal(top["top_k_ids"].numpy(), want)
    # the successors, learnt: of the most recent 8 (5..12), and of 29, 30
    ids = top["top_k_ids"].numpy()
    assert 13 in ids[0, :2] and 1 in ids[1, :2], ids


def test_dynamic_item_table_takes_and_serves_raw_ids(tmp_path):
    """Raw ids (10^12 + 1000 * item) train a dynamic table; a continued run on data with a
    new item gives it a row, and the next export serves it."""
    import tensorflow as tf
    offset, scale = 10 ** 12, 1000
    first = successor_lines(200, scale=scale, offset=offset)
    # the second data set's users also visit item 31, after item 30 (then 1 and 2: their
    # validation and test targets, so 31 is a training item)
    new = " ".join(str(i * scale + offset) for i in (31, 1, 2))
    second = [line + f" {new}" if line.endswith(f" {30 * scale + offset}") else line
              for line in successor_lines(200, seed=1, scale=scale, offset=offset)]
    assert any(line.endswith(new) for line in second)
    flags = ("--ids", "raw", "--capacity", "64")
    one, two = prepare(tmp_path, "one", first, *flags), prepare(tmp_path, "two", second, *flags)
    out = str(tmp_path / "run")
    # a constant rate: three epochs of a decayed one learn too little to be sure of item 7
    common = ["--model", "sasrec", "--output_dir", out, *TINY, "--lr_decay", "none"]
    retrieval(*common, "--dataset_dir", one, "--epochs", "3")
    retrieval(*common, "--dataset_dir", one, "--mode", "export", "--top_k", "3")
    saved = np.load(os.path.join(out, "saved_model", "item_embeddings.npz"))
    assert sorted(saved["ids"]) == [i * scale + offset for i in range(1, ITEMS + 1)]
    served = tf.saved_model.load(os.path.join(out, "saved_model")).signatures["serving_default"]
    history = tf.constant([[i * scale + offset for i in (4, 5, 6)]], tf.int64)
    assert served(item_ids=history)["top_k_ids"].numpy()[0, 0] == 7 * scale + offset

    retrieval(*common, "--dataset_dir", two, "--epochs", "3", "--warm_start")
    retrieval(*common, "--dataset_dir", two, "--mode", "export", "--top_k", "31")
    saved = np.load(os.path.join(out, "saved_model", "item_embeddings.npz"))
    assert 31 * scale + offset in saved["ids"]
    served = tf.saved_model.load(os.path.join(out, "saved_model")).signatures["serving_default"]
    top = served(item_ids=history)["top_k_ids"].numpy()[0]
    assert 31 * scale + offset in top and 0 not in top


def test_a_dynamic_item_table_on_two_processes_gives_the_figures_of_one(tmp_path):
    """Raw ids: every rank maps the global batch's ids, so the replicas agree and the run
    is one process's: the same figures, the same ids served."""
    offset, scale = 10 ** 12, 1000
    raw = prepare(tmp_path, "raw", successor_lines(300, scale=scale, offset=offset), "--ids",
                  "raw", "--capacity", "64")
    common = ["--model", "sasrec", "--dataset_dir", raw, *TINY, "--epochs", "2"]
    one_and_two_processes(common, tmp_path)
    maps = []
    for run in ("one", "two"):
        retrieval(*common, "--output_dir", str(tmp_path / run), "--mode", "export")
        with np.load(os.path.join(tmp_path, run, "saved_model", "item_embeddings.npz")) as a:
            maps.append(a["ids"])
    np.testing.assert_array_equal(maps[0], maps[1])  # every id in the same row
    assert sorted(maps[0]) == [i * scale + offset for i in range(1, ITEMS + 1)]


def test_dynamic_features_turns_a_static_catalogue_open(data, tmp_path):
    """--dynamic_features item_ids on dense ids: the table maps them as raw ids and serves
    them back (30 items seen, all of them candidates)."""
    import tensorflow as tf
    out = str(tmp_path / "run")
    common = ["--model", "hstu", "--dataset_dir", data, "--output_dir", out, *TINY,
              "--dynamic_features", "item_ids"]
    retrieval(*common, "--epochs", "6")
    retrieval(*common, "--mode", "export", "--top_k", "5")
    saved = np.load(os.path.join(out, "saved_model", "item_embeddings.npz"))
    assert sorted(saved["ids"]) == list(range(1, ITEMS + 1))
    served = tf.saved_model.load(os.path.join(out, "saved_model")).signatures["serving_default"]
    assert 13 in served(item_ids=tf.constant([[10, 11, 12]], tf.int64))["top_k_ids"].numpy()


@pytest.mark.parametrize("flags,culprit", [
    (["--mode", "export"], "checkpoint"),
    (["--resume"], "checkpoint"),
    (["--resume", "--warm_start"], "--warm_start"),
    (["--num_heads", "3"], "--num_heads"),
    (["--lr_decay", "cosine"], "--lr_decay"),
])
def test_bad_requests_end_in_one_error_line(data, tmp_path, flags, culprit):
    proc = bounded_run([sys.executable, "-m", "retrieval.main", "--model", "sasrec",
                        "--dataset_dir", data, "--output_dir", str(tmp_path / "none"),
                        *TINY, *flags], timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and culprit in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_an_id_outside_the_static_table_is_one_error_line(data, tmp_path):
    """A spec whose catalogue is smaller than the ids in the files: the reader stops at the
    first id outside 1..N, naming the feature and where."""
    import shutil
    import yaml
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    spec = yaml.safe_load(open(bad / "feature_spec.yaml"))
    spec["feature_spec"]["item_ids"]["cardinality"] = 5
    yaml.safe_dump(spec, open(bad / "feature_spec.yaml", "w"))
    proc = bounded_run([sys.executable, "-m", "retrieval.main", "--model", "sasrec",
                        "--dataset_dir", str(bad), "--output_dir", str(tmp_path / "out"),
                        *TINY], timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "item_ids" in errors[0] and "Traceback" not in proc.stderr


def fresh_ending_lines(users: int, twins: bool) -> list:
    """successor_lines whose last two items are fresh: ids no other line holds, so nothing in
    training predicts them. twins: each user also has a twin with two more fresh items,
    whose training rows hold the user's validation and test pairs (a leak, made on purpose)."""
    fresh = iter(range(ITEMS + 1, ITEMS + 1 + 4 * users))
    lines = []
    for line in successor_lines(users, seed=5):
        user, items = line.split(" ", 1)
        lines.append(f"{user} {items} {next(fresh)} {next(fresh)}")
        if twins:
            lines.append(f"{int(user) + users} {lines[-1].split(' ', 1)[1]} {next(fresh)} "
                         f"{next(fresh)}")
    return lines


def test_leakage_canary_unpredictable_targets_score_at_chance(tmp_path):
    """Targets nothing in training predicts rank at chance under both protocols; the same
    data with each user's validation and test pairs leaked into a twin's training rows
    scores far above it (the canary can fail)."""
    users = 150
    chance = 10 / (ITEMS + 2 * users)  # HR@10 of a target placed at random among the items
    bound = chance + 4 * (chance * (1 - chance) / users) ** 0.5
    figures = {}
    for twins in (False, True):
        data = prepare(tmp_path, f"twins_{twins}", fresh_ending_lines(users, twins))
        out = tmp_path / f"run_{twins}"
        retrieval("--model", "sasrec", "--dataset_dir", data, *TINY, "--epochs", "12",
                  "--lr_decay", "none", "--output_dir", str(out))
        figures[twins] = results(out)
    for split in PROTOCOLS:
        assert figures[False][split]["hr@10"] <= bound, (split, figures[False][split])
        assert figures[True][split]["hr@10"] >= bound + 0.05, (split, figures[True][split])
