"""How bytes become arrays: split-binary readers and writers, and synthetic batches.

A batch is a tuple (numerical [n, num_numerical], categorical [list of [B] arrays], label [n]).
With world_size > 1 a rank holds n = its contiguous slice of the global batch B for the
numerical features and labels (data-parallel input), while each categorical array covers the
whole global batch, and only for the tables the rank was told to read (model-parallel input).
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile

import numpy as np

from feature_spec import (FeatureSpec, FeatureSpecError, LABEL_CHANNEL, NUMERICAL_CHANNEL,
                          CATEGORICAL_CHANNEL)


class DatasetError(ValueError):
    """Dataset files that do not match their FeatureSpec; the message names the file."""


def local_row_bounds(batch_rows: int, rank: int, world_size: int) -> tuple:
    """Contiguous slice [start, stop) of a batch of batch_rows rows that rank owns."""
    return batch_rows * rank // world_size, batch_rows * (rank + 1) // world_size


class BatchSource:
    """Common shape of a batch source: len(), get(i) -> (numerical, categorical list, label)."""

    def __init__(self, batch_size: int, num_rows: int, drop_last: bool, rank: int,
                 world_size: int):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, found {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of size {world_size}")
        self.batch_size, self.num_rows = batch_size, num_rows
        self.rank, self.world_size = rank, world_size
        full, rest = divmod(num_rows, batch_size)
        self.num_batches = full if (drop_last or rest == 0) else full + 1

    def __len__(self) -> int:
        return self.num_batches

    def batch_rows(self, index: int) -> tuple:
        """Global row range [start, stop) of batch `index`."""
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} out of range 0..{self.num_batches - 1}")
        start = index * self.batch_size
        return start, min(start + self.batch_size, self.num_rows)

    def local_rows(self, index: int) -> tuple:
        start, stop = self.batch_rows(index)
        lo, hi = local_row_bounds(stop - start, self.rank, self.world_size)
        return start + lo, start + hi

    def __iter__(self):
        for i in range(self.num_batches):
            yield self.get(i)


def _check_file_rows(path: str, row_bytes: int, what: str) -> int:
    if not os.path.isfile(path):
        raise DatasetError(f"{what}: file not found: {path}")
    size = os.path.getsize(path)
    if size % row_bytes:
        raise DatasetError(f"{what}: file {path} has {size} bytes, not a multiple of the "
                           f"{row_bytes}-byte row (truncated or wrong dtype?)")
    return size // row_bytes


def check_mapping_files(spec: FeatureSpec, mapping: str) -> int:
    """Size-check every file of a mapping against the spec and each other; return row count."""
    if mapping not in spec.source_spec:
        raise DatasetError(f"mapping '{mapping}' not in the feature spec "
                           f"(has {spec.mappings})")
    files = spec.feature_files(mapping)
    counts = {}
    numerical = spec.numerical_features
    if numerical:
        row_bytes = spec.dtype(numerical[0]).itemsize * len(numerical)
        counts[files["numerical"]] = _check_file_rows(files["numerical"], row_bytes,
                                                      f"{mapping} numerical features")
    label = spec.label_feature
    counts[files["label"]] = _check_file_rows(files["label"], spec.dtype(label).itemsize,
                                              f"{mapping} label '{label}'")
    for name, path in zip(spec.categorical_features, files["categorical"]):
        counts[path] = _check_file_rows(path, spec.dtype(name).itemsize,
                                        f"{mapping} categorical feature '{name}'")
    distinct = sorted(set(counts.values()))
    if len(distinct) > 1:
        majority = max(distinct, key=list(counts.values()).count)
        odd = [f"{os.path.relpath(p, spec.base_directory)} ({n} rows)"
               for p, n in counts.items() if n != majority]
        raise DatasetError(f"mapping '{mapping}': files disagree on the row count; most have "
                           f"{majority} rows, but {', '.join(odd)} (truncated file?)")
    return distinct[0]


class SplitBinaryReader(BatchSource):
    """Reads batches of one mapping of a split-binary dataset with positioned reads."""

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, drop_last: bool = False,
                 rank: int = 0, world_size: int = 1, categorical_indices=None):
        spec.validate()
        num_rows = check_mapping_files(spec, mapping)
        super().__init__(batch_size, num_rows, drop_last, rank, world_size)
        self.spec, self.mapping = spec, mapping
        files = spec.feature_files(mapping)
        names = spec.categorical_features
        self.categorical_indices = (list(range(len(names))) if categorical_indices is None
                                    else list(categorical_indices))
        numerical = spec.numerical_features
        self._num_width = len(numerical)
        self._num_dtype = spec.dtype(numerical[0]) if numerical else np.dtype("float16")
        self._label_dtype = spec.dtype(spec.label_feature)
        self._cat_dtypes = [spec.dtype(names[i]) for i in self.categorical_indices]
        self._fds = []
        self._num_fd = self._open(files["numerical"]) if numerical else None
        self._label_fd = self._open(files["label"])
        self._cat_fds = [self._open(files["categorical"][i]) for i in self.categorical_indices]

    def _open(self, path):
        fd = os.open(path, os.O_RDONLY)
        self._fds.append(fd)
        return fd

    @staticmethod
    def _pread(fd, dtype, first_row: int, rows: int, width: int = 1) -> np.ndarray:
        out = np.empty((rows, width) if width > 1 else rows, dtype=dtype)
        view = memoryview(out).cast("B")
        offset, got = first_row * dtype.itemsize * width, 0
        while got < len(view):
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                raise DatasetError(f"unexpected end of file (fd {fd}) at byte {offset + got}")
            got += n
        return out

    def get(self, index: int):
        start, stop = self.batch_rows(index)
        lo, hi = self.local_rows(index)
        if self._num_fd is None:
            numerical = np.zeros((hi - lo, 0), dtype=self._num_dtype)
        else:
            numerical = self._pread(self._num_fd, self._num_dtype, lo, hi - lo,
                                    self._num_width).reshape(hi - lo, self._num_width)
        label = self._pread(self._label_fd, self._label_dtype, lo, hi - lo)
        categorical = [self._pread(fd, dt, start, stop - start)
                       for fd, dt in zip(self._cat_fds, self._cat_dtypes)]
        return numerical, categorical, label

    def close(self):
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class SyntheticSource(BatchSource):
    """Fresh random batches: batch i is a pure function of (seed, i), so every epoch and every
    rank sees the same global data while no two steps share a batch.

    Categorical ids follow a power law within each cardinality: id = floor(card * u**alpha)
    for u ~ U(0,1), so alpha = 1 is uniform and larger alpha concentrates mass on low ids.
    Labels: with signal_strength s, P(click) = sigmoid(s * z - 1) with the planted score
        z = (x_0 + x_1) / sqrt(2) + (h(c_0) + h(c_1)) / sqrt(2),
    where x_j are numerical features (standard normal) and h(c) = +1/-1 by the parity of a
    multiplicative hash of the id. s = 0 makes labels independent of features.
    """

    def __init__(self, spec: FeatureSpec, batch_size: int, num_batches: int, seed: int = 0,
                 power_law_alpha: float = 1.2, signal_strength: float = 0.0, rank: int = 0,
                 world_size: int = 1, categorical_indices=None):
        super().__init__(batch_size, batch_size * num_batches, True, rank, world_size)
        if power_law_alpha < 1.0:
            raise ValueError(f"power_law_alpha must be >= 1 (1 = uniform), found "
                             f"{power_law_alpha}")
        self.spec, self.seed = spec, seed
        self.alpha, self.signal_strength = power_law_alpha, signal_strength
        self.cardinalities = spec.cardinalities
        names = spec.categorical_features
        self.categorical_indices = (list(range(len(names))) if categorical_indices is None
                                    else list(categorical_indices))
        numerical = spec.numerical_features
        self._num_width = len(numerical)
        self._num_dtype = spec.dtype(numerical[0]) if numerical else np.dtype("float16")
        self._label_dtype = spec.dtype(spec.label_feature)
        self._cat_dtypes = [spec.dtype(n) for n in names]

    def _categorical(self, rng, feature: int, rows: int) -> np.ndarray:
        card = self.cardinalities[feature]
        u = rng.random(rows)
        ids = np.minimum((card * u ** self.alpha).astype(np.int64), card - 1)
        return ids.astype(self._cat_dtypes[feature])

    @staticmethod
    def hash_sign(ids: np.ndarray) -> np.ndarray:
        hashed = (ids.astype(np.uint64) * np.uint64(2654435761)) >> np.uint64(7)
        return 1.0 - 2.0 * (hashed & np.uint64(1)).astype(np.float64)

    def full_batch(self, index: int):
        """The whole global batch (all rows, all tables)."""
        rows = self.batch_size
        rng = np.random.default_rng([self.seed, index])
        numerical = rng.standard_normal((rows, self._num_width)).astype(np.float32)
        categorical = [self._categorical(rng, f, rows) for f in range(len(self.cardinalities))]
        score = np.zeros(rows)
        if self._num_width:
            score += numerical[:, :2].sum(axis=1) / math.sqrt(2)
        if categorical:
            score += sum(self.hash_sign(c) for c in categorical[:2]) / math.sqrt(2)
        p = 1.0 / (1.0 + np.exp(-(self.signal_strength * score - 1.0)))
        label = (rng.random(rows) < p).astype(self._label_dtype)
        return numerical.astype(self._num_dtype), categorical, label

    def get(self, index: int):
        self.batch_rows(index)  # range check
        numerical, categorical, label = self.full_batch(index)
        lo, hi = local_row_bounds(self.batch_size, self.rank, self.world_size)
        return (numerical[lo:hi], [categorical[i] for i in self.categorical_indices],
                label[lo:hi])


class SplitBinaryWriter:
    """Writes a new split-binary dataset with its feature_spec.yaml.

    Everything goes to a temporary sibling directory that is renamed into place by close(),
    so a crash never leaves a half dataset, and an existing non-empty output is refused
    unless overwrite=True (then it is replaced only once the new one is complete).
    """

    def __init__(self, output_dir: str, spec: FeatureSpec, overwrite: bool = False):
        self.output_dir = os.path.abspath(output_dir)
        if os.path.exists(self.output_dir) and os.listdir(self.output_dir) and not overwrite:
            raise DatasetError(f"output {self.output_dir} exists and is not empty; refusing to "
                               f"write into it (pass overwrite to replace it)")
        parent = os.path.dirname(self.output_dir)
        os.makedirs(parent, exist_ok=True)
        self.tmp_dir = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(output_dir)}.tmp-")
        self.spec = spec.copy()
        self.spec.base_directory = self.tmp_dir
        self.rows = {}
        self._files = {}

    def _file(self, path):
        if path not in self._files:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._files[path] = open(path, "wb")
        return self._files[path]

    def write(self, mapping: str, numerical, categorical, label) -> None:
        """Append rows to a mapping. categorical: one [N] array per categorical feature."""
        spec = self.spec
        if mapping not in spec.source_spec:
            raise DatasetError(f"mapping '{mapping}' not in the writer's spec ({spec.mappings})")
        files = spec.feature_files(mapping)
        label = np.asarray(label)
        n = label.shape[0]
        names = spec.categorical_features
        if len(categorical) != len(names):
            raise DatasetError(f"expected {len(names)} categorical arrays, found "
                               f"{len(categorical)}")
        numerical_names = spec.numerical_features
        if numerical_names:
            numerical = np.asarray(numerical)
            if numerical.shape != (n, len(numerical_names)):
                raise DatasetError(f"numerical block has shape {numerical.shape}, expected "
                                   f"({n}, {len(numerical_names)})")
            numerical = numerical.astype(spec.dtype(numerical_names[0]), copy=False)
            self._file(files["numerical"]).write(np.ascontiguousarray(numerical).tobytes())
        self._file(files["label"]).write(label.astype(spec.dtype(spec.label_feature)).tobytes())
        for name, path, values in zip(names, files["categorical"], categorical):
            values = np.asarray(values)
            if values.shape != (n,):
                raise DatasetError(f"categorical feature '{name}' has shape {values.shape}, "
                                   f"expected ({n},)")
            card = spec.feature_spec[name].get("cardinality")
            if isinstance(card, int) and n and (values.min() < 0 or values.max() >= card):
                raise DatasetError(f"categorical feature '{name}': ids must lie in "
                                   f"[0, {card}), found [{values.min()}, {values.max()}]")
            self._file(path).write(values.astype(spec.dtype(name)).tobytes())
        self.rows[mapping] = self.rows.get(mapping, 0) + n

    def close(self) -> FeatureSpec:
        for f in self._files.values():
            f.close()
        self._files = {}
        self.spec.metadata = dict(self.spec.metadata, rows={m: self.rows.get(m, 0)
                                                            for m in self.spec.mappings})
        try:
            self.spec.validate()
            for mapping in self.spec.mappings:
                if self.rows.get(mapping, 0):
                    check_mapping_files(self.spec, mapping)
                else:  # an empty mapping still gets its (empty) files
                    for chunk in self.spec.source_spec[mapping]:
                        self._file(self.spec.chunk_path(chunk)).close()
            self._files = {}
            self.spec.to_yaml(os.path.join(self.tmp_dir, "feature_spec.yaml"))
        except BaseException:
            self.abort()
            raise
        if os.path.exists(self.output_dir):
            old = self.tmp_dir + "-old"
            os.rename(self.output_dir, old)
            os.rename(self.tmp_dir, self.output_dir)
            shutil.rmtree(old)
        else:
            os.rename(self.tmp_dir, self.output_dir)
        self.spec.base_directory = self.output_dir
        return self.spec

    def abort(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


def open_dataset(dataset_path: str, feature_spec: str = "feature_spec.yaml") -> FeatureSpec:
    """Load and validate the FeatureSpec of a dataset directory."""
    path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset_path,
                                                                         feature_spec)
    try:
        return FeatureSpec.from_yaml(path).validate()
    except FeatureSpecError as e:
        raise FeatureSpecError(f"{path}: {e}") from None
