"""How arrays become batches: tf.data pipelines over a BatchSource (split-binary files or
synthetic data), for training (optionally shuffled batch order), evaluation and inference.

Each element is (numerical float32 [b_local, n], categorical tuple of int [B_global],
label float32 [b_local], global_rows int32): the per-rank layout of datasets.py.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from datasets import BatchSource, SplitBinaryReader, SyntheticSource
from embedding import PlacementPlan
from feature_spec import FeatureSpec


def id_dtype(cardinality: int):
    return tf.int32 if cardinality <= 2**31 - 1 else tf.int64


def batch_order(num_batches: int, epoch: int, shuffle: bool, seed: int) -> np.ndarray:
    """Batch indices of one epoch: in order, or a permutation fixed by (seed, epoch)."""
    if not shuffle:
        return np.arange(num_batches)
    return np.random.default_rng([seed, epoch, 7]).permutation(num_batches)


class BatchPipeline:
    """A BatchSource as a tf.data pipeline of a chosen batch order."""

    def __init__(self, source: BatchSource, cardinalities, prefetch: int = 2):
        self.source = source
        self.tables = list(source.categorical_indices)
        self.id_dtypes = [id_dtype(cardinalities[t]) for t in self.tables]
        self.prefetch = prefetch

    def __len__(self):
        return len(self.source)

    def _read(self, index):
        numerical, categorical, label = self.source.get(int(index))
        start, stop = self.source.batch_rows(int(index))
        out = [numerical.astype(np.float32), label.astype(np.float32)]
        out += [c.astype(dt.as_numpy_dtype) for c, dt in zip(categorical, self.id_dtypes)]
        return out + [np.int32(stop - start)]

    def dataset(self, order) -> tf.data.Dataset:
        out_types = [tf.float32, tf.float32] + self.id_dtypes + [tf.int32]
        width = self.source.spec.numerical_features

        def read(index):
            values = tf.numpy_function(self._read, [index], out_types, stateful=False)
            numerical, label = values[0], values[1]
            numerical.set_shape([None, len(width)])
            label.set_shape([None])
            categorical = tuple(v for v in values[2:-1])
            for c in categorical:
                c.set_shape([None])
            global_rows = values[-1]
            global_rows.set_shape([])
            return numerical, categorical, label, global_rows

        ds = tf.data.Dataset.from_tensor_slices(np.asarray(order, dtype=np.int64))
        ds = ds.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.prefetch(self.prefetch)

    def epoch(self, epoch: int = 0, shuffle: bool = False, seed: int = 0, start_batch: int = 0):
        """Batches of one epoch, skipping the first `start_batch` of its order (resume)."""
        order = batch_order(len(self), epoch, shuffle, seed)[start_batch:]
        return self.dataset(order)


def make_source(spec: FeatureSpec, plan: PlacementPlan, rank: int, mapping: str,
                batch_size: int, training: bool, dataset_type: str = "tf_raw",
                synthetic_batches: int = 0, seed: int = 0, signal_strength: float = 0.0,
                power_law_alpha: float = 1.2) -> BatchSource:
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
                             world_size=plan.world_size, categorical_indices=tables)
