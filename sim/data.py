"""From a SIM dataset to model inputs: readers per rank
in NVIDIA's SIM convention (sim.contract), and the batch dict -> model input mapping."""
from __future__ import annotations

from core.columnar import open_reader
from core.feature_spec import FeatureSpec
from core.sources import DatasetError, length_key
from sim.contract import (NEGATIVE_CHANNEL, POSITIVE_CHANNEL, TARGET_CHANNEL, USER_CHANNEL,
                          left_padded)


class SimDataError(DatasetError):
    pass


def model_shape(spec: FeatureSpec) -> dict:
    """Cardinalities of the user tables and the shared item tables, and the history length."""
    positive = spec.channel(POSITIVE_CHANNEL)
    return {"user_cardinalities": tuple(spec.cardinality(f) for f in spec.channel(USER_CHANNEL)),
            "item_cardinalities": tuple(spec.cardinality(f)
                                        for f in spec.channel(TARGET_CHANNEL)),
            "history_length": spec.dimension(positive[0]),
            "dynamic": tuple(spec.dynamic(f) for f in spec.channel(USER_CHANNEL)
                             + spec.channel(TARGET_CHANNEL))}


class SimBatches:
    """A ColumnarReader whose batches follow NVIDIA's SIM convention: every history [b, D]
    left-padded with 0, most recent last (rows stored shorter than D, left-aligned, are
    moved right). Ids are range-checked by the core reader (SIM contract: 0 padding,
    1..cardinality)."""

    def __init__(self, reader, spec: FeatureSpec):
        self._reader, self.spec = reader, spec
        self.histories = spec.channel(POSITIVE_CHANNEL) + spec.channel(NEGATIVE_CHANNEL)

    def __getattr__(self, name):  # the rest of the reader's interface
        return getattr(self._reader, name)

    def __len__(self):
        return len(self._reader)

    def get(self, index: int) -> dict:
        batch = self._reader.get(index)
        for name in self.histories:
            lengths = batch.pop(length_key(name))
            if (lengths < batch[name].shape[1]).any():
                batch[name] = left_padded((batch[name], lengths), batch[name].shape[1])
        return batch


def open_mapping(spec: FeatureSpec, mapping: str, batch_size: int, comm, drop_last=False,
                 prebatch=None) -> SimBatches:
    """This rank's reader of a mapping; an empty mapping is an error naming it. prebatch:
    rows per TFRecord record (--prebatch_*_size; 0/None: the spec's, else detected)."""
    reader = open_reader(spec, mapping, batch_size, rank=comm.rank, world_size=comm.size,
                         drop_last=drop_last, prebatch=prebatch or None)
    if reader.num_rows == 0 or len(reader) == 0:
        raise SimDataError(f"the '{mapping}' data of {spec.base_directory} has "
                           f"{reader.num_rows} rows, fewer than one batch of {batch_size}")
    return SimBatches(reader, spec)


def model_inputs(spec: FeatureSpec, batch: dict) -> dict:
    """A DictPipeline element -> SimModel.lookup inputs (masks come from the ids)."""
    return {"user": [batch[f] for f in spec.channel(USER_CHANNEL)],
            "target": [batch[f] for f in spec.channel(TARGET_CHANNEL)],
            "positive": [batch[f] for f in spec.channel(POSITIVE_CHANNEL)],
            "negative": [batch[f] for f in spec.channel(NEGATIVE_CHANNEL)]}


def label(spec: FeatureSpec, batch: dict):
    return batch[spec.label_feature]
