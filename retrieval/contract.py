"""The retrieval family's data: the channels SASRec and HSTU read from a FeatureSpec (parquet
written by retrieval.prepare_dataset), the spec builder and the left-padded layout the readers
give.

Conventions (SIM's, core.feature_spec ChannelContract.ids_from_one): item ids run
1..cardinality and 0 is padding. A row of a mapping is one user's sequence, oldest first, its
LAST item the row's target (for train, every prefix's next item is a target), at most
`max_length + 1` items (the spec's dimensions), stored variable-length; readers give it
left-padded with 0, most recent item last. Timestamps (csv sources only) are aligned with the
items. With `--ids raw` the item feature is dynamic (a table that maps any int64 id at training
time, core.dynamic); its cardinality is then the table's capacity.
"""
from __future__ import annotations

import numpy as np

from core.feature_spec import (PARQUET, ChannelContract, ChannelRule, DynamicSpec,
                               FeatureSpec, FeatureSpecError)

ITEM_CHANNEL = "item_sequence"
TIMESTAMP_CHANNEL = "timestamps"
USER_CHANNEL = "user"

ITEMS = "item_ids"
TIMESTAMPS = "timestamps"
USER = "user_id"

MAPPINGS = ("train", "validation", "test")

# item attributes (prepare_dataset --item_attributes): the spec's metadata entry, and its file
# in the dataset directory: `table` int64 [items + 1, max per item], row r the attribute ids
# 1..A of item row r, 0-padded (row 0 all 0); `raw_ids` int64 [A], the file's id of each
ATTRIBUTES = "item_attributes"
ATTRIBUTES_FILE = "item_attributes.npz"


def _check_aligned(spec: FeatureSpec) -> None:
    """Timestamps, when present, are one per item: the same dimensions as the item sequence."""
    items = spec.channel(ITEM_CHANNEL)[0]
    for name in spec.channel(TIMESTAMP_CHANNEL):
        if spec.dimension(name) != spec.dimension(items):
            raise FeatureSpecError(f"feature '{name}' of channel '{TIMESTAMP_CHANNEL}' has "
                                   f"dimensions [{spec.dimension(name)}] but '{items}' has "
                                   f"[{spec.dimension(items)}]; they must be aligned (one "
                                   f"timestamp per item)")


RETRIEVAL_CONTRACT = ChannelContract(
    model="SASRec/HSTU", chunk_types=(PARQUET,),
    channels={ITEM_CHANNEL: ChannelRule("categorical", 1, 1, shape="multi"),
              TIMESTAMP_CHANNEL: ChannelRule("id", 0, 1, shape="multi", dtypes=("int64",)),
              USER_CHANNEL: ChannelRule("id", 1, 1, dtypes=("int64",))},
    required_channels=(ITEM_CHANNEL, USER_CHANNEL),
    check_spec=_check_aligned, ids_from_one=True)


def retrieval_spec(items: int, max_length: int, timestamps: bool = False,
                   metadata: dict = None, dynamic: DynamicSpec = None) -> FeatureSpec:
    """The spec (without source_spec: the writer fills it in) of sequences of at most
    max_length + 1 items with ids 1..items (dynamic: the item table maps any int64 id at
    training time and `items` is its capacity)."""
    width = [int(max_length) + 1]
    features = {ITEMS: {"dtype": "int64", "cardinality": int(items), "dimensions": width}}
    channels = {ITEM_CHANNEL: [ITEMS]}
    if timestamps:
        features[TIMESTAMPS] = {"dtype": "int64", "dimensions": list(width)}
        channels[TIMESTAMP_CHANNEL] = [TIMESTAMPS]
    features[USER] = {"dtype": "int64"}
    channels[USER_CHANNEL] = [USER]
    spec = FeatureSpec(feature_spec=features, source_spec={}, channel_spec=channels,
                       metadata=dict(metadata or {}))
    return spec.with_dynamic([ITEMS], dynamic) if dynamic is not None else spec


def left_padded(values: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """Rows stored left-aligned (values [n, d], the first lengths[r] valid) -> [n, width]
    right-aligned: the last min(length, width) values of each row at its end, 0 before them
    (rows longer than width lose their oldest values)."""
    values = np.asarray(values)
    lengths = np.asarray(lengths, np.int64)
    # output position p of row r holds stored position lengths[r] - width + p
    source = lengths[:, None] - width + np.arange(width)[None, :]
    if not values.size:
        return np.zeros((lengths.size, width), values.dtype)
    taken = np.take_along_axis(values, np.clip(source, 0, values.shape[1] - 1), axis=1)
    return np.where(source >= 0, taken, 0).astype(values.dtype, copy=False)
