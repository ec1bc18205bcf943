"""How every family's readers see data: the batch source interface (row slices per rank,
seeded batch order), id range checks at the door, ragged-row helpers, and the one FeatureSpec
loader (path, contract, dtypes from the data where the spec gives none)."""
from __future__ import annotations

import os

import numpy as np

from core.feature_spec import DEFAULT_FILENAME, FeatureSpec, FeatureSpecError, with_dtypes


class DatasetError(ValueError):
    """Dataset files that do not match their FeatureSpec; the message names the file."""


def local_row_bounds(batch_rows: int, rank: int, world_size: int) -> tuple:
    """Contiguous slice [start, stop) of a batch of batch_rows rows that rank owns."""
    return batch_rows * rank // world_size, batch_rows * (rank + 1) // world_size


class BatchSource:
    """Common shape of a batch source: len(), get(i) -> (numerical, categorical list, label).

    get(i) always returns batch i of the file order. For training, batch_order(epoch) gives the
    order to visit the batches in: 0..len-1, or with shuffle=True a permutation that depends
    only on (seed, epoch), so every rank computes the same order without communicating.
    """

    def __init__(self, batch_size: int, num_rows: int, drop_last: bool, rank: int,
                 world_size: int, shuffle: bool = False, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, found {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of size {world_size}")
        self.batch_size, self.num_rows = batch_size, num_rows
        self.rank, self.world_size = rank, world_size
        self.drop_last, self.shuffle, self.seed = drop_last, shuffle, seed
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

    def batch_order(self, epoch: int = 0) -> np.ndarray:
        """Indices of the batches in the order epoch `epoch` visits them."""
        if not self.shuffle:
            return np.arange(self.num_batches)
        return np.random.default_rng([int(self.seed), int(epoch)]).permutation(self.num_batches)

    def epoch(self, epoch: int = 0):
        """Yield the batches of one epoch in batch_order(epoch)."""
        for i in self.batch_order(epoch):
            yield self.get(int(i))

    def __iter__(self):
        return self.epoch(0)


def expected_rows(spec: FeatureSpec, mapping: str):
    """The row count the spec's metadata records for a mapping (the writers record it), or
    None."""
    rows = spec.metadata.get("rows") if isinstance(spec.metadata, dict) else None
    if isinstance(rows, dict) and isinstance(rows.get(mapping), int) \
            and not isinstance(rows.get(mapping), bool):
        return rows[mapping]
    return None


_UNSIGNED = {np.dtype(f"{k}{n}"): np.dtype(f"u{n}") for k in "iu" for n in (1, 2, 4, 8)}


def first_bad_id(ids: np.ndarray, limit: int):
    """Index of the first id of `ids` outside [0, limit], or None. One pass over the batch:
    viewed unsigned, a negative id is larger than any limit."""
    unsigned = _UNSIGNED.get(ids.dtype)
    if unsigned is None or not ids.size or limit is None:  # None: a dynamic table's ids
        return None
    ids = ids.view(unsigned)
    if ids.max() <= limit:
        return None
    return np.unravel_index(int(np.argmax(ids > limit)), ids.shape)


def id_range_error(spec: FeatureSpec, name: str, value, where: str) -> DatasetError:
    return DatasetError(f"{where}: feature '{name}' has id {value}, outside "
                        f"[0, {spec.id_limit(name)}] ({spec.id_convention})")


def first_non_finite(values: np.ndarray):
    """Index of the first NaN or inf of a float array, or None (one pass over the batch)."""
    if values.dtype.kind != "f" or not values.size:
        return None
    if values.dtype == np.float16:  # numpy's isfinite is slow on float16: the exponent bits
        exponent = values.view(np.uint16) & np.uint16(0x7C00)
        if exponent.max() < 0x7C00:
            return None
        return np.unravel_index(int(np.argmax(exponent == 0x7C00)), values.shape)
    finite = np.isfinite(values)
    if finite.all():
        return None
    return np.unravel_index(int(np.argmin(finite)), values.shape)


def non_finite_error(name: str, value, where: str) -> DatasetError:
    return DatasetError(f"{where}: feature '{name}' has the value {value}; NaN and inf are "
                        f"never trained on (clean or impute the data)")


LENGTH_SUFFIX = "__length"


def length_key(feature: str) -> str:
    """Batch key of the number of valid values per row of a multi-hot or sequence feature."""
    return feature + LENGTH_SUFFIX


def pad_ragged(flat: np.ndarray, lengths: np.ndarray, width: int, feature: str,
               where: str, first_row: int = 0) -> np.ndarray:
    """Rows given as concatenated values + per-row lengths -> [rows, width] padded with 0."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and lengths.max() > width:
        row = int(np.argmax(lengths > width))
        raise DatasetError(f"{where}: feature '{feature}' row {first_row + row} has "
                           f"{lengths[row]} values, more than its dimensions [{width}]")
    out = np.zeros((lengths.size, width), dtype=flat.dtype)
    out[np.arange(width)[None, :] < lengths[:, None]] = flat  # row-major: values in order
    return out


def parquet_dtypes(spec: FeatureSpec) -> dict:
    """{feature: numpy dtype name} from the schema of the first file of each parquet chunk
    (list columns: their values' type), for the features whose spec gives no dtype."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    found = {}
    for chunks in spec.source_spec.values():
        for chunk in chunks if isinstance(chunks, list) else []:
            wanted = [f for f in chunk.get("features") or []
                      if f not in found and "dtype" not in (spec.feature_spec.get(f) or {})]
            if chunk.get("type") != "parquet" or not wanted or not chunk.get("files"):
                continue
            path = os.path.join(spec.base_directory, chunk["files"][0])
            if not os.path.isfile(path):
                continue  # the reader names it
            try:
                schema = pq.read_schema(path)
            except Exception as e:  # pyarrow raises several types for a damaged file
                raise DatasetError(f"{path}: not a readable parquet file ({e})") from None
            for name in wanted:
                if name in schema.names:
                    arrow = schema.field(name).type
                    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
                        arrow = arrow.value_type
                    try:
                        found[name] = str(np.dtype(arrow.to_pandas_dtype()))
                    except (NotImplementedError, TypeError):
                        pass  # not a numeric column: the reader names it
    return found


def load_spec(dataset_dir: str, contract, feature_spec: str = DEFAULT_FILENAME) -> FeatureSpec:
    """The FeatureSpec of a dataset directory (feature_spec: a file name in it, or an absolute
    path), with the dtypes the spec leaves out taken from its parquet files (NVIDIA's Wide &
    Deep specs carry none), validated against the family's contract."""
    path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset_dir,
                                                                         feature_spec)
    if not os.path.isfile(path):
        raise FeatureSpecError(f"feature spec not found: {path}")
    try:
        spec = FeatureSpec.from_yaml(path)
        return with_dtypes(spec, contract, parquet_dtypes(spec)).validate(contract)
    except FeatureSpecError as e:
        raise FeatureSpecError(f"{path}: {e}") from None
