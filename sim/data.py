"""From a SIM dataset directory to model inputs: spec checks at the door, readers per rank,
and the batch dict -> model input mapping."""
from __future__ import annotations

import os

from feature_spec import FeatureSpec
from sim.contract import (NEGATIVE_CHANNEL, POSITIVE_CHANNEL, SIM_CONTRACT, TARGET_CHANNEL,
                          USER_CHANNEL)


class SimDataError(ValueError):
    pass


def load_spec(dataset_dir: str, feature_spec: str) -> FeatureSpec:
    path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset_dir,
                                                                          feature_spec)
    if not os.path.isfile(path):
        raise SimDataError(f"feature spec not found: {path} (--dataset_dir/--feature_spec)")
    return FeatureSpec.from_yaml(path).validate(SIM_CONTRACT)


def model_shape(spec: FeatureSpec) -> dict:
    """Cardinalities of the user tables and the shared item tables, and the history length."""
    positive = spec.channel(POSITIVE_CHANNEL)
    return {"user_cardinalities": tuple(spec.cardinality(f) for f in spec.channel(USER_CHANNEL)),
            "item_cardinalities": tuple(spec.cardinality(f)
                                        for f in spec.channel(TARGET_CHANNEL)),
            "history_length": spec.dimension(positive[0])}


def open_mapping(spec: FeatureSpec, mapping: str, batch_size: int, comm, drop_last=False):
    """This rank's reader of a mapping; an empty mapping is an error naming it."""
    from datasets import open_reader
    reader = open_reader(spec, mapping, batch_size, rank=comm.rank, world_size=comm.size,
                         drop_last=drop_last)
    if reader.num_rows == 0 or len(reader) == 0:
        raise SimDataError(f"the '{mapping}' data of {spec.base_directory} has "
                           f"{reader.num_rows} rows, fewer than one batch of {batch_size}")
    return reader


def model_inputs(spec: FeatureSpec, batch: dict) -> dict:
    """A DictPipeline element -> SimModel.lookup inputs. The negative history is aligned with
    the positive one (one negative per behaviour), so the positive length masks both."""
    from datasets import length_key
    positive = spec.channel(POSITIVE_CHANNEL)
    return {"user": [batch[f] for f in spec.channel(USER_CHANNEL)],
            "target": [batch[f] for f in spec.channel(TARGET_CHANNEL)],
            "positive": [batch[f] for f in positive],
            "negative": [batch[f] for f in spec.channel(NEGATIVE_CHANNEL)],
            "length": batch[length_key(positive[0])]}


def label(spec: FeatureSpec, batch: dict):
    return batch[spec.label_feature]
