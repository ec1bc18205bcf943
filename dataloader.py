"""DLRM's input pipeline as the design card names it: tf.data over a BatchSource (split-binary
files or synthetic data), for training (optionally shuffled batch order), evaluation and inference.

Each element is (numerical float32 [b_local, n], categorical tuple of int [B_global],
label float32 [b_local], global_rows int32): the per-rank layout of datasets.py.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from core.feature_spec import FeatureSpec
from core.parallel.placement import PlacementPlan
from core.pipelines import recording_errors
from core.sources import BatchSource
from datasets import SplitBinaryReader, SyntheticSource

def id_dtype(cardinality: int):
    return tf.int32 if cardinality <= 2**31 - 1 else tf.int64


class BatchPipeline:
    """A BatchSource as a tf.data pipeline. Files are read in their stored dtypes and widened
    by TensorFlow ops (cheaper than numpy's conversions)."""

    def __init__(self, source: BatchSource, cardinalities, prefetch: int = 2):
        self.source = source
        spec = source.spec
        self.tables = list(source.categorical_indices)
        names = spec.categorical_features
        # a dynamic table's ids are any int64, whatever its capacity
        self.id_dtypes = [tf.int64 if spec.dynamic(names[t]) else id_dtype(cardinalities[t])
                          for t in self.tables]
        numerical = spec.numerical_features
        self.num_numerical = len(numerical)
        self.read_types = ([tf.as_dtype(spec.dtype(numerical[0]) if numerical else np.float16),
                            tf.as_dtype(spec.dtype(spec.label_feature))]
                           + [tf.as_dtype(spec.dtype(names[t])) for t in self.tables])
        self.prefetch = prefetch

    def __len__(self):
        return len(self.source)

    def _read(self, index):
        numerical, categorical, label = self.source.get(int(index))
        start, stop = self.source.batch_rows(int(index))
        return [numerical, label, *categorical, np.int32(stop - start)]

    def dataset(self, order) -> tf.data.Dataset:
        def read(index):
            values = tf.numpy_function(recording_errors(self._read), [index],
                                       self.read_types + [tf.int32], stateful=False)
            numerical = tf.cast(values[0], tf.float32)
            numerical.set_shape([None, self.num_numerical])
            label = tf.cast(values[1], tf.float32)
            label.set_shape([None])
            categorical = []
            for v, dt in zip(values[2:-1], self.id_dtypes):
                v = tf.cast(v, dt)
                v.set_shape([None])
                categorical.append(v)
            global_rows = values[-1]
            global_rows.set_shape([])
            return numerical, tuple(categorical), label, global_rows

        ds = tf.data.Dataset.from_tensor_slices(np.asarray(order, dtype=np.int64))
        ds = ds.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.prefetch(self.prefetch)

    def epoch(self, epoch: int = 0, start_batch: int = 0):
        """Batches of one epoch in the source's order, skipping the first `start_batch`
        (resume)."""
        return self.dataset(self.source.batch_order(epoch)[start_batch:])


def make_source(spec: FeatureSpec, plan: PlacementPlan, rank: int, mapping: str,
                batch_size: int, training: bool, dataset_type: str = "tf_raw",
                synthetic_batches: int = 0, seed: int = 0, signal_strength: float = 0.0,
                power_law_alpha: float = 1.2, shuffle: bool = False) -> BatchSource:
    """The batch source a rank reads: its row slice, and the tables the plan gives it."""
    tables = plan.tables_read_by(rank)
    if dataset_type == "synthetic":
        # train and test draw disjoint batch streams from the same distribution
        stream_seed = [seed, 0 if training else 1]
        return SyntheticSource(spec, batch_size, synthetic_batches,
                               seed=int(np.random.default_rng(stream_seed).integers(2**31)),
                               power_law_alpha=power_law_alpha, signal_strength=signal_strength,
                               rank=rank, world_size=plan.world_size, categorical_indices=tables)
    return SplitBinaryReader(spec, mapping, batch_size, drop_last=training, rank=rank,
                             world_size=plan.world_size, categorical_indices=tables,
                             shuffle=shuffle and training, seed=seed)
