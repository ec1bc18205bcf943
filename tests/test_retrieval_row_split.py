"""retrieval.main --sharding row: the item table split by rows over two processes trains,
saves and evaluates as one process does (its own file: a long multi-process test that
pytest-xdist's --dist loadfile can place beside the others)."""
import shutil

import numpy as np
import pytest

from conftest import horovodrun
from test_retrieval_training import (PROTOCOLS, TINY, one_and_two_processes, prepare, results,
                                     retrieval, successor_lines)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("row_split"), "successors", successor_lines(300))


@pytest.mark.parametrize("loss", ["full", "sampled"])
def test_an_item_table_split_by_rows_over_two_processes_trains_as_one(data, tmp_path, loss):
    """--sharding row: each process holds half the rows (and their Adam slots) and reads the
    others from their owner; the figures and the saved whole table are one process's (whole
    table, data-parallel) up to the order of the sums. The sampled loss at its default
    negatives: in-batch ones are the global batch's targets, gathered from every process."""
    common = ["--model", "hstu", "--dataset_dir", data, *TINY, "--epochs", "2", "--loss", loss]
    retrieval(*common, "--output_dir", str(tmp_path / "whole"))
    output = one_and_two_processes([*common, "--sharding", "row"], tmp_path)
    whole, split = (np.load(tmp_path / run / "checkpoint" / "arrays.npz")
                    for run in ("whole", "two"))
    for name in ("item_embeddings", "item_embeddings/m", "block_0/uvqk"):
        assert split[name].shape == whole[name].shape, name
        np.testing.assert_allclose(split[name], whole[name], atol=2e-3, err_msg=name)
    assert results(tmp_path / "one") == results(tmp_path / "whole")
    # 30 items and the padding row: rows 0..14 on rank 0, 15..30 on rank 1
    assert "item table split by rows over 2 processes: rows 0-14, 15-30" in output, output[-2000:]
    if loss == "full":
        # the same checkpoint evaluated by 2 split processes (each ranks its users against
        # the gathered catalogue) and by 1: the same ranks, so the same figures
        common = ["--dataset_dir", data, *TINY, "--mode", "eval", "--output_dir"]
        shutil.copytree(tmp_path / "two", tmp_path / "eval_two")
        retrieval(*common, str(tmp_path / "eval_two"), "--sharding", "row",
                  launcher=horovodrun(2), timeout=400)
        retrieval(*common, str(tmp_path / "two"))
        split, single = results(tmp_path / "eval_two"), results(tmp_path / "two")
        for protocol in PROTOCOLS:
            assert split[protocol] == pytest.approx(single[protocol], abs=1e-12), protocol
