"""Row-wise sharding under horovodrun (Gloo, CPU): the routed lookup against numpy (vectors,
gradient rows on their owners, bytes sent equal to the plan's count), DLRM with a dynamic and
a static table split by rows trained on 2 and 3 processes against 1 process (losses per step,
AUC), and a checkpoint saved on 2 processes resumed on 1 and on 3."""
import os
import sys

import numpy as np
import pytest

from conftest import HOROVODRUN, bounded_run, horovodrun, require_or_skip
from test_hybrid import final, losses
from test_training import main_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}: the "
                "row-wise tests need horovod (tools/setup_env.sh builds it)")

def launch(np_, *args, timeout=300):
    cmd = [sys.executable, *args] if np_ == 1 else horovodrun(np_, sys.executable, *args)
    proc = bounded_run(cmd, timeout)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


ROUTING_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import numpy as np
import tensorflow as tf
from core.initializers import embedding_uniform_chunks
from core.parallel.comm import make_communicator
from core.parallel.placement import make_plan
from core.parallel.rows import range_owner, routed_lookup
from core.sources import local_row_bounds
from embedding import EmbeddingLayer

comm = make_communicator(cpu=True)
cards, dim, B = [37, 5, 11], 4, 14
plan = make_plan(cards, dim, comm.size, sharding="row_wise")
layer = EmbeddingLayer(plan, comm, seed=3)
rng = np.random.default_rng(0)
ids = [rng.integers(0, c, B) for c in cards]          # the global batch, the same on every rank
weights = rng.standard_normal((B, dim)).astype(np.float32)
start, stop = local_row_bounds(B, comm.rank, comm.size)
before = comm.alltoall_bytes_sent()
with tf.GradientTape() as tape:
    out, _ = layer.lookup([tf.constant(i) for i in ids], B, training=True)
    loss = tf.add_n([tf.reduce_sum(o * weights[start:stop]) for o in out])
grads = tape.gradient(loss, layer.piece_variables)
sent = comm.alltoall_bytes_sent() - before
assert sent == plan.row_wise_exchange_bytes(dict(enumerate(ids)), comm.rank), sent
for t, (card, o) in enumerate(zip(cards, out)):
    whole = np.concatenate([b for _, b in embedding_uniform_chunks(card, dim, 3, t)])
    np.testing.assert_array_equal(o.numpy(), whole[ids[t][start:stop]])
    piece = plan.pieces_of(t)[comm.rank]
    expected = np.zeros((card, dim), np.float32)
    np.add.at(expected, ids[t], weights)               # every rank's rows, summed by owner
    grad = tf.convert_to_tensor(grads[t]).numpy()
    np.testing.assert_allclose(grad, expected[piece.row_start:piece.row_stop], atol=1e-6)
# a multi-hot [rows, 3] lookup from two tables of 20 rows (widths 2 and 1) split alike
starts = [20 * r // comm.size for r in range(comm.size)]
mine = slice(starts[comm.rank], ([*starts[1:], 20])[comm.rank])
deep = np.arange(40, dtype=np.float32).reshape(20, 2)
wide = -np.arange(20, dtype=np.float32)[:, None]
hot = rng.integers(0, 20, (B, 3))[start:stop]
got = routed_lookup(comm, [tf.Variable(deep[mine]), tf.Variable(wide[mine])], tf.constant(hot),
                    range_owner(starts), lambda rows: rows - mine.start, name="multi_hot")
np.testing.assert_array_equal(got[0].numpy(), deep[hot])
np.testing.assert_array_equal(got[1].numpy(), wide[hot])
print(f"routing ok on rank {{comm.rank}}", flush=True)
"""


@pytest.mark.parametrize("np_", [2, 3])
def test_routed_lookup_vectors_gradients_and_bytes_equal_numpy(tmp_path, np_):
    script = tmp_path / "routing.py"
    script.write_text(ROUTING_SCRIPT.format(root=ROOT))
    out = launch(np_, str(script)).stdout
    assert all(f"routing ok on rank {r}" in out for r in range(np_)), out[-2000:]


# table 0 dynamic (30 distinct 64-bit ids, capacity 64: no evictions on 1-3 ranks; min_count 2:
# ids wait on the rare row, a copy on every rank, before they get rows), table 1 static
# (values < 64), both row-wise on several processes
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Full runs on 1 and 2 processes; the first 6 of 12 steps on 2 processes, saved, and
    the rest resumed from that checkpoint on 1 and on 3 processes (3 processes train steps
    7-12 there)."""
    from test_dynamic_training import MODEL, write_day
    base = tmp_path_factory.mktemp("row_wise")
    data = write_day(base / "data", np.arange(30), 2048, 3, static=(1,))
    model = [*MODEL, "--dataset_path", data, "--dynamic_features", "cat_0",
             "--sharding", "row_wise"]
    main_in_process([*model, "--log_path", str(base / "full1.json")])
    launch(2, "main.py", *model, "--log_path", str(base / "full2.json"))
    launch(2, "main.py", *model, "--max_steps", "6", "--save_checkpoint_path",
           str(base / "ckpt"), "--log_path", str(base / "first2.json"))
    for np_ in (1, 3):
        launch(np_, "main.py", *model, "--restore_checkpoint_path", str(base / "ckpt"),
               "--log_path", str(base / f"resumed{np_}.json"))
    return base


def assert_same_losses_and_auc(log, reference, first_step):
    got, want = losses(log), losses(reference)
    assert sorted(got) == list(range(first_step, max(want) + 1))
    for step in got:
        assert abs(got[step] - want[step]) <= 1e-5, (step, got[step], want[step])
    assert abs(final(log)["auc"] - final(reference)["auc"]) < 1e-6


def test_row_wise_training_matches_one_process(runs):
    assert_same_losses_and_auc(runs / "full2.json", runs / "full1.json", 1)
    one = losses(runs / "full1.json")
    assert final(runs / "full1.json")["auc"] > 0.55 and one[12] < one[1]  # it learned


@pytest.mark.parametrize("np_", [1, 3])
def test_checkpoint_saved_on_two_resumes_on_other_world_sizes(runs, np_):
    state = np.load(runs / "ckpt" / "dynamic_0.npz")  # one map joined from both shares
    assert len(state["keys"]) == 30 and len(set(state["rows"].tolist())) == 30
    assert_same_losses_and_auc(runs / f"resumed{np_}.json", runs / "full1.json", 7)
