"""From a retrieval dataset (retrieval.prepare_dataset) to model inputs: the catalogue, and
whole mappings as numpy in the left-padded layout (retrieval.contract).

A mapping's rows (read_sequences): `item_ids` int64 [b, length + 1] left-padded
with 0, most recent item last, the row's target its last column (train rows: every column's
next one is its target); rows longer than length + 1 keep their most recent items;
`timestamps` int64 of the same shape when the spec has them; `user_id` int64 [b].

Item attributes (item_attributes): the table prepare_dataset --item_attributes wrote (its
layout in retrieval/contract.py), checked against the spec."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from core.columnar import open_reader
from core.feature_spec import DynamicSpec, FeatureSpec
from core.sources import DatasetError, length_key, load_spec
from retrieval.contract import (ATTRIBUTES, ATTRIBUTES_FILE, ITEM_CHANNEL, RETRIEVAL_CONTRACT,
                                TIMESTAMP_CHANNEL, left_padded)


class RetrievalDataError(DatasetError):
    pass


def load(dataset_dir: str) -> FeatureSpec:
    """The dataset's FeatureSpec, validated against the retrieval contract."""
    return load_spec(dataset_dir, RETRIEVAL_CONTRACT)


@dataclass(frozen=True)
class Catalogue:
    """items: N, ids 1..N (0 is padding; a dynamic table's capacity when `dynamic`);
    dynamic: the item table's DynamicSpec (--ids raw) or None; timestamps: whether batches
    carry them; max_length: history items a stored row holds besides its target."""
    items: int
    dynamic: DynamicSpec = None
    timestamps: bool = False
    max_length: int = 0


def catalogue(spec: FeatureSpec) -> Catalogue:
    items = spec.channel(ITEM_CHANNEL)[0]
    return Catalogue(items=spec.cardinality(items), dynamic=spec.dynamic(items),
                     timestamps=bool(spec.channel(TIMESTAMP_CHANNEL)),
                     max_length=spec.dimension(items) - 1)


def _sequences(spec: FeatureSpec) -> list:
    return spec.channel(ITEM_CHANNEL) + spec.channel(TIMESTAMP_CHANNEL)


def _check_length(length: int) -> int:
    if not isinstance(length, (int, np.integer)) or isinstance(length, bool) or length < 1:
        raise RetrievalDataError(f"sequence length must be an integer >= 1, found {length!r}")
    return int(length)


def read_sequences(spec: FeatureSpec, mapping: str, length: int = None) -> dict:
    """Every row of a mapping (all ranks' rows) in the batch layout, as numpy; length:
    default the stored max_length. An empty mapping is an error naming it."""
    length = catalogue(spec).max_length if length is None else _check_length(length)
    reader = open_reader(spec, mapping, 1 << 16)
    if reader.num_rows == 0:
        raise RetrievalDataError(f"the '{mapping}' data of {spec.base_directory} has no rows")
    batches = [_left_padded(spec, reader.get(i), length) for i in range(len(reader))]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _left_padded(spec: FeatureSpec, batch: dict, length: int) -> dict:
    """A reader's batch with its sequences left-padded to length + 1 (the module doc) instead
    of left-aligned with their lengths; ids are range-checked by the core reader."""
    for name in _sequences(spec):
        batch[name] = left_padded(batch[name], batch.pop(length_key(name)), length + 1)
    return batch


@dataclass(frozen=True)
class ItemAttributes:
    """table: int64 [items + 1, M], row r item row r's attribute ids 1..count, 0-padded."""
    table: np.ndarray
    count: int


def item_attributes(spec: FeatureSpec):
    """The dataset's item attributes, or None when it has none."""
    meta = (spec.metadata or {}).get(ATTRIBUTES)
    if meta is None:
        return None
    path = os.path.join(spec.base_directory, meta.get("file", ATTRIBUTES_FILE))
    try:
        with np.load(path) as arrays:
            table = arrays["table"]
    except (OSError, KeyError, ValueError) as e:
        raise RetrievalDataError(f"{path}: cannot read the item attributes' table "
                                 f"({getattr(e, 'strerror', None) or e})") from None
    count, shape = int(meta["attributes"]), (catalogue(spec).items + 1, meta["max_per_item"])
    if table.shape != shape or table.min() < 0 or table.max() > count or table[0].any():
        raise RetrievalDataError(f"{path}: expected a table of shape {shape} holding "
                                 f"attribute ids 0..{count} (row 0 all 0), found shape "
                                 f"{table.shape}, ids {table.min()}..{table.max()}")
    return ItemAttributes(table.astype(np.int64), count)


def requested_item_attributes(spec: FeatureSpec, dataset_dir: str, asked=True):
    """The dataset's item attributes as --item_attributes asks: True, a ValueError when it
    has none or its item table is dynamic (raw ids get rows only while they train); False,
    None; None (not given), the dataset's when it has them and a static table."""
    if asked is False:
        return None
    found = item_attributes(spec)
    if asked is None:
        return found if catalogue(spec).dynamic is None else None
    if found is None:
        raise ValueError(f"--item_attributes: the dataset {dataset_dir} has no item "
                         f"attributes (retrieval.prepare_dataset --item_attributes FILE.json "
                         f"writes them)")
    if catalogue(spec).dynamic is not None:
        raise ValueError("--item_attributes needs a static item table: a dynamic one (raw "
                         "ids) gives items their rows only while it trains")
    return found
