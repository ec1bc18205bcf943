"""DLRM's data as the design card names it: the split-binary format (one file per feature
group, NVIDIA's layout), its reader and writer, and synthetic batches of that shape; the
batch source interface, id checks and staged writes are the core's (core/sources.py,
core/files.py).

A batch is a tuple (numerical [n, num_numerical], categorical [list of [B] arrays], label [n]).
With world_size > 1 a rank holds n = its contiguous slice of the global batch B for the
numerical features and labels (data-parallel input), while each categorical array covers the
whole global batch, and only for the tables the rank was told to read (model-parallel input).
"""
from __future__ import annotations

import math
import os

import numpy as np

from core.feature_spec import FeatureSpec
from core.files import StagedDirectory, StagedWriter
from core.sources import (BatchSource, DatasetError, expected_rows, first_bad_id,
                          first_non_finite, id_range_error, local_row_bounds,
                          non_finite_error)
from dlrm_contract import DLRM_CONTRACT


def _check_file_rows(path: str, row_bytes: int, what: str) -> int:
    if not os.path.isfile(path):
        raise DatasetError(f"{what}: file not found: {path}")
    size = os.path.getsize(path)
    if size % row_bytes:
        raise DatasetError(f"{what}: file {path} has {size} bytes, not a multiple of the "
                           f"{row_bytes}-byte row (truncated or wrong dtype?)")
    return size // row_bytes


def check_mapping_files(spec: FeatureSpec, mapping: str) -> int:
    """Size-check every file of a mapping against the spec and each other; return row count.

    The expected row count is metadata.rows[mapping] when the spec records it (the writer
    does), otherwise the count most files agree on (ties go to the larger count, since a
    damaged file is usually a short one). Every file off that count is named."""
    if mapping not in spec.source_spec:
        raise DatasetError(f"mapping '{mapping}' not in the feature spec "
                           f"(has {spec.mappings})")
    files = spec.feature_files(mapping)
    counts, row_bytes = {}, {}
    numerical = spec.numerical_features
    if numerical:
        row_bytes[files["numerical"]] = spec.dtype(numerical[0]).itemsize * len(numerical)
        counts[files["numerical"]] = _check_file_rows(
            files["numerical"], row_bytes[files["numerical"]], f"{mapping} numerical features")
    label = spec.label_feature
    row_bytes[files["label"]] = spec.dtype(label).itemsize
    counts[files["label"]] = _check_file_rows(files["label"], row_bytes[files["label"]],
                                              f"{mapping} label '{label}'")
    for name, path in zip(spec.categorical_features, files["categorical"]):
        row_bytes[path] = spec.dtype(name).itemsize
        counts[path] = _check_file_rows(path, row_bytes[path],
                                        f"{mapping} categorical feature '{name}'")
    expected = expected_rows(spec, mapping)
    if expected is None:
        values = list(counts.values())
        expected = max(set(values), key=lambda n: (values.count(n), n))
        source = "most files have"
    else:
        source = "the feature spec's metadata says"
    odd = [f"{p} ({n} rows = {n * row_bytes[p]} bytes, expected {expected * row_bytes[p]})"
           for p, n in counts.items() if n != expected]
    if odd:
        raise DatasetError(f"mapping '{mapping}': {source} {expected} rows, but "
                           f"{'; '.join(odd)} (truncated or extra data?)")
    return expected


class SplitBinaryReader(BatchSource):
    """Reads batches of one mapping of a split-binary dataset with positioned reads.

    Every file is size-checked against the spec when the reader is made (DatasetError names
    a truncated or missing file). get(i) reads batch i of the file order with one positioned
    read per file: the rank's slice of the numerical block and of the labels, and the whole
    global batch of each categorical feature in categorical_indices (default: all), whose
    ids are checked against the cardinality (DatasetError naming file, row and feature), as
    the numerical features are for NaN and inf.
    """

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, drop_last: bool = False,
                 rank: int = 0, world_size: int = 1, categorical_indices=None,
                 shuffle: bool = False, seed: int = 0):
        spec.validate(DLRM_CONTRACT)
        num_rows = check_mapping_files(spec, mapping)
        super().__init__(batch_size, num_rows, drop_last, rank, world_size, shuffle, seed)
        self.spec, self.mapping = spec, mapping
        files = spec.feature_files(mapping)
        names = spec.categorical_features
        self.categorical_indices = (list(range(len(names))) if categorical_indices is None
                                    else [int(i) for i in categorical_indices])
        bad = [i for i in self.categorical_indices if not 0 <= i < len(names)]
        if bad:
            raise ValueError(f"categorical_indices {bad} outside 0..{len(names) - 1}")
        numerical = spec.numerical_features
        self._num_width = len(numerical)
        self._num_dtype = spec.dtype(numerical[0]) if numerical else np.dtype("float16")
        self._label_dtype = spec.dtype(spec.label_feature)
        self._cat_dtypes = [spec.dtype(names[i]) for i in self.categorical_indices]
        self._cat_names = [names[i] for i in self.categorical_indices]
        self._id_limits = [spec.id_limit(name) for name in self._cat_names]
        self._fds, self._paths = [], {}
        self._num_fd = self._open(files["numerical"]) if numerical else None
        self._label_fd = self._open(files["label"])
        self._cat_fds = [self._open(files["categorical"][i]) for i in self.categorical_indices]

    def _open(self, path):
        fd = os.open(path, os.O_RDONLY)
        self._fds.append(fd)
        self._paths[fd] = path
        return fd

    def _pread_into(self, fd, out: np.ndarray, offset: int) -> None:
        nbytes = out.nbytes
        if nbytes == 0:
            return
        got = os.preadv(fd, [out], offset)
        if got != nbytes:  # short read: rare for regular files; finish it or fail
            view = memoryview(out).cast("B")
            while got < nbytes:
                n = os.preadv(fd, [view[got:]], offset + got)
                if n == 0:
                    raise DatasetError(f"{self._paths.get(fd, fd)}: unexpected end of file at "
                                       f"byte {offset + got} (file truncated after the reader "
                                       f"was opened?)")
                got += n

    def get(self, index: int):
        start, stop = self.batch_rows(index)
        lo, hi = self.local_rows(index)
        numerical = np.empty((hi - lo, self._num_width), dtype=self._num_dtype)
        label = np.empty(hi - lo, dtype=self._label_dtype)
        categorical = [np.empty(stop - start, dtype=dt) for dt in self._cat_dtypes]
        if self._num_fd is not None:
            self._pread_into(self._num_fd, numerical,
                             lo * self._num_width * self._num_dtype.itemsize)
        self._pread_into(self._label_fd, label, lo * self._label_dtype.itemsize)
        for fd, dt, out in zip(self._cat_fds, self._cat_dtypes, categorical):
            self._pread_into(fd, out, start * dt.itemsize)
        self._check_ids(categorical, start)
        self._check_finite(numerical, lo)
        return numerical, categorical, label

    def _check_finite(self, numerical: np.ndarray, lo: int) -> None:
        bad = first_non_finite(numerical)
        if bad is not None:
            row, column = int(bad[0]), int(bad[1])
            raise non_finite_error(self.spec.numerical_features[column],
                                   numerical[row, column],
                                   f"{self._paths[self._num_fd]} row {lo + row}")

    def _check_ids(self, categorical: list, start: int) -> None:
        for fd, name, limit, ids in zip(self._cat_fds, self._cat_names, self._id_limits,
                                        categorical):
            bad = first_bad_id(ids, limit)
            if bad is not None:
                raise id_range_error(self.spec, name, ids[bad],
                                     f"{self._paths[fd]} row {start + bad[0]}")

    def close(self):
        for fd in self._fds:
            os.close(fd)
        self._fds, self._paths = [], {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

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


class SplitBinaryWriter(StagedWriter):
    """Writes a new split-binary dataset with its feature_spec.yaml.

    Everything goes to a temporary sibling directory that is renamed into place by close(),
    so a crash never leaves a half dataset, and an existing non-empty output is refused
    unless overwrite=True (then it is replaced only once the new one is complete). Used as a
    context manager, an exception inside the block removes the temporary directory; so does
    abort(). Each write() checks all its arrays before writing any byte, so a rejected write
    leaves the files as they were.
    """

    def __init__(self, output_dir: str, spec: FeatureSpec, overwrite: bool = False):
        spec = spec.copy()
        spec.validate(DLRM_CONTRACT)
        for mapping in spec.mappings:
            for chunk in spec.source_spec[mapping]:
                rel = chunk["files"][0]
                if os.path.isabs(rel) or os.path.normpath(rel).split(os.sep)[0] == "..":
                    raise DatasetError(f"mapping '{mapping}': file '{rel}' would be written "
                                       f"outside the output directory; use relative paths")
        self._output = StagedDirectory(output_dir, overwrite)
        self.spec = spec
        self.spec.base_directory = self._output.tmp_dir
        self.spec.metadata.pop("rows", None)
        self.rows = {}
        self._files = {}
        self._done = False

    def _file(self, path):
        if path not in self._files:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._files[path] = open(path, "wb")
        return self._files[path]

    def _prepare(self, mapping, numerical, categorical, label) -> tuple:
        """Check one write's arrays; return (rows, [(path, array)]) ready to append."""
        spec = self.spec
        if mapping not in spec.source_spec:
            raise DatasetError(f"mapping '{mapping}' not in the writer's spec ({spec.mappings})")
        files = spec.feature_files(mapping)
        label = np.asarray(label)
        if label.ndim != 1:
            raise DatasetError(f"label '{spec.label_feature}' has shape {label.shape}, "
                               f"expected (rows,)")
        n = label.shape[0]
        names = spec.categorical_features
        if len(categorical) != len(names):
            raise DatasetError(f"expected {len(names)} categorical arrays, found "
                               f"{len(categorical)}")
        out = []
        numerical_names = spec.numerical_features
        if numerical_names:
            numerical = np.asarray(numerical)
            if numerical.shape != (n, len(numerical_names)):
                raise DatasetError(f"numerical block has shape {numerical.shape}, expected "
                                   f"({n}, {len(numerical_names)})")
            numerical = np.ascontiguousarray(numerical, dtype=spec.dtype(numerical_names[0]))
            out.append((files["numerical"], numerical))
        out.append((files["label"], np.ascontiguousarray(label,
                                                         dtype=spec.dtype(spec.label_feature))))
        for name, path, values in zip(names, files["categorical"], categorical):
            values = np.asarray(values)
            if values.shape != (n,):
                raise DatasetError(f"categorical feature '{name}' has shape {values.shape}, "
                                   f"expected ({n},)")
            if n and values.dtype.kind not in "iu":
                raise DatasetError(f"categorical feature '{name}': ids must be integers, "
                                   f"found dtype {values.dtype}")
            card = int(spec.feature_spec[name]["cardinality"])
            if n and not spec.dynamic(name) and (values.min() < 0 or values.max() >= card):
                raise DatasetError(f"categorical feature '{name}': ids must lie in "
                                   f"[0, {card}), found [{values.min()}, {values.max()}]")
            out.append((path, np.ascontiguousarray(values, dtype=spec.dtype(name))))
        return n, out

    def write(self, mapping: str, numerical, categorical, label) -> None:
        """Append rows to a mapping. categorical: one [N] array per categorical feature."""
        if self._done:
            raise DatasetError("write() after close() or abort()")
        n, blocks = self._prepare(mapping, numerical, categorical, label)
        for path, array in blocks:
            f = self._file(path)
            if array.size:
                f.write(array.reshape(-1).view(np.uint8))
        self.rows[mapping] = self.rows.get(mapping, 0) + n

    def _finish_files(self) -> None:
        self._close_files()
        self.spec.metadata = dict(self.spec.metadata,
                                  rows={m: self.rows.get(m, 0) for m in self.spec.mappings})
        for mapping in self.spec.mappings:  # an empty mapping still gets its (empty) files
            for chunk in self.spec.source_spec[mapping]:
                path = self.spec.chunk_path(chunk)
                if not os.path.exists(path):
                    self._file(path).close()
            self._files = {}
            check_mapping_files(self.spec, mapping)

    def _close_files(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}
