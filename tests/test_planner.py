"""The placement planner's choices on given table sizes and per-rank budgets against
hand-computed placements and byte counts, and the plan-only mode of main.py (--print_plan
for world sizes that are not launched) against the plans the same code makes here."""
import os
import sys

import numpy as np
import pytest

from conftest import HOROVODRUN, bounded_run, horovodrun, require_or_skip
from core.parallel.placement import PlanError, make_plan
from dlrm_contract import CRITEO_CARDINALITIES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def layout(plan):
    """{table: [(rank, col_start, col_stop, row_start, row_stop)]}"""
    return {t: [(p.rank, p.col_start, p.col_stop, p.row_start, p.row_stop)
                for p in plan.pieces_of(t)] for t in range(plan.num_tables)
            if t not in plan.replicated}


def test_auto_without_budget_is_table_wise_largest_first_on_the_least_loaded_rank():
    # bytes 4000·8·4=128000, 2000·8·4=64000, 1500·8·4=48000: rank 0, rank 1, then rank 1
    plan = make_plan([4000, 2000, 1500], 8, 2)
    assert layout(plan) == {0: [(0, 0, 8, 0, 4000)], 1: [(1, 0, 8, 0, 2000)],
                            2: [(1, 0, 8, 0, 1500)]}
    assert [plan.kind_of(t) for t in range(3)] == ["table_wise"] * 3


def test_auto_splits_by_columns_the_tables_that_fit_no_rank():
    # bytes 32000, 19200, 3200 under a budget of 30000: table 0 in two 16000 column halves
    # (ranks 0, 1); table 1 on rank 0 would make 35200, so halves of 9600 too; table 2 on rank 0
    plan = make_plan([1000, 600, 100], 8, 2, memory_budget_bytes=30000)
    assert layout(plan) == {0: [(0, 0, 4, 0, 1000), (1, 4, 8, 0, 1000)],
                            1: [(0, 0, 4, 0, 600), (1, 4, 8, 0, 600)],
                            2: [(0, 0, 8, 0, 100)]}
    assert [plan.bytes_on(r) for r in range(2)] == [28800, 25600]


def test_auto_splits_by_rows_when_column_slices_do_not_fit():
    # 900 rows x 2 = 7200 bytes; two column halves need 3600 > 3000 each; three row ranges
    # of 300 rows need 2400 each; table 1 (240 bytes) then goes to rank 0
    plan = make_plan([900, 30], 2, 3, memory_budget_bytes=3000)
    assert plan.row_wise == (0,) and plan.kind_of(0) == "row_wise"
    assert layout(plan) == {0: [(0, 0, 2, 0, 300), (1, 0, 2, 300, 600), (2, 0, 2, 600, 900)],
                            1: [(0, 0, 2, 0, 30)]}
    assert plan.tables_read_by(1) == [0] and plan.tables_read_by(0) == [0, 1]


def test_a_plan_that_cannot_fit_is_one_error_naming_the_table_and_the_numbers():
    with pytest.raises(PlanError) as error:
        make_plan([900, 30], 2, 3, memory_budget_bytes=2000)
    message = str(error.value)
    assert "table 0 (900 rows x 2)" in message and "row_wise needs" in message
    assert "budget of 2,000 bytes" in message and "needs 2,400 bytes on rank 0" in message


def test_forced_kinds_apply_to_every_table_they_can_hold():
    rows = make_plan([10, 2], 4, 3, sharding="row_wise")
    # 10 rows: 10·r//3 -> 0:3, 3:6, 6:10; 2 rows < 3 ranks: whole, on the least loaded rank 0
    assert rows.row_wise == (0,)
    assert layout(rows) == {0: [(0, 0, 4, 0, 3), (1, 0, 4, 3, 6), (2, 0, 4, 6, 10)],
                            1: [(0, 0, 4, 0, 2)]}
    columns = make_plan([10, 2], 4, 3, sharding="column_wise")
    assert [(p.col_start, p.col_stop) for p in columns.pieces_of(0)] == [(0, 1), (1, 2), (2, 4)]
    assert len({p.rank for p in columns.pieces_of(0)}) == 3
    assert make_plan([10, 2], 4, 3, sharding="data_parallel").replicated == (0, 1)
    whole = make_plan([10, 2], 4, 3, sharding="table_wise")
    assert [len(whole.pieces_of(t)) for t in range(2)] == [1, 1]
    with pytest.raises(PlanError, match="--sharding row_wise"):
        make_plan([10, 2], 4, 3, 100, 0, sharding="row_wise")
    with pytest.raises(PlanError, match="--sharding must be one of"):
        make_plan([10], 4, 1, sharding="rows")


def test_thresholds_keep_their_meaning_under_auto():
    plan = make_plan([3000, 2000, 300, 50, 700], 16, 2, 30000, 1000)
    assert plan.replicated == (3,)  # 800 elements <= 1000
    assert [len(plan.pieces_of(t)) for t in (0, 1, 2, 4)] == [2, 2, 1, 1]


def test_exchange_bytes_by_kind():
    B, dim = 10, 4  # rank 0 trains rows 0:5, rank 1 rows 5:10; a vector is 16 bytes
    whole = make_plan([10], dim, 2)
    assert whole.exchange_bytes(0, B) == 2 * 5 * 16  # rank 1's 5 vectors and their gradients
    assert whole.alltoall_bytes_sent(0, B) == 160 and whole.alltoall_bytes_sent(1, B) == 0
    rows = make_plan([10], dim, 2, sharding="row_wise")
    # uniform ids: half of each rank's 5 ids live on the other rank: 5 ids x (8 + 2·16)
    assert rows.exchange_bytes(0, B) == 5 * (8 + 32)
    assert make_plan([10], dim, 2, sharding="data_parallel").exchange_bytes(0, B) == \
        1 * B * (16 + 8)
    # given ids: rank 0 (rows 0:5, ids 0:5 of the batch) asks for 7 and 9 (2 x (8 + 16)),
    # and serves the ids 1, 2 of rank 1's rows (2 x 16)
    ids = {0: [0, 7, 3, 9, 4, 1, 8, 2, 6, 5]}
    assert rows.row_wise_exchange_bytes(ids, 0) == 2 * 24 + 2 * 16
    # rank 1: of its ids 1, 8, 2, 6, 5 it asks rank 0 for 1 and 2, and serves 7 and 9
    assert rows.row_wise_exchange_bytes(ids, 1) == 2 * 24 + 2 * 16


def test_describe_prints_kind_ranks_and_bytes_per_table():
    plan = make_plan([900, 30], 2, 3, memory_budget_bytes=3000)
    text = plan.describe(global_batch=12)
    line = next(line for line in text.splitlines() if line.split()[:1] == ["0"])
    assert line.split()[1:4] == ["900", "row_wise", "all"]
    assert "exchanged per step" in text


def plan_mode(*args, ranks=1):
    command = [sys.executable, "main.py", "--print_plan", "--log_path", os.devnull, *args]
    return bounded_run(command if ranks == 1 else horovodrun(ranks, *command), 300)


MODEL = ["--dataset_type", "synthetic", "--synthetic_dataset_cardinalities",
         "3000,2000,300,50,700", "--embedding_dim", "16", "--batch_size", "512",
         "--sharding", "row_wise"]


def test_plan_mode_prints_the_plan_of_worlds_that_are_not_launched():
    proc = plan_mode(*MODEL, "--plan_world_sizes", "2,3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for n in (2, 3):
        plan = make_plan([3000, 2000, 300, 50, 700], 16, n, sharding="row_wise")
        assert plan.describe(512) in proc.stdout


def test_plan_mode_figures_for_nvidias_extra_large_model():
    proc = plan_mode("--plan_shape", "criteo_t0_synthetic", "--plan_world_sizes", "8,512",
                     "--memory_budget_gb", "80")
    assert proc.returncode == 0, proc.stderr[-2000:]
    params = int(np.sum(np.asarray(CRITEO_CARDINALITIES[0], np.int64))) * 128
    assert f"= {params / 1e9:,.2f} B embedding parameters" in proc.stdout
    assert round(params / 1e9) == 113  # NVIDIA's extra-large model: 113 B parameters
    for n in (8, 512):
        assert make_plan(CRITEO_CARDINALITIES[0], 128, n,
                         memory_budget_bytes=80 * 2**30).describe(65536) in proc.stdout
    tight = plan_mode("--plan_shape", "criteo_t0_synthetic", "--plan_world_sizes", "8",
                      "--memory_budget_gb", "16")
    assert tight.returncode == 2 and tight.stderr.strip().startswith("error: table 11 ")
    assert len(tight.stderr.strip().splitlines()) == 1


def test_plan_mode_matches_the_plan_of_a_launched_world():
    require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}")
    alone = plan_mode(*MODEL, "--plan_world_sizes", "2")
    launched = plan_mode(*MODEL, ranks=2)
    assert alone.returncode == 0 and launched.returncode == 0, launched.stderr[-2000:]
    plan = make_plan([3000, 2000, 300, 50, 700], 16, 2, sharding="row_wise").describe(512)
    rank0 = "".join(line.split(":", 1)[1] for line in launched.stdout.splitlines(True)
                    if line.startswith("[0]<stdout>:"))
    assert plan in alone.stdout and plan in rank0


def test_readme_figures_of_the_extra_large_model_are_the_plans():
    readme = open(os.path.join(ROOT, "README.md")).read()
    for sharding in ("auto", "row_wise"):
        for n in (8, 64, 512):
            plan = make_plan(CRITEO_CARDINALITIES[0], 128, n, sharding=sharding,
                             memory_budget_bytes=80 * 2**30)
            most = max(plan.bytes_on(r) for r in range(n)) / 2**30
            exchanged = sum(plan.exchange_bytes(t, 65536) for t in range(plan.num_tables))
            assert f"| {n} | {sharding} | {most:,.3f} | {exchanged / 2**20:,.1f} |" in readme
