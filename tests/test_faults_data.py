"""Faults in the data, each one line naming file, row (or record) and feature: NaN/inf in a
float feature (split binary float16/float32, parquet), a TFRecord record whose CRC does not
match (data or length; a file of random bytes), and a full disk under a dataset writer (the
previous output kept, nothing half-written)."""
import errno
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT, bounded_run
from core.columnar import ColumnarWriter, open_reader, write_columns
from core.crc32c import BLOCK, crc32c_many, masked
from core.feature_spec import FeatureSpec
from core.files import FileError
from core.sources import DatasetError, load_spec
from datasets import SplitBinaryReader
from dlrm_contract import DLRM_CONTRACT


def bitwise_crc32c(data: bytes) -> int:
    """CRC-32C bit by bit, from its definition (reflected polynomial 0x82F63B78)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def test_crc32c_matches_the_definition_at_every_length_class():
    assert bitwise_crc32c(b"123456789") == 0xE3069283  # the published check value
    rng = np.random.default_rng(0)
    lengths = [0, 1, 3, 4, 5, 77, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 300]
    parts = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    starts = np.cumsum([0] + lengths[:-1])
    got = crc32c_many(b"".join(parts), starts, starts + np.array(lengths))
    assert [int(c) for c in got] == [bitwise_crc32c(p) for p in parts]


def test_masked_crcs_are_those_tensorflow_writes(tmp_path):
    import tensorflow as tf
    records = [b"abcd", b"x" * 300, bytes(range(256)) * 3]
    path = str(tmp_path / "r.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    raw, position = open(path, "rb").read(), 0
    for record in records:
        length_crc, data_crc = np.frombuffer(raw, "<u4", 1, position + 8)[0], \
            np.frombuffer(raw, "<u4", 1, position + 12 + len(record))[0]
        assert masked(crc32c_many(raw, [position], [position + 8]))[0] == length_crc
        assert masked(crc32c_many(raw, [position + 12],
                                  [position + 12 + len(record)]))[0] == data_crc
        position += 16 + len(record)


# ---- NaN and inf ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,value", [("float16", np.nan), ("float32", np.inf),
                                         ("float32", -np.inf)])
def test_non_finite_numerical_value_names_file_row_and_feature(write_dataset, dtype, value):
    spec = FeatureSpec.get_default(4, [5, 300], numerical_dtype=dtype)
    loaded, arrays = write_dataset(spec, {"train": 1000, "test": 10})
    path = loaded.feature_files("train")["numerical"]
    values = np.fromfile(path, dtype).reshape(-1, 4)
    values[700, 2] = values[900, 1] = value
    values.tofile(path)
    reader = SplitBinaryReader(loaded, "train", batch_size=256)
    reader.get(0), reader.get(1)  # rows 0..511 are clean
    with pytest.raises(DatasetError) as error:
        reader.get(2)
    assert str(error.value).startswith(f"{path} row 700: feature '{loaded.numerical_features[2]}'")
    assert ("nan" if np.isnan(value) else "inf") in str(error.value)
    sharded = SplitBinaryReader(loaded, "train", batch_size=256, rank=1, world_size=2)
    with pytest.raises(DatasetError, match=f"row 900: feature '{loaded.numerical_features[1]}'"):
        sharded.get(3)  # rank 1 holds rows 896..1023 of batch 3


# main.py, with the reads after batch 3 (rows 768..1023, the first bad one) slowed down: they
# are still in flight in tf.data's threads when the error ends the process. An exit through
# the interpreter's shutdown then hung for ever (core.cli.exit_process).
SLOWED_DLRM_MAIN = """
import time
import main, dataloader
read = dataloader.BatchPipeline._read
def slowed(self, index):
    if int(index) > 3:
        time.sleep(3)
    return read(self, index)
dataloader.BatchPipeline._read = slowed
main.run()
"""


def test_nan_in_dlrm_training_is_one_line_and_nothing_is_saved(write_dataset, tmp_path):
    spec = FeatureSpec.get_default(13, [1000, 50, 7])
    loaded, _ = write_dataset(spec, {"train": 2048, "test": 256})
    path = loaded.feature_files("train")["numerical"]
    values = np.fromfile(path, np.float16).reshape(-1, 13)
    values[1000, 3] = values[1500, 7] = np.nan  # the reproduction
    values.tofile(path)
    checkpoint = tmp_path / "ck"
    proc = bounded_run(
        [sys.executable, "-c", SLOWED_DLRM_MAIN, "--dataset_path", loaded.base_directory,
         "--cpu", "--batch_size", "256", "--valid_batch_size", "256", "--embedding_dim", "8",
         "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1", "--max_steps", "8",
         "--save_checkpoint_path", str(checkpoint), "--log_path", str(tmp_path / "log.json")],
        timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {path} row 1000: feature 'num_3' has the value nan; NaN and "
                      f"inf are never trained on (clean or impute the data)"]
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(checkpoint)


def wide_deep_dataset(tmp_path):
    from wide_and_deep import generate_feature_spec, synthetic
    spec = str(tmp_path / "spec.yaml")
    assert generate_feature_spec.main(["--dst", spec, "--onehot", "40:8", "--multihot", "20:4",
                                       "--num_numerical", "3"]) == 0
    dst = str(tmp_path / "wd")
    assert synthetic.main(["--feature_spec", spec, "--dst", dst, "--train_rows", "3000",
                           "--test_rows", "500"]) == 0
    return dst


def test_nan_in_a_parquet_column_names_file_row_and_feature(tmp_path):
    from wide_and_deep.contract import WIDE_DEEP_CONTRACT
    dst = wide_deep_dataset(tmp_path)
    spec = load_spec(dst, WIDE_DEEP_CONTRACT)
    chunk = spec.source_spec["train"][0]
    path = os.path.join(dst, chunk["files"][0])
    table = pd.read_parquet(path)
    numerical = spec.channel("numerical")[1]
    table.loc[1234, numerical] = np.inf
    table.to_parquet(path)
    reader = open_reader(load_spec(dst, WIDE_DEEP_CONTRACT), "train", 1000)
    reader.get(0)
    with pytest.raises(DatasetError, match=f"^{path} row 1234: feature '{numerical}' has the "
                                           f"value inf"):
        reader.get(1)


def damage_page(path, checksums: bool, seed=0):
    """Rewrite a parquet file (with or without page checksums), then overwrite random bytes
    in the middle of row group 0's first data page of its first column (footer intact);
    without checksums the page header is hit too, which nothing could tell from data."""
    import pyarrow.parquet as pq
    pq.write_table(pq.read_table(path), path, row_group_size=1000,
                   write_page_checksum=checksums)
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start, size = column.data_page_offset, column.total_compressed_size
    at = start + (size // 2 if checksums else 0)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(np.random.default_rng(seed).integers(0, 256, 16, dtype=np.uint8).tobytes())
    assert pq.ParquetFile(path).metadata.num_rows == 3000  # the footer still reads


# Reads a Wide & Deep dataset's train batches: argv dataset, batch size, then either batch
# indices (one line each: "read" or the DatasetError) or "threads" (every batch read many
# times from 8 threads at once, as tf.data reads them, each compared with a lone read).
READ_BATCHES = """
import sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from core.columnar import open_reader
from core.sources import DatasetError, load_spec
from wide_and_deep.contract import WIDE_DEEP_CONTRACT
reader = open_reader(load_spec(sys.argv[1], WIDE_DEEP_CONTRACT), "train", int(sys.argv[2]))
if sys.argv[3] == "threads":
    alone = [reader.get(i) for i in range(len(reader))]
    order = np.random.default_rng(0).integers(0, len(reader), 3000)
    with ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(reader.get, order))
    wrong = [int(i) for i, b in zip(order, batches)
             if any(not np.array_equal(b[k], alone[i][k]) for k in b)]
    print(f"wrong batches {sorted(set(wrong))}" if wrong else "read")
else:
    for index in sys.argv[3:]:
        try:
            reader.get(int(index))
            print("read")
        except DatasetError as e:
            print(f"DatasetError: {e}")
"""


def read_in_child(dst, batch_size, *batches) -> list:
    """READ_BATCHES' lines, read in a child process: pyarrow may crash rather than raise
    (on a damaged page, or on a race), which in-process would end the whole test worker."""
    proc = bounded_run([sys.executable, "-X", "faulthandler", "-c", READ_BATCHES, dst,
                        str(batch_size), *map(str, batches)], timeout=120)
    assert proc.returncode == 0, (f"the reading process ended with status {proc.returncode}"
                                  f" (a crash in pyarrow?): {proc.stderr[-3000:]}")
    return proc.stdout.splitlines()


@pytest.mark.parametrize("checksums", [True, False])
def test_a_damaged_parquet_page_names_file_and_row_group(tmp_path, checksums):
    from wide_and_deep.contract import WIDE_DEEP_CONTRACT
    dst = wide_deep_dataset(tmp_path)
    path = os.path.join(dst, load_spec(dst, WIDE_DEEP_CONTRACT).source_spec["train"][0][
        "files"][0])
    damage_page(path, checksums)
    damaged, intact = read_in_child(dst, 500, 0, 2)  # batch 2: row group 1, intact
    assert damaged.startswith(f"DatasetError: {path}: row group 0: not readable (corrupt "
                              f"file?): "), damaged
    if checksums:  # found by the page's checksum, before pyarrow decodes the page
        assert "CRC checksum verification failed" in damaged, damaged
    assert intact == "read"


def test_parquet_batches_read_from_several_threads_at_once_are_those_read_alone(tmp_path):
    """tf.data reads a reader's batches from several threads: each is the batch one thread
    reads (pyarrow's ParquetFile crashed now and then when two threads read it at once)."""
    import pyarrow.parquet as pq
    from wide_and_deep.contract import WIDE_DEEP_CONTRACT
    dst = wide_deep_dataset(tmp_path)
    for chunk in load_spec(dst, WIDE_DEEP_CONTRACT).source_spec["train"]:
        for name in chunk["files"]:  # 30 row groups: the reads ask for different ones
            path = os.path.join(dst, name)
            pq.write_table(pq.read_table(path), path, row_group_size=100,
                           write_page_checksum=True)
    assert read_in_child(dst, 50, "threads") == ["read"]


def test_a_damaged_parquet_page_is_one_error_line_of_wide_and_deep(tmp_path):
    from wide_and_deep.contract import WIDE_DEEP_CONTRACT
    dst = wide_deep_dataset(tmp_path)
    path = os.path.join(dst, load_spec(dst, WIDE_DEEP_CONTRACT).source_spec["train"][0][
        "files"][0])
    damage_page(path, checksums=True)
    proc = subprocess.run([sys.executable, "-m", "wide_and_deep.main", "--dataset_path", dst,
                           "--cpu", "--model_dir", str(tmp_path / "m"), "--results_dir",
                           str(tmp_path / "r"), "--num_epochs", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[-1].startswith(f"error: {path}: row group 0: not readable (corrupt file?): ")


# ---- TFRecord integrity -----------------------------------------------------------------
def sim_dataset(tmp_path):
    from sim.synthetic import write
    dst = str(tmp_path / "sim")
    write(dst, users=300, items=50, categories=5, history_length=100)
    return dst


def record_bounds(path):
    """(start, end) of every record of a TFRecord file, from its length fields."""
    raw, bounds, position = open(path, "rb").read(), [], 0
    while position < len(raw):
        end = position + 16 + int(np.frombuffer(raw, "<u8", 1, position)[0])
        bounds.append((position, end))
        position = end
    return bounds


def sim_reader(dst, mapping="train", batch=64):
    from sim.contract import SIM_CONTRACT
    return open_reader(load_spec(dst, SIM_CONTRACT), mapping, batch)


def test_a_flipped_data_byte_is_the_corrupt_record_named(tmp_path):
    dst = sim_dataset(tmp_path)
    reader = sim_reader(dst)
    path = reader.parts[0].paths[0]
    start, end = record_bounds(path)[100]
    with open(path, "r+b") as f:  # a label-sized change, the record's CRCs kept
        f.seek(end - 10)
        byte = f.read(1)
        f.seek(end - 10)
        f.write(bytes([byte[0] ^ 0x01]))
    reader = sim_reader(dst)
    reader.get(0)  # records 0..63 are intact
    with pytest.raises(DatasetError, match=f"^{path}: record 100: corrupt data \\(CRC mismatch"):
        reader.get(1)


def test_a_damaged_length_is_named_when_the_file_is_opened(tmp_path):
    dst = sim_dataset(tmp_path)
    path = sim_reader(dst).parts[0].paths[0]
    start, _ = record_bounds(path)[7]
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(np.array([12], "<u8").tobytes())  # a plausible length, its CRC kept
    with pytest.raises(DatasetError, match=f"^{path}: record 7: corrupt length"):
        sim_reader(dst)


def test_a_tfrecord_cut_short_after_opening_names_file_and_records(tmp_path):
    dst = sim_dataset(tmp_path)
    reader = sim_reader(dst)
    path = reader.parts[0].paths[0]
    start, _ = record_bounds(path)[70]
    os.truncate(path, start)  # records 70.. are gone under an open reader
    reader.get(0)
    with pytest.raises(DatasetError, match=f"^{path}: records 64..127: the file is shorter "
                                           f"than when it was opened$"):
        reader.get(1)


def test_a_tfrecord_of_random_bytes_names_the_file(tmp_path):
    dst = sim_dataset(tmp_path)
    path = sim_reader(dst).parts[0].paths[0]
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(DatasetError, match=f"^{path}: record 0: corrupt length"):
        sim_reader(dst)
    proc = subprocess.run([sys.executable, "-m", "sim.main", "--dataset_dir", dst, "--cpu",
                           "--results_dir", str(tmp_path / "r"), "--epochs", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {path}: record 0: corrupt length (CRC mismatch; the file is damaged or not "
        f"a TFRecord file)")


# ---- a full disk under a dataset writer -------------------------------------------------
@pytest.mark.parametrize("output_format", ["parquet", "tfrecord"])
def test_a_full_disk_keeps_the_previous_dataset_and_leaves_no_temp(tmp_path, monkeypatch,
                                                                    output_format):
    spec = FeatureSpec.get_default(2, [10])
    columns = {"num_0": np.ones(50, np.float32), "num_1": np.zeros(50, np.float32),
               "cat_0": np.arange(50) % 10, "label": np.ones(50, bool)}
    out = str(tmp_path / "out")
    write_columns(out, spec, {"train": columns, "test": columns}, output_format)
    before = sorted(os.listdir(out)), open(os.path.join(out, "feature_spec.yaml")).read()

    def full_disk(self, path, *args):
        with open(path, "wb") as f:
            f.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    writer_method = "_write_parquet" if output_format == "parquet" else "_write_tfrecord"
    monkeypatch.setattr(ColumnarWriter, writer_method, full_disk)
    with pytest.raises(FileError) as error:
        write_columns(out, spec, {"train": columns, "test": columns}, output_format,
                      rows_per_file=20, overwrite=True)
    assert str(error.value).startswith(f"cannot write {out} (")
    assert "No space left on device" in str(error.value)
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staged directory left
    assert (sorted(os.listdir(out)), open(os.path.join(out, "feature_spec.yaml")).read()) \
        == before
