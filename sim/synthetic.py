"""Synthetic SIM data with a planted signal.

  python -m sim.synthetic --dst DIR [--users N] [--items M] [--categories K]
      [--history_length L] [--signal {long,short,none}] [--seed S]
      [--prebatch_train_size P] [--prebatch_test_size P] [--format {tfrecord,parquet}]

--format parquet writes NVIDIA's BYO layout instead (metadata.json, train/ and test/ parquet
parts: label, user, target, positive and negative history columns), the input of the
reference's preprocessing/parquet_to_tfrecord.py (and of sim.preproc.parquet_to_tfrecord).

The signal: user u has a preferred category p_u. Item i has category i % K. A row is one
user with a history of `length` behaviours (between 3/4 of L and L) and a target item whose
category is p_u half of the time (else uniform). Its label is 1 with probability 0.9 when the
target's category is p_u and 0.1 otherwise, so a model must find p_u in the history:
  long:  inside the older part of the history (all but the most recent L - 90 behaviours,
         the part SIM's long branch reads at --long_seq_length 90) half of the behaviours
         are from p_u; the most recent ones are uniform.
  short: only the most recent L - 90 behaviours carry p_u (the older ones are uniform).
  none:  histories uniform, labels fair coins independent of everything.
A model limited to the recent behaviours (DIEN) can learn `short` but not `long`; DIN and
SIM read the older behaviours too. Ids follow NVIDIA's convention (1..cardinality, histories
left-padded with 0, see sim.schema).
Test users are disjoint from training users (the last fifth; --validation_users V takes the
V users before them for a validation mapping), so no user-id embedding can memorise p_u: the signal can only come from the history. Negative histories are uniform
random items (for DIEN's auxiliary loss).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from core import runtime
from core.cli import run_cli
from sim import contract

SIGNALS = ("long", "short", "none")
SIGNAL_SHARE, CLICK_MATCH, CLICK_OTHER = 0.5, 0.9, 0.1
LONG_SEQ_LENGTH = 90  # where the documented long/short split lies (sim.main's default)


def _items_of(categories, num_items, num_categories, rng):
    """A uniform item of each given category (items of category c are c, c+K, c+2K, ...)."""
    per_category = (num_items - categories + num_categories - 1) // num_categories
    return categories + num_categories * (rng.random(categories.shape) * per_category
                                          ).astype(np.int64)


def generate(users: int, items: int, categories: int, history_length: int, signal: str,
             seed: int, validation_users: int = 0) -> dict:
    """{'train': columns, 'test': columns} (see sim.contract.columns), and 'validation': the
    last `validation_users` users before the test users (taken from training's)."""
    if signal not in SIGNALS:
        raise ValueError(f"--signal must be one of {SIGNALS}, found '{signal}'")
    short = history_length - LONG_SEQ_LENGTH
    if short < 1 or items < categories or users < 5 or categories < 2:
        raise ValueError(f"need --history_length > {LONG_SEQ_LENGTH}, --items >= --categories "
                         f">= 2 and --users >= 5; found {history_length}, {items}, "
                         f"{categories}, {users}")
    rng = np.random.default_rng(seed)
    preferred = rng.integers(0, categories, users)
    lengths = rng.integers(history_length - history_length // 4, history_length + 1, users)
    position = np.arange(history_length)[None, :]
    recent = position >= (lengths - short)[:, None]
    region = {"long": ~recent, "short": recent, "none": np.zeros_like(recent)}[signal]
    planted = region & (rng.random(recent.shape) < SIGNAL_SHARE)
    hist_cat = np.where(planted, preferred[:, None],
                        rng.integers(0, categories, recent.shape))
    hist_item = _items_of(hist_cat, items, categories, rng)
    neg_item = rng.integers(0, items, recent.shape)
    match = rng.random(users) < 0.5
    target_cat = np.where(match, preferred, rng.integers(0, categories, users))
    target_item = _items_of(target_cat, items, categories, rng)
    click = np.where(target_cat == preferred, CLICK_MATCH, CLICK_OTHER)
    if signal == "none":
        click = np.full(users, 0.5)
    label = rng.random(users) < click
    # ids 1..cardinality (0 is padding): shift the 0-based draws by one
    cols = contract.columns(np.arange(users) + 1, target_item + 1, target_cat + 1,
                          (hist_item + 1, lengths), (hist_cat + 1, lengths),
                          (neg_item + 1, lengths), (neg_item % categories + 1, lengths), label,
                          history_length)
    test_start = users - users // 5
    validation_start = test_start - validation_users
    if not 0 <= validation_users < test_start:
        raise ValueError(f"--validation_users must be in 0..{test_start - 1} (the training "
                         f"users it is taken from), found {validation_users}")
    splits = {"train": slice(0, validation_start), "test": slice(test_start, users)}
    if validation_users:
        splits["validation"] = slice(validation_start, test_start)
    return {mapping: {name: _rows(col, rows) for name, col in cols.items()}
            for mapping, rows in splits.items()}


def _rows(column, rows):
    if isinstance(column, tuple):
        return tuple(part[rows] for part in column)
    return column[rows]


def write(dst: str, users=4000, items=1000, categories=20, history_length=100, signal="long",
          seed=0, overwrite=False, prebatch=None, validation_users=0):
    """prebatch: {mapping: rows per record} (NVIDIA's prebatched layout) or None."""
    from core.columnar import write_columns
    data = generate(users, items, categories, history_length, signal, seed, validation_users)
    spec = contract.sim_spec(users, items, categories, history_length,
                           {"generator": "sim.synthetic", "signal": signal, "seed": seed})
    return write_columns(dst, spec, data, "tfrecord", overwrite=overwrite, ids_from_one=True,
                         prebatch=prebatch)


def write_byo_parquet(dst: str, users=4000, items=1000, categories=20, history_length=100,
                      signal="long", seed=0, parts=4):
    """The same rows in NVIDIA's BYO parquet layout (histories as left-padded lists)."""
    import json
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq
    data = generate(users, items, categories, history_length, signal, seed)
    os.makedirs(dst, exist_ok=True)
    cards = [(contract.USER, users), (contract.ITEM, items), (contract.CATEGORY, categories)]
    with open(os.path.join(dst, "metadata.json"), "w") as f:
        json.dump({"cardinalities": [{"name": n, "value": v} for n, v in cards]}, f)
    order = (contract.LABEL, contract.USER, contract.ITEM, contract.CATEGORY) + contract.POSITIVE + \
        contract.NEGATIVE
    for mapping, cols in data.items():
        os.makedirs(os.path.join(dst, mapping), exist_ok=True)
        table = pa.table({n: list(cols[n][0]) if isinstance(cols[n], tuple) else cols[n]
                          for n in order})
        for k, start in enumerate(range(0, table.num_rows, -(-table.num_rows // parts))):
            pq.write_table(table.slice(start, -(-table.num_rows // parts)),
                           os.path.join(dst, mapping, f"part.{k}.parquet"))
    return sum(len(cols[contract.LABEL]) for cols in data.values())


def main(argv=None):
    runtime.configure()  # quiet TensorFlow, which the TFRecord writer imports
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dst", required=True, help="output directory (train/, test/, yaml)")
    p.add_argument("--users", type=int, default=4000)
    p.add_argument("--items", type=int, default=1000)
    p.add_argument("--categories", type=int, default=20)
    p.add_argument("--history_length", type=int, default=100)
    p.add_argument("--signal", choices=SIGNALS, default="long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--validation_users", type=int, default=0,
                   help="users (rows) of a validation mapping, taken from the training users "
                        "(0: none; training then selects on test)")
    p.add_argument("--prebatch_train_size", type=int, default=0,
                   help="rows per TFRecord record of train (0: one row per record)")
    p.add_argument("--prebatch_test_size", type=int, default=0, help="the same for test")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --dst")
    p.add_argument("--format", choices=("tfrecord", "parquet"), default="tfrecord",
                   help="parquet: NVIDIA's BYO layout (input of its parquet_to_tfrecord.py)")
    a = p.parse_args(argv)

    def work():
        if a.format == "parquet":
            rows = write_byo_parquet(a.dst, a.users, a.items, a.categories, a.history_length,
                                     a.signal, a.seed)
            return f"wrote {a.dst}: {rows} rows (BYO parquet), signal {a.signal}"
        spec = write(a.dst, a.users, a.items, a.categories, a.history_length, a.signal, a.seed,
                     a.overwrite, {"train": a.prebatch_train_size, "test": a.prebatch_test_size,
                                   **({"validation": a.prebatch_test_size}
                                      if a.validation_users else {})}, a.validation_users)
        return f"wrote {a.dst}: {spec.metadata.get('rows')} rows, signal {a.signal}"
    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
