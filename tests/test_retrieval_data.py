"""retrieval.prepare_dataset and retrieval.data: the leave-one-out split of each layout
against an independent pure-Python reading, the counts, truncation, the reader's left padding,
and the one-line errors of the command."""
import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from core.feature_spec import DynamicSpec
from retrieval import data, prepare_dataset
from retrieval.contract import ITEMS, TIMESTAMPS, USER

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEAUTY = "/work/shared/data/sequential/Beauty.txt"


# ---- the reference: plain Python --------------------------------------------------------
def reference_split(sequences: dict, max_length: int) -> dict:
    """{mapping: {user: items}} from {user: items oldest first}, the rule spelled out."""
    out = {"train": {}, "validation": {}, "test": {}}
    keep = max_length + 1
    for user, items in sequences.items():
        n = len(items)
        if n == 2:
            out["train"][user] = items[-keep:]
        if n >= 3:
            if n - 2 >= 2:
                out["train"][user] = items[:n - 2][-keep:]
            out["validation"][user] = items[:n - 1][-keep:]
            out["test"][user] = items[-keep:]
    return out


def reference_counts(sequences: dict) -> dict:
    lengths = [len(s) for s in sequences.values()]
    return {"dropped_one_item": lengths.count(1), "train_only_two_items": lengths.count(2),
            "no_train_row_three_items": lengths.count(3)}


def read_lines(path):
    with open(path) as f:
        return {int(p[0]): [int(x) for x in p[1:]] for p in (l.split() for l in f) if p}


def read_pairs(path, convert=int):
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                user, item = line.split()
                out.setdefault(convert(user), []).append(convert(item))
    return out


def prepared(dst, length=None):
    """{mapping: {user: items (padding stripped)}} and the spec, read back by the reader."""
    spec = data.load(str(dst))
    out = {}
    for mapping in ("train", "validation", "test"):
        rows = data.read_sequences(spec, mapping, length) if spec.metadata["rows"][mapping] \
            else {ITEMS: np.zeros((0, 1), np.int64), USER: np.zeros(0, np.int64)}
        out[mapping] = {int(u): [int(x) for x in r[r != 0]]
                        for u, r in zip(rows[USER], rows[ITEMS])}
    return out, spec


def prepare(*args):
    assert prepare_dataset.main([str(a) for a in args]) == 0


def write(path, text):
    path.write_text(text)
    return path


# ---- the layouts --------------------------------------------------------------------------
def test_lines_split_counts_and_truncation(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for user in range(1, 41):
        n = int(rng.integers(1, 12))
        lines.append(" ".join(map(str, [user] + list(rng.integers(1, 30, n)))))
    src = write(tmp_path / "seq.txt", "\n".join(lines) + "\n\n")
    prepare("--src", src, "--format", "lines", "--dst", tmp_path / "out", "--max_length", 4)
    got, spec = prepared(tmp_path / "out")
    sequences = read_lines(src)
    assert got == reference_split(sequences, 4)
    m = spec.metadata
    assert m["short_users"] == reference_counts(sequences)
    assert (m["users"], m["interactions"]) == (40, sum(map(len, sequences.values())))
    assert m["items"] == max(max(s) for s in sequences.values())
    assert m["rows"] == {k: len(v) for k, v in got.items()}
    assert spec.dimension(ITEMS) == 5 and spec.cardinality(ITEMS) == m["items"]
    assert not data.catalogue(spec).timestamps and data.catalogue(spec).max_length == 4
    assert any(len(s) > 5 for s in sequences.values())  # truncation was exercised
    assert m["truncated_rows"]["test"] == sum(len(s) > 5 for s in sequences.values())
    # rows are stored as long as they are (variable length), oldest first
    import pyarrow.parquet as pq
    stored = pq.read_table(tmp_path / "out" / "test" / "part_00000.parquet").to_pydict()
    assert [len(r) for r in stored[ITEMS]] == [min(len(sequences[u]), 5) for u in
                                               stored[USER]]


def test_pairs_short_users(tmp_path):
    text = "".join(f"{u} {i}\n" for u, items in [(7, [3]), (2, [5, 6]), (9, [1, 2, 3]),
                                                 (4, [8, 8, 9, 1]), (5, [4, 3, 2, 1, 7, 6])]
                   for i in items)
    src = write(tmp_path / "pairs.txt", text)
    prepare("--src", src, "--format", "pairs", "--dst", tmp_path / "out")
    got, spec = prepared(tmp_path / "out")
    sequences = read_pairs(src)
    assert got == reference_split(sequences, 200)
    assert got["train"] == {2: [5, 6], 4: [8, 8], 5: [4, 3, 2, 1]}
    assert got["test"] == {9: [1, 2, 3], 4: [8, 8, 9, 1], 5: [4, 3, 2, 1, 7, 6]}
    assert spec.metadata["short_users"] == {"dropped_one_item": 1, "train_only_two_items": 1,
                                            "no_train_row_three_items": 1}
    assert spec.metadata["users"] == 5 and spec.metadata["items"] == 9
    # rows in the file's order of users
    rows = data.read_sequences(spec, "test")
    assert list(rows[USER]) == [9, 4, 5]


def test_csv_sorted_by_time_with_timestamps(tmp_path):
    rows = [("u", "extra", "item", "timestamp")]
    rng = np.random.default_rng(1)
    for k in range(60):
        rows.append((int(rng.integers(1, 8)), "x", int(rng.integers(1, 20)),
                     int(rng.integers(100, 110))))  # many equal timestamps
    src = tmp_path / "log.csv"
    with open(src, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user", "extra", "item", "timestamp"])
        w.writerows(rows[1:])
    prepare("--src", src, "--format", "csv", "--dst", tmp_path / "out", "--max_length", 3)
    expected = {}
    for user, _, item, stamp in sorted(rows[1:], key=lambda r: (r[0], r[3])):  # stable
        expected.setdefault(user, []).append((item, stamp))
    spec = data.load(str(tmp_path / "out"))
    assert data.catalogue(spec).timestamps
    split_items = reference_split({u: [i for i, _ in s] for u, s in expected.items()}, 3)
    split_stamps = reference_split({u: [t for _, t in s] for u, s in expected.items()}, 3)
    for mapping in ("train", "validation", "test"):
        got = data.read_sequences(spec, mapping, 3)
        assert got[TIMESTAMPS].shape == got[ITEMS].shape == (len(got[USER]), 4)
        assert list(got[USER]) == sorted(split_items[mapping])  # sorted by user
        for user, items, stamps in zip(got[USER], got[ITEMS], got[TIMESTAMPS]):
            real = items != 0
            assert list(items[real]) == split_items[mapping][user]
            assert list(stamps[real]) == split_stamps[mapping][user]
            assert not stamps[~real].any()


def test_headerless_csv_and_map_ids(tmp_path):
    """Amazon's ratings layout (user,item,rating,timestamp, no header), string ids mapped in
    the order the file first names them, dictionaries written beside the data."""
    text = ("bob,B9,5.0,30\nann,A1,4.0,20\nbob,A1,3.0,10\nann,C7,1.0,5\n"
            "bob,C7,2.0,20\nann,B9,4.0,25\ncid,A1,5.0,1\n")
    src = write(tmp_path / "ratings.csv", text)
    prepare("--src", src, "--format", "csv", "--dst", tmp_path / "out", "--ids", "map")
    users = dict(l.split("\t") for l in (tmp_path / "out" / "user_ids.tsv").read_text()
                 .splitlines())
    items = dict(l.split("\t") for l in (tmp_path / "out" / "item_ids.tsv").read_text()
                 .splitlines())
    assert users == {"1": "bob", "2": "ann", "3": "cid"}
    assert items == {"1": "B9", "2": "A1", "3": "C7"}
    got, spec = prepared(tmp_path / "out")
    named = {users[str(u)]: [items[str(i)] for i in s] for u, s in got["test"].items()}
    assert named == {"bob": ["A1", "C7", "B9"], "ann": ["C7", "A1", "B9"]}
    assert got["train"] == {}  # two users of 3 items (no train row); cid dropped
    assert spec.metadata["ids"] == "map" and spec.cardinality(ITEMS) == 3


def test_raw_ids_are_dynamic(tmp_path):
    big = 2 ** 62 + 5
    text = f"-5 {big}\n-5 -3\n-5 -3\n-5 42\n11 -1\n11 {big}\n"
    src = write(tmp_path / "raw.txt", text)
    prepare("--src", src, "--format", "pairs", "--dst", tmp_path / "out", "--ids", "raw")
    spec = data.load(str(tmp_path / "out"))
    cat = data.catalogue(spec)
    assert cat.dynamic == DynamicSpec() and cat.items == 2 * 4  # 2 x distinct items
    rows = data.read_sequences(spec, "test", 4)
    assert list(rows[USER]) == [-5] and list(rows[ITEMS][0]) == [0, big, -3, -3, 42]
    assert list(data.read_sequences(spec, "train")[ITEMS][1][-2:]) == [-1, big]
    prepare("--src", src, "--format", "pairs", "--dst", tmp_path / "cap", "--ids", "raw",
            "--capacity", 100)
    assert data.catalogue(data.load(str(tmp_path / "cap"))).items == 100


# ---- the reader ---------------------------------------------------------------------------
def test_reader_left_pads_and_truncates(tmp_path):
    lines = [f"{u} " + " ".join(str(10 * u + k) for k in range(1, u + 4)) for u in range(1, 8)]
    src = write(tmp_path / "seq.txt", "\n".join(lines))
    prepare("--src", src, "--format", "lines", "--dst", tmp_path / "out", "--max_length", 6)
    spec = data.load(str(tmp_path / "out"))
    test = reference_split(read_lines(src), 6)["test"]
    for length in (2, 6, 9):
        rows = data.read_sequences(spec, "test", length)
        assert set(rows) == {ITEMS, USER}
        assert rows[ITEMS].shape == (7, length + 1)
        for user, row in zip(rows[USER], rows[ITEMS]):
            kept = test[user][-(length + 1):]
            assert list(row) == [0] * (length + 1 - len(kept)) + kept


def test_reader_empty_mapping_is_named(tmp_path):
    src = write(tmp_path / "seq.txt", "1 1 2 3\n2 4 5 6\n")  # 3 items: no train rows
    prepare("--src", src, "--format", "lines", "--dst", tmp_path / "out")
    spec = data.load(str(tmp_path / "out"))
    assert spec.metadata["rows"]["train"] == 0
    with pytest.raises(data.RetrievalDataError, match="'train'"):
        data.read_sequences(spec, "train", 5)


# ---- errors: exit status 2, one `error:` line ------------------------------------------
def run(*args):
    done = subprocess.run([sys.executable, "-m", "retrieval.prepare_dataset",
                           *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


ERRORS = {
    # name: (file text, layout, extra flags, what the line must name)
    "dense_outside_int64": ("1 2 3\n2 99999999999999999999 6\n", "lines", [],
                            ["line 2", "outside int64"]),
    "dense_non_integer": ("1 2 3\n2 4 x5 6\n", "lines", [], ["line 2", "'x5'", "positive"]),
    "lines_only_user": ("1 2 3\n\n7\n", "lines", [], ["line 3", "only '7'"]),
    "lines_user_twice": ("1 2 3\n2 3 4\n2 5 6\n", "lines", [], ["line 3", "'2'", "line 2"]),
    "pairs_three_fields": ("1 2\n1 3\n2 4 5\n", "pairs", [], ["line 3", "expected 2 fields",
                                                             "found 3"]),
    "pairs_not_consecutive": ("1 2\n1 3\n2 4\n1 5\n", "pairs", [],
                              ["line 4", "user '1'", "consecutive"]),
    "empty": ("\n\n", "pairs", [], ["no interactions"]),
    "csv_missing_column": ("user,item,rating\n1,2,3\n", "csv", [],
                           ["'timestamp'", "user, item, rating"]),
    "csv_bad_timestamp": ("user,item,timestamp\n1,2,3\n1,3,soon\n", "csv", [],
                          ["line 3", "'soon'"]),
    "raw_zero_item": ("1 5\n1 0\n", "pairs", ["--ids", "raw"], ["line 2", "padding"]),
    "csv_extra_field": ("user,item,timestamp\n1,2,3\n1,3,4,9\n", "csv", [],
                        ["line 3", "expected 3 fields", "found 4"]),
    "csv_missing_field": ("user,item,timestamp\n1,2,3\n1,3\n", "csv", [],
                          ["line 3", "expected 3 fields", "found 2"]),
    "csv_headerless_extra_field": ("1,2,5,3\n1,3,5,4\n\n1,4,5,6,7\n", "csv", [],
                                   ["line 4", "expected 4 fields", "found 5"]),
    "dense_sparse_ids": ("1 1 2 3\n2 4 5 6 7 8 9 10 11 12 13 14 1000000000\n", "lines", [],
                         ["1,000,000,000", "15 distinct", "--ids map"]),
    "dense_int64_max": ("1 1 2 3\n2 4 9223372036854775807\n", "lines", [],
                        ["9,223,372,036,854,775,807", "--ids map"]),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_are_one_line(tmp_path, case):
    text, layout, flags, names = ERRORS[case]
    src = write(tmp_path / ("in.csv" if layout == "csv" else "in.txt"), text)
    line = run("--src", src, "--format", layout, "--dst", tmp_path / "out", *flags)
    for part in [str(src)] + names:
        assert part in line, line
    assert not (tmp_path / "out").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".out")] == []


def test_missing_src_and_existing_dst(tmp_path):
    line = run("--src", tmp_path / "nope.txt", "--format", "lines", "--dst", tmp_path / "o")
    assert "nope.txt" in line and "no such file" in line
    src = write(tmp_path / "seq.txt", "1 1 2 3 4\n")
    prepare("--src", src, "--format", "lines", "--dst", tmp_path / "o")
    before = sorted(os.listdir(tmp_path / "o"))
    line = run("--src", src, "--format", "lines", "--dst", tmp_path / "o")
    assert "overwrite" in line and sorted(os.listdir(tmp_path / "o")) == before
    prepare("--src", src, "--format", "lines", "--dst", tmp_path / "o", "--overwrite",
            "--max_length", 2)
    assert data.load(str(tmp_path / "o")).metadata["max_length"] == 2
    assert "--format" in run("--src", src, "--dst", tmp_path / "p")  # argparse: one line too


def test_a_huge_dense_id_is_refused_before_its_table_is_allocated(tmp_path):
    """The catalogue 1..10^9 (8 GB as int64) is never allocated: the process peaks no higher
    than one preparing the same file with a small last id (the imports' size varies)."""
    def prepare(last_id):
        src = write(tmp_path / f"in{last_id}.txt", f"1 1 2 3\n2 4 5 {last_id}\n")
        script = ("import resource, sys\nfrom retrieval import prepare_dataset\n"
                  f"status = prepare_dataset.main(['--src', {str(src)!r}, '--format', 'lines', "
                  f"'--dst', {str(tmp_path / f'out{last_id}')!r}])\n"
                  "print(status, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        status, peak_kib = map(int, done.stdout.split()[-2:])
        return status, peak_kib, done.stderr

    status, peak_kib, stderr = prepare(10**9)
    assert status == 2 and "--ids map" in stderr, stderr
    small_status, small_peak_kib, stderr = prepare(6)
    assert small_status == 0, stderr
    assert peak_kib < small_peak_kib + (1 << 19), (peak_kib, small_peak_kib)  # + 512 MiB


def test_staging_left_by_a_killed_run_is_removed(tmp_path):
    src = write(tmp_path / "seq.txt", "1 1 2 3 4\n2 2 3 4 5\n")
    for name in (".o.tmp-dead1", ".p.tmp-dead2"):  # a killed overwrite, a killed first write
        os.makedirs(tmp_path / name / "train")
    prepare("--src", src, "--format", "lines", "--dst", tmp_path / "o")
    prepare("--src", src, "--format", "lines", "--dst", tmp_path / "o", "--overwrite")
    prepare("--src", src, "--format", "lines", "--dst", tmp_path / "p")
    assert sorted(os.listdir(tmp_path)) == ["o", "p", "seq.txt"]


# ---- the real data ------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.isfile(BEAUTY), reason="Beauty.txt not present")
def test_beauty(tmp_path):
    counts = {}
    items = set()
    with open(BEAUTY) as f:
        for line in f:
            fields = line.split()
            counts[fields[0]] = len(fields) - 1
            items.update(fields[1:])
    prepare("--src", BEAUTY, "--format", "lines", "--dst", tmp_path / "beauty")
    spec = data.load(str(tmp_path / "beauty"))
    m = spec.metadata
    assert (m["users"], m["items"], m["interactions"]) == (22363, 12101, 198502)
    assert (m["users"], m["distinct_items"], m["interactions"]) == \
        (len(counts), len(items), sum(counts.values()))
    n = list(counts.values())
    assert m["rows"] == {"train": sum(k >= 4 or k == 2 for k in n),
                         "validation": sum(k >= 3 for k in n), "test": sum(k >= 3 for k in n)}
    test = data.read_sequences(spec, "test", 50)
    assert test[ITEMS].shape == (m["rows"]["test"], 51)
    assert (test[ITEMS][:, -1] > 0).all()  # every row ends with its target


def test_parquet_source(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"timestamp": [5, 3, 9, 1, 2, 2], "user": [4, 4, 4, 8, 8, 8],
                      "item": [11, 12, 13, 14, 15, 16], "rating": [1.0] * 6})
    pq.write_table(table, tmp_path / "log.parquet")
    prepare("--src", tmp_path / "log.parquet", "--format", "csv", "--dst", tmp_path / "out")
    got, spec = prepared(tmp_path / "out")
    assert got["test"] == {4: [12, 11, 13], 8: [14, 15, 16]}
    assert data.read_sequences(spec, "test", 2)[TIMESTAMPS].tolist() == [[3, 5, 9], [1, 2, 2]]
    pq.write_table(table.drop(["item"]), tmp_path / "bad.parquet")
    line = run("--src", tmp_path / "bad.parquet", "--format", "csv", "--dst", tmp_path / "o")
    assert "bad.parquet" in line and "'item'" in line and "timestamp, user, rating" in line
