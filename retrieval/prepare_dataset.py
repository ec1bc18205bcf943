"""Interaction logs -> a retrieval dataset: one row per user and mapping, leave-one-out split.

  python -m retrieval.prepare_dataset --src FILE --format lines|pairs|csv --dst DIR
      [--ids dense|map|raw] [--max_length 200] [--capacity N] [--csv_columns NAMES]
      [--item_attributes FILE.json] [--overwrite]

Layouts (--format):
  lines  one line per user: `user item item ...` (whitespace separated, oldest first)
  pairs  one line per action: `user item`, a user's lines consecutive, oldest first
  csv    columns user, item, timestamp (others ignored), or parquet when FILE ends in
         .parquet. The first line is a header when it names a column user, item or timestamp;
         else the file has none and its columns are user,item,timestamp (3 fields) or
         user,item,rating,timestamp (4 fields, Amazon's ratings_*.csv), or --csv_columns.
         Every line has the header's (or the columns') number of fields. Actions are sorted
         by (user, timestamp) with a stable sort (equal timestamps keep the file's order);
         timestamps are kept (int64) for this layout only.
Blank lines are skipped.

Split (leave-one-out): a user with items s1..sn (oldest first) gives the train row s1..s(n-2)
(targets s2..s(n-2): every prefix's next item), the validation row s1..s(n-1) and the test
row s1..sn; each row's target is its last item, and a row keeps its most recent
max_length + 1 items. Short users (SASRec's rule): n = 2 trains on both items and gets no
validation or test row; n = 1 is dropped; n = 3 gets no train row (one item has no target)
but its validation and test rows. The counts go to the spec's metadata and are printed.

Ids (--ids): dense (default) ids as given, positive integers, catalogue 1..max id, 0 padding
(refused when the largest id is more than DENSE_SPARSITY x the distinct items, or the table
would not fit in memory: such ids want map);
map: any tokens mapped to 1..N in the order the file first names them (DIR/item_ids.tsv and
DIR/user_ids.tsv: `id<TAB>raw`); raw: integer ids kept as they are (any int64 but 0, the
padding), the item feature dynamic with a capacity of --capacity rows (default: twice the
distinct items). Users are integers (dense: positive) unless --ids map.

Item attributes (--item_attributes, S3-Rec's *_item2attributes.json: brand and categories):
a JSON object, item id (as the interactions write it) -> list of integer attribute ids. An
item's ids count once each (the file's order kept); an item without an entry has none; a key
naming no catalogue item (map: an item the interactions lack; dense: an id beyond the largest)
is ignored and counted. Attribute ids are renumbered 1..A in increasing order (0: padding),
over the catalogue's items. Written to DIR/item_attributes.npz: `table` int64
[catalogue + 1, M] (row r: item row r's attribute ids, 0-padded on the right; row 0 all 0; M
the most an item has) and `raw_ids` int64 [A] (the file's id of 1..A); the spec's
metadata.item_attributes holds file, source, attributes (A), max_per_item (M),
items_with_attributes, ignored_keys. Not with --ids raw (rows are given at training time).
"""
from __future__ import annotations

import csv
import json
import os
import re
import sys
from dataclasses import dataclass

import numpy as np
import psutil

from core.cli import ArgumentParser, run_cli
from core.columnar import ColumnarWriter
from core.feature_spec import DynamicSpec
from core.files import OutputLock, StagedDirectory
from retrieval import contract

FORMATS = ("lines", "pairs", "csv")
ID_MODES = ("dense", "map", "raw")
DEFAULT_MAX_LENGTH = 200
CAPACITY_FACTOR = 2  # --ids raw: default capacity = this x the distinct items seen
DENSE_SPARSITY = 4  # --ids dense: the largest id may be at most this x the distinct items
# bytes per catalogue row a training process holds at the default width (64 float32, and
# Adam's two slots): a dense catalogue beyond the machine's memory is refused here
ROW_BYTES = 64 * 4 * 3
CSV_COLUMNS = ("user", "item", "timestamp")
HEADERLESS = {3: ("user", "item", "timestamp"), 4: ("user", "item", "rating", "timestamp")}
ITEM_IDS_FILE, USER_IDS_FILE = "item_ids.tsv", "user_ids.tsv"
_INTEGER = re.compile(r"-?[0-9]+")
_INTEGERS = re.compile(r"(?:-?[0-9]+\n)*-?[0-9]+")
_INT64 = (-(1 << 63), (1 << 63) - 1)


class PrepareError(ValueError):
    """Input that cannot be prepared; one line naming the file (and line)."""


@dataclass
class Actions:
    """Every action of the source in file order: tokens as written, where each came from."""
    users: list
    items: list
    places: np.ndarray      # line (or parquet row) number of each action
    place: str              # 'line' or 'row'
    timestamps: np.ndarray = None
    line_starts: np.ndarray = None  # lines layout: the first action of each line


# ---- reading the layouts ----------------------------------------------------------------
def _text_lines(src: str) -> list:
    try:
        with open(src, encoding="utf-8") as f:
            return f.read().splitlines()
    except UnicodeDecodeError as e:
        raise PrepareError(f"{src}: not UTF-8 text (byte {e.start})") from None


def read_lines(src: str) -> Actions:
    items, sizes, line_users, line_places = [], [], [], []
    for number, line in enumerate(_text_lines(src), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2:
            raise PrepareError(f"{src} line {number}: expected a user and at least one item "
                               f"(`user item item ...`), found only '{fields[0]}'")
        line_users.append(fields[0])
        line_places.append(number)
        items.extend(fields[1:])
        sizes.append(len(fields) - 1)
    counts = np.array(sizes, np.int64)
    line_places = np.array(line_places, np.int64)
    users = list(np.repeat(np.array(line_users, dtype=object), counts)) if line_users else []
    return Actions(users, items, np.repeat(line_places, counts), "line",
                   line_starts=np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64))


def read_pairs(src: str) -> Actions:
    fields = [line.split() for line in _text_lines(src)]
    sizes = np.fromiter(map(len, fields), np.int64, len(fields))
    bad = np.flatnonzero((sizes != 0) & (sizes != 2))
    if bad.size:
        row = int(bad[0])
        raise PrepareError(f"{src} line {row + 1}: expected 2 fields (`user item`), found "
                           f"{sizes[row]}: '{' '.join(fields[row])}'")
    kept = np.flatnonzero(sizes == 2)
    return Actions([fields[r][0] for r in kept], [fields[r][1] for r in kept], kept + 1, "line")


def _csv_header(src: str, names):
    """(column names, whether the first line is a header)."""
    try:
        with open(src, newline="", encoding="utf-8-sig") as f:
            first = next(csv.reader(f), None)
    except (UnicodeDecodeError, csv.Error) as e:
        raise PrepareError(f"{src}: not a UTF-8 CSV file ({e})") from None
    if first is None:
        return list(names or CSV_COLUMNS), False
    if names:
        return list(names), False
    stripped = [c.strip() for c in first]
    if set(stripped) & set(CSV_COLUMNS):
        return stripped, True
    if len(first) in HEADERLESS:
        return list(HEADERLESS[len(first)]), False
    raise PrepareError(f"{src}: the first line names no column {'/'.join(CSV_COLUMNS)} and has "
                       f"{len(first)} fields; a file without a header has 3 "
                       f"(user,item,timestamp) or 4 (user,item,rating,timestamp): pass "
                       f"--csv_columns")


def _check_field_counts(src: str, columns: list, header: bool) -> None:
    """Every non-blank line has len(columns) fields: a row with more or fewer is named, never
    cut or padded."""
    with open(src, newline="", encoding="utf-8-sig") as f:
        for number, row in enumerate(csv.reader(f), 1):
            if row and len(row) != len(columns):
                source = "the header's" if header else "the columns'"
                raise PrepareError(f"{src} line {number}: expected {len(columns)} fields "
                                   f"({source}: {','.join(columns)}), found {len(row)}")


def read_table(src: str, names=None) -> Actions:
    import pandas as pd
    if src.endswith(".parquet"):
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(src)
        except Exception as e:  # pyarrow raises several types for a damaged file
            raise PrepareError(f"{src}: not a readable parquet file "
                               f"({' '.join(str(e).split())})") from None
        found = list(table.column_names)
        missing = [c for c in CSV_COLUMNS if c not in found]
        if missing:
            raise PrepareError(f"{src}: no column '{missing[0]}' (columns found: "
                               f"{', '.join(found)})")
        frame = table.select(list(CSV_COLUMNS)).to_pandas()
        for column in CSV_COLUMNS:
            if frame[column].isna().any():
                row = int(np.flatnonzero(frame[column].isna().to_numpy())[0])
                raise PrepareError(f"{src} row {row}: column '{column}' is missing a value")
        frame = frame.astype(str)
        first_place, place = 0, "row"
    else:
        columns, header = _csv_header(src, names)
        missing = [c for c in CSV_COLUMNS if c not in columns]
        if missing:
            raise PrepareError(f"{src}: no column '{missing[0]}' (columns found: "
                               f"{', '.join(columns)})")
        _check_field_counts(src, columns, header)
        try:
            frame = pd.read_csv(src, header=0 if header else None, names=columns,
                                usecols=list(CSV_COLUMNS), dtype=str, keep_default_na=False,
                                skip_blank_lines=True, encoding="utf-8-sig")
        except (pd.errors.ParserError, UnicodeDecodeError) as e:
            raise PrepareError(f"{src}: not a CSV file with the columns {', '.join(columns)} "
                               f"({' '.join(str(e).split())})") from None
        first_place, place = (2 if header else 1), "line"
    places = np.arange(len(frame), dtype=np.int64) + first_place
    users, items, stamps = ([t.strip() for t in frame[c].tolist()] for c in CSV_COLUMNS)
    stamps = _integers(stamps, places, place, src, "timestamp", "an integer")
    return Actions(users, items, places, place, timestamps=stamps)


# ---- ids ----------------------------------------------------------------------------------
def _integers(tokens: list, places, place: str, src: str, what: str, expected: str):
    """Tokens (stripped) -> int64: ASCII digits with an optional '-'; the first bad one is
    named. One regular-expression pass over all of them, then Python's int per token."""
    if not tokens:
        return np.zeros(0, np.int64)
    if _INTEGERS.fullmatch("\n".join(tokens)) is None:
        k = next(k for k, t in enumerate(tokens) if _INTEGER.fullmatch(t) is None)
        found = f"'{tokens[k]}'" if tokens[k] else "nothing (a missing field)"
        raise PrepareError(f"{src} {place} {places[k]}: expected {expected} for the {what}, "
                           f"found {found}")
    try:
        return np.array(list(map(int, tokens)), dtype=np.int64)
    except OverflowError:
        k = next(k for k, t in enumerate(tokens) if not _INT64[0] <= int(t) <= _INT64[1])
        raise PrepareError(f"{src} {place} {places[k]}: expected {expected} for the {what}, "
                           f"found '{tokens[k]}' (outside int64)") from None


def _ids(tokens: list, places, place: str, src: str, what: str, mode: str):
    """(int64 ids, dictionary of raw tokens for --ids map or None)."""
    if mode == "map":
        import pandas as pd
        codes, uniques = pd.factorize(np.array(tokens, dtype=object))
        return codes.astype(np.int64) + 1, [str(u) for u in uniques]
    expected = "a positive integer id (--ids dense)" if mode == "dense" else \
        "an integer id (--ids raw)"
    ids = _integers(tokens, places, place, src, what, expected)
    bad = np.flatnonzero(ids <= 0) if mode == "dense" else \
        (np.flatnonzero(ids == 0) if what == "item" else np.zeros(0, np.int64))
    if bad.size:
        k = int(bad[0])
        extra = " (0 is the padding id)" if mode == "raw" else ""
        raise PrepareError(f"{src} {place} {places[k]}: expected {expected} for the {what}, "
                           f"found '{tokens[k]}'{extra}")
    return ids, None


# ---- item attributes ------------------------------------------------------------------------
class _Pairs(list):
    """A JSON object as its (key, value) pairs in file order (a repeated key stays visible)."""


def _json_object(path: str) -> list:
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f, object_pairs_hook=_Pairs)
    except OSError as e:
        raise PrepareError(f"--item_attributes {path}: cannot read it ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise PrepareError(f"{path}: not JSON (line {e.lineno} column {e.colno}: {e.msg})") \
            from None
    if not isinstance(found, _Pairs):
        raise PrepareError(f"{path}: expected a JSON object (item id -> list of attribute "
                           f"ids), found {type(found).__name__ if found is not None else 'null'}")
    return found


def _shown(value) -> str:
    text = json.dumps(dict(value) if isinstance(value, _Pairs) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def _attribute_list(path: str, key: str, value) -> list:
    """An entry's attribute ids, each once, in the file's order."""
    fine = type(value) is list and all(  # not _Pairs: an object is not a list
        type(a) is int and _INT64[0] <= a <= _INT64[1] for a in value)
    if not fine:
        raise PrepareError(f"{path}: item '{key}': expected a list of integer attribute ids, "
                           f"found {_shown(value)}")
    return list(dict.fromkeys(value))


def _attribute_row(path: str, key: str, ids: str, catalogue: int, rows_of: dict):
    """The catalogue row an entry's key names, or None for an item the interactions lack."""
    if ids == "map":
        return rows_of.get(key)
    if _INTEGER.fullmatch(key) is None or int(key) <= 0:
        raise PrepareError(f"{path}: key '{key}': expected a positive integer item id "
                           f"(--ids dense), found '{key}'")
    return int(key) if int(key) <= catalogue else None


def read_attributes(path: str, ids: str, catalogue: int, item_names=None) -> tuple:
    """(table int64 [catalogue + 1, M]: row r the dense attribute ids 1..A of catalogue row r,
    0-padded on the right, row 0 all 0; the raw attribute id of each of 1..A; the keys
    ignored: items the interactions lack)."""
    rows_of = {name: row for row, name in enumerate(item_names or (), 1)}
    listed, named, ignored = {}, {}, 0
    for key, value in _json_object(path):
        attributes = _attribute_list(path, key, value)
        row = _attribute_row(path, key, ids, catalogue, rows_of)
        if row is None:
            ignored += 1
        elif row in listed:
            raise PrepareError(f"{path}: key '{key}' names item {row} again (first as key "
                               f"'{named[row]}'); expected one entry per item")
        else:
            listed[row], named[row] = attributes, key
    raw = sorted({a for attributes in listed.values() for a in attributes})
    if not raw:
        raise PrepareError(f"{path}: no attribute for any item of the interactions ("
                           f"{len(named)} of its keys name one, {ignored} name none); is "
                           f"--ids right?")
    dense = {a: i for i, a in enumerate(raw, 1)}
    table = np.zeros((catalogue + 1, max(map(len, listed.values()))), np.int64)
    for row, attributes in listed.items():
        table[row, :len(attributes)] = [dense[a] for a in attributes]
    return table, np.array(raw, np.int64), ignored


# ---- grouping and the split -----------------------------------------------------------------
def _first_repeat(keys: np.ndarray):
    """(index of the first key seen before, index of its first occurrence) or None."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    again = np.flatnonzero(first[inverse] != np.arange(keys.size))
    if not again.size:
        return None
    k = int(again[0])
    return k, int(first[inverse[k]])


def group(actions: Actions, users: np.ndarray, layout: str, src: str):
    """Order of the actions (user by user, oldest first) and each user's (start, count)."""
    order = np.arange(users.size)
    if layout == "csv":
        order = np.lexsort((actions.timestamps, users))  # stable: ties keep the file's order
    grouped = users[order]
    if layout == "lines":  # a line is a user's row, even when the next line repeats it
        starts = actions.line_starts
    else:
        starts = np.flatnonzero(np.concatenate([[True], grouped[1:] != grouped[:-1]]))
    if layout != "csv":
        repeat = _first_repeat(grouped[starts])
        if repeat is not None:
            again, first = (int(starts[r]) for r in repeat)
            token = actions.users[again]
            if layout == "lines":
                raise PrepareError(f"{src} line {actions.places[again]}: user '{token}' "
                                   f"already has a line (line {actions.places[first]}); "
                                   f"expected one line per user")
            raise PrepareError(f"{src} line {actions.places[again]}: user '{token}' appears "
                               f"again after other users' lines (first at line "
                               f"{actions.places[first]}); a user's lines must be consecutive")
    counts = np.diff(np.concatenate([starts, [grouped.size]]))
    return order, starts.astype(np.int64), counts.astype(np.int64)


def split_rows(counts: np.ndarray) -> dict:
    """{mapping: (user index, end)}: the rows of each mapping as the first `end` items of
    user `index` (the rule in the module doc)."""
    users = np.arange(counts.size)
    train = (counts >= 4) | (counts == 2)
    held = counts >= 3
    return {"train": (users[train], np.where(counts[train] == 2, 2, counts[train] - 2)),
            "validation": (users[held], counts[held] - 1),
            "test": (users[held], counts[held])}


def short_user_counts(counts: np.ndarray) -> dict:
    return {"dropped_one_item": int((counts == 1).sum()),
            "train_only_two_items": int((counts == 2).sum()),
            "no_train_row_three_items": int((counts == 3).sum())}


def _gather(values: np.ndarray, first: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """values[first[r]:first[r] + lengths[r]] of every row r, concatenated."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    index = np.arange(offsets[-1]) + np.repeat(first - offsets[:-1], lengths)
    return values[index]


# ---- the command ----------------------------------------------------------------------------
class _Writer(ColumnarWriter):
    """The parquet writer, plus text files (the id dictionaries) and numpy arrays (the item
    attributes) in the same staged output."""

    def add_text(self, name: str, text: str) -> None:
        with open(os.path.join(self._output.tmp_dir, name), "w", encoding="utf-8") as f:
            f.write(text)

    def add_arrays(self, name: str, **arrays) -> None:
        np.savez(os.path.join(self._output.tmp_dir, name), **arrays)


def _dictionary(tokens: list) -> str:
    return "".join(f"{i}\t{t}\n" for i, t in enumerate(tokens, 1))


def _check_dense_catalogue(src: str, catalogue: int, distinct: int) -> None:
    """Dense ids make the largest id the catalogue: refuse one that is mostly empty rows or
    beyond this machine's memory, before anything is allocated for it."""
    memory = psutil.virtual_memory().total
    if catalogue > DENSE_SPARSITY * distinct or catalogue * ROW_BYTES > memory:
        raise PrepareError(
            f"{src}: with --ids dense the largest item id ({catalogue:,}) sets a catalogue of "
            f"{catalogue:,} rows for {distinct:,} distinct items (more than "
            f"{DENSE_SPARSITY}x, or over this machine's {memory / 2**30:.0f} GiB at "
            f"{ROW_BYTES} bytes a row); pass --ids map (ids renumbered 1..{distinct:,}) or "
            f"--ids raw (a dynamic table)")


def prepare(src: str, layout: str, dst: str, ids: str = "dense",
            max_length: int = DEFAULT_MAX_LENGTH, capacity: int = None, overwrite=False,
            csv_columns=None, item_attributes: str = None):
    """Write the dataset; returns its FeatureSpec (metadata: counts, see the module doc)."""
    if layout not in FORMATS:
        raise PrepareError(f"--format must be one of {list(FORMATS)}, found '{layout}'")
    if ids not in ID_MODES:
        raise PrepareError(f"--ids must be one of {list(ID_MODES)}, found '{ids}'")
    if max_length < 1:
        raise PrepareError(f"--max_length must be at least 1, found {max_length}")
    if capacity is not None and (ids != "raw" or capacity < 1):
        raise PrepareError(f"--capacity is the dynamic table's rows of --ids raw (>= 1); "
                           f"found {capacity} with --ids {ids}")
    if item_attributes is not None and ids == "raw":
        raise PrepareError("--item_attributes needs --ids dense or map: with --ids raw the "
                           "item table gives ids their rows only at training time")
    if not os.path.isfile(src):
        raise PrepareError(f"--src {src}: no such file")
    actions = {"lines": read_lines, "pairs": read_pairs}[layout](src) if layout != "csv" \
        else read_table(src, csv_columns)
    if not actions.items:
        raise PrepareError(f"{src}: no interactions (empty catalogue): nothing to prepare")
    user_ids, user_names = _ids(actions.users, actions.places, actions.place, src, "user", ids)
    item_ids, item_names = _ids(actions.items, actions.places, actions.place, src, "item", ids)
    order, starts, counts = group(actions, user_ids, layout, src)
    items, stamps = item_ids[order], None if actions.timestamps is None \
        else actions.timestamps[order]
    user_of = user_ids[order][starts]

    distinct = int(np.unique(item_ids).size)
    if ids == "dense":
        catalogue = int(item_ids.max())
        _check_dense_catalogue(src, catalogue, distinct)
    elif ids == "map":
        catalogue = len(item_names)
    else:
        catalogue = int(capacity or CAPACITY_FACTOR * distinct)
    metadata = {"source": os.path.abspath(src), "format": layout, "ids": ids,
                "users": int(counts.size), "items": catalogue, "distinct_items": distinct,
                "interactions": int(item_ids.size)}
    if ids == "raw":
        metadata["capacity"] = catalogue
    arrays, texts = {}, {}
    if item_attributes is not None:
        table, raw, ignored = read_attributes(item_attributes, ids, catalogue, item_names)
        metadata[contract.ATTRIBUTES] = {
            "file": contract.ATTRIBUTES_FILE, "source": os.path.abspath(item_attributes),
            "attributes": int(raw.size), "max_per_item": int(table.shape[1]),
            "items_with_attributes": int((table[:, 0] > 0).sum()), "ignored_keys": ignored}
        arrays[contract.ATTRIBUTES_FILE] = {"table": table, "raw_ids": raw}
    if ids == "map":
        texts = {ITEM_IDS_FILE: _dictionary(item_names), USER_IDS_FILE: _dictionary(user_names)}
    return write_sequences(dst, Sequences(items, starts, counts, user_of, stamps), catalogue,
                           max_length, metadata, ids == "raw", overwrite, arrays, texts)


@dataclass(frozen=True)
class Sequences:
    """Every user's actions, user by user, oldest first: user u's items are
    items[starts[u]:starts[u] + counts[u]] (timestamps alike, or None), its id user_of[u]."""
    items: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    user_of: np.ndarray
    timestamps: np.ndarray = None


def write_sequences(dst: str, sequences: Sequences, catalogue: int, max_length: int,
                    metadata: dict, dynamic: bool = False, overwrite: bool = False,
                    arrays: dict = None, texts: dict = None):
    """The dataset of these users' sequences (leave-one-out, the module doc) in dst, with
    metadata (the split's counts added), numpy files {name: {key: array}} and text files
    {name: text} beside it; returns its FeatureSpec."""
    s, width = sequences, max_length + 1
    columns, truncated = {}, {}
    for mapping, (user, end) in split_rows(s.counts).items():
        lengths = np.minimum(end, width)
        first = s.starts[user] + end - lengths
        truncated[mapping] = int((end > width).sum())
        columns[mapping] = {contract.ITEMS: (_gather(s.items, first, lengths), lengths),
                            contract.USER: s.user_of[user]}
        if s.timestamps is not None:
            columns[mapping][contract.TIMESTAMPS] = (_gather(s.timestamps, first, lengths),
                                                     lengths)
    metadata = dict(metadata, max_length=int(max_length), timestamps=s.timestamps is not None,
                    short_users=short_user_counts(s.counts), truncated_rows=truncated)
    spec = contract.retrieval_spec(catalogue, max_length, s.timestamps is not None, metadata,
                                   DynamicSpec() if dynamic else None)
    lock = OutputLock(dst)  # one writer at a time; it finishes what killed ones left
    lock.acquire()
    try:
        StagedDirectory.tidy(dst)
        writer = _Writer(dst, spec, "parquet", overwrite=overwrite, ids_from_one=True,
                         mappings=list(contract.MAPPINGS))
        with writer:
            for mapping in contract.MAPPINGS:
                writer.write(mapping, columns[mapping])
            for name, contents in (arrays or {}).items():
                writer.add_arrays(name, **contents)
            for name, text in (texts or {}).items():
                writer.add_text(name, text)
    finally:
        lock.release()
    return writer.spec


def summary(spec) -> str:
    m = spec.metadata
    rows, short = m["rows"], m["short_users"]
    return (f"wrote {spec.base_directory}: {m['users']} users, {m['items']} items"
            f"{' (capacity)' if m['ids'] == 'raw' else ''}, {m['interactions']} interactions; "
            f"rows train {rows['train']}, validation {rows['validation']}, test {rows['test']}; "
            f"short users: {short['dropped_one_item']} with 1 item dropped, "
            f"{short['train_only_two_items']} with 2 items train only, "
            f"{short['no_train_row_three_items']} with 3 items without a train row; "
            f"rows truncated to {m['max_length'] + 1} items: "
            + ", ".join(f"{k} {v}" for k, v in m["truncated_rows"].items())
            + _attributes_summary(m.get(contract.ATTRIBUTES)))


def _attributes_summary(a) -> str:
    if a is None:
        return ""
    return (f"; item attributes: {a['attributes']} distinct, {a['items_with_attributes']} "
            f"items with some (at most {a['max_per_item']}), {a['ignored_keys']} keys ignored "
            f"(items not in the interactions)")


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", required=True, help="the interaction file")
    p.add_argument("--format", required=True, choices=FORMATS, help="its layout")
    p.add_argument("--dst", required=True, help="output dataset directory")
    p.add_argument("--ids", choices=ID_MODES, default="dense")
    p.add_argument("--max_length", type=int, default=DEFAULT_MAX_LENGTH,
                   help="items of history kept per row (a row holds max_length + 1)")
    p.add_argument("--capacity", type=int, default=None,
                   help=f"--ids raw: rows of the dynamic item table (default "
                        f"{CAPACITY_FACTOR} x the distinct items)")
    p.add_argument("--csv_columns", default=None,
                   help="a header-less csv's column names, comma separated")
    p.add_argument("--item_attributes", default=None,
                   help="a JSON object: item id -> list of attribute ids (S3-Rec's "
                        "*_item2attributes.json)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --dst")
    a = p.parse_args(argv)
    names = [c.strip() for c in a.csv_columns.split(",")] if a.csv_columns else None
    return run_cli(lambda: summary(prepare(a.src, a.format, a.dst, a.ids, a.max_length,
                                           a.capacity, a.overwrite, names,
                                           a.item_attributes)))


if __name__ == "__main__":
    sys.exit(main())
