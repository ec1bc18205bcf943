"""How arrays become batches: tf.data pipelines over a BatchSource (split-binary files or
synthetic data), for training (optionally shuffled batch order), evaluation and inference.

Each element is (numerical float32 [b_local, n], categorical tuple of int [B_global],
label float32 [b_local], global_rows int32): the per-rank layout of datasets.py.
"""
from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from datasets import (LENGTH_SUFFIX, BatchSource, DatasetError, SplitBinaryReader,
                      SyntheticSource)
from feature_spec import FeatureSpec
from placement import PlacementPlan

# The last DatasetError raised by a read inside tf.numpy_function: TensorFlow re-raises it
# as a multi-line OpError, and reader_errors_surfaced() gives the CLIs the one-line original back.
_failed_read = []


def _recording_errors(read):
    def guarded(index):
        try:
            return read(index)
        except DatasetError as e:
            _failed_read[:] = [e]
            raise
    return guarded


@contextlib.contextmanager
def reader_errors_surfaced():
    """Re-raises the DatasetError behind a failed tf.data read (e.g. a multi-hot row longer
    than its dimension in a later batch) in place of TensorFlow's multi-line wrapper."""
    try:
        yield
    except tf.errors.OpError as e:
        if _failed_read and str(_failed_read[0]) in str(e):
            raise _failed_read[0] from None
        raise


def id_dtype(cardinality: int):
    return tf.int32 if cardinality <= 2**31 - 1 else tf.int64


class BatchPipeline:
    """A BatchSource as a tf.data pipeline. Files are read in their stored dtypes and widened
    by TensorFlow ops (cheaper than numpy's conversions)."""

    def __init__(self, source: BatchSource, cardinalities, prefetch: int = 2):
        self.source = source
        spec = source.spec
        self.tables = list(source.categorical_indices)
        self.id_dtypes = [id_dtype(cardinalities[t]) for t in self.tables]
        names = spec.categorical_features
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
            values = tf.numpy_function(_recording_errors(self._read), [index],
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


class DictPipeline:
    """A ColumnarReader (dict batches) as a tf.data pipeline. Integer features become int64,
    floating ones float32, the lengths of multi features int32; each element also carries
    GLOBAL_ROWS, the number of rows of the global batch (for losses averaged over it)."""

    GLOBAL_ROWS = "__global_rows"

    def __init__(self, reader, label_features=(), prefetch: int = 2,
                 num_parallel_calls: int = tf.data.AUTOTUNE):
        """label_features: integer or bool features delivered as float32 (labels)."""
        self.reader, self.prefetch = reader, prefetch
        self.num_parallel_calls = num_parallel_calls
        sample = reader.get(0) if len(reader) else None
        if sample is None:
            raise ValueError(f"mapping '{reader.mapping}' has no batch of "
                             f"{reader.batch_size} rows ({reader.num_rows} rows)")
        self.keys = list(sample)
        self.label_features = set(label_features)
        self.shapes = {k: [None] + list(v.shape[1:]) for k, v in sample.items()}
        self.read_types = [tf.as_dtype(sample[k].dtype) for k in self.keys]

    def __len__(self):
        return len(self.reader)

    def _target_dtype(self, key: str, dtype: tf.DType) -> tf.DType:
        if key in self.label_features or dtype.is_floating:
            return tf.float32
        return tf.int32 if key.endswith(LENGTH_SUFFIX) else tf.int64

    def _read(self, index):
        batch = self.reader.get(int(index))
        start, stop = self.reader.batch_rows(int(index))
        return [batch[k] for k in self.keys] + [np.int32(stop - start)]

    def dataset(self, order) -> tf.data.Dataset:
        def read(index):
            values = tf.numpy_function(_recording_errors(self._read), [index],
                                       self.read_types + [tf.int32], stateful=False)
            batch = {}
            for key, value, dtype in zip(self.keys, values, self.read_types):
                value = tf.cast(value, self._target_dtype(key, dtype))
                value.set_shape(self.shapes[key])
                batch[key] = value
            values[-1].set_shape([])
            batch[self.GLOBAL_ROWS] = values[-1]
            return batch

        ds = tf.data.Dataset.from_tensor_slices(np.asarray(order, dtype=np.int64))
        ds = ds.map(read, num_parallel_calls=self.num_parallel_calls, deterministic=True)
        return ds.prefetch(self.prefetch)

    def epoch(self, epoch: int = 0, start_batch: int = 0):
        return self.dataset(self.reader.batch_order(epoch)[start_batch:])


class MappedPipeline:
    """A pipeline whose batches pass through `fn` as they are read (a family's step batch
    from a DictPipeline element); tf.data would turn the lists in fn's result into tensors.
    cache=True keeps every step batch in memory once read: later epochs hand out the same
    tensors in the epoch's order, without tf.data's per-batch work (on a 2-core machine
    about a tenth of a small model's step)."""

    def __init__(self, pipe, fn, cache: bool = False):
        self.pipe, self.fn = pipe, fn
        self._cache = {} if cache else None

    def __len__(self):
        return len(self.pipe)

    def epoch(self, epoch: int = 0, start_batch: int = 0):
        if self._cache is None:
            return map(self.fn, self.pipe.epoch(epoch, start_batch))
        order = [int(i) for i in self.pipe.reader.batch_order(epoch)[start_batch:]]
        missing = [i for i in order if i not in self._cache]
        return self._in_order(order, missing)

    def _in_order(self, order, missing):
        """The cached batches, and the missing ones read (in the same order) as they come.
        The reader is dropped as soon as the last missing batch is in: tearing a tf.data
        iterator down sometimes stalls for about 2 s (TF 2.17, CPU), which then falls
        inside the reading epoch rather than between the steps of a cached one."""
        reader = iter(self.pipe.dataset(missing)) if missing else None
        for index in order:
            if index not in self._cache:
                self._cache[index] = self.fn(next(reader))
                if index == missing[-1]:
                    reader = None
            yield self._cache[index]
