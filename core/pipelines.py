"""tf.data pipelines over columnar batch sources (dict batches: Wide & Deep, SIM), and the
surfacing of a reader's one-line error from inside tf.data."""
from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from core.sources import LENGTH_SUFFIX, DatasetError

# The DatasetErrors raised by reads inside tf.numpy_function (parallel reads may fail more than
# one batch): TensorFlow re-raises one as a multi-line OpError, and reader_errors_surfaced()
# gives the CLIs that one's one-line original back.
_failed_reads = []


def recording_errors(read):
    def guarded(index):
        try:
            return read(index)
        except DatasetError as e:
            _failed_reads.append(e)
            raise
    return guarded


@contextlib.contextmanager
def reader_errors_surfaced():
    """Re-raises the DatasetError behind a failed tf.data read (e.g. a multi-hot row longer
    than its dimension in a later batch) in place of TensorFlow's multi-line wrapper."""
    try:
        yield
    except tf.errors.OpError as e:
        failed = next((f for f in _failed_reads if str(f) in str(e)), None)
        _failed_reads.clear()
        if failed is not None:
            raise failed from None
        raise


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
            values = tf.numpy_function(recording_errors(self._read), [index],
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
