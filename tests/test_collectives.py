"""The Communicator's Horovod collectives under horovodrun (Gloo, 2 and 3 processes) against
numpy on every rank's inputs (what one process holding them all computes): allreduce,
allgather with unequal (and zero) rows, broadcast, and all-to-all with uneven and zero
splits, forward and backward. They are what the patched horovod build must carry."""
import os
import sys

import numpy as np
import pytest

from conftest import HOROVODRUN, ROOT, bounded_run, horovodrun, require_or_skip

require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}: the "
                "collective tests need horovod (tools/setup_env.sh builds it)")

COLS = 3


def inputs(rank: int, size: int) -> dict:
    """Rank `rank`'s inputs: integer-valued floats (sums are exact) that name their rank."""
    rows = [3, 1, 0][rank]  # unequal, and a rank with none at 3 processes
    # splits[rank][dest]: rows this rank sends to dest; zero for some pairs, uneven for others
    splits = [(rank + 2 * dest) % 3 for dest in range(size)]
    return {
        "dense": np.arange(8, dtype=np.float32).reshape(2, 4) * (rank + 1),
        "gather": np.full((rows, COLS), 10 * rank, np.float32) + np.arange(rows)[:, None],
        "broadcast": np.array([rank + 0.5, 7.0, -rank], np.float64),
        "splits": np.array(splits, np.int32),
        "send": (100 * rank + np.arange(sum(splits) * COLS, dtype=np.float32)).reshape(-1, COLS),
    }


SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import numpy as np
import tensorflow as tf
from core.parallel.comm import make_communicator

comm = make_communicator(cpu=True)
mine = np.load({out!r} + f"/in{{comm.rank}}.npz")
summed = comm.allreduce_sum(tf.constant(mine["dense"]), name="dense_sum")
rows = tf.IndexedSlices(tf.constant(mine["gather"]), tf.range(len(mine["gather"])),
                        tf.constant([8, 3], tf.int64))
gathered = comm.allreduce_sum(rows, name="row_sum")  # an allgather of values and indices
root = comm.broadcast_from_root(mine["broadcast"])
send = tf.constant(mine["send"])
with tf.GradientTape() as tape:
    tape.watch(send)
    received = comm.alltoall(send, tf.constant(mine["splits"]))
    loss = tf.reduce_sum(received * received)
grad = tape.gradient(loss, send)  # 2 * received, sent back along the splits
# the un-differentiated exchange (row-wise lookups' ids) also says how many rows came from whom
exchanged, received_splits = comm.exchange(send, tf.constant(mine["splits"]), "ids")
np.savez({out!r} + f"/out{{comm.rank}}.npz", summed=summed.numpy(),
         gathered=gathered.values.numpy(), indices=gathered.indices.numpy(), root=root,
         received=received.numpy(), exchanged=exchanged.numpy(),
         received_splits=received_splits.numpy(),
         grad=grad.numpy())
"""


@pytest.mark.parametrize("np_", [2, 3])
def test_collectives_match_numpy(np_, tmp_path):
    script = tmp_path / "collectives.py"
    script.write_text(SCRIPT.format(root=ROOT, out=str(tmp_path)))
    every = [inputs(r, np_) for r in range(np_)]
    for rank, mine in enumerate(every):
        np.savez(tmp_path / f"in{rank}.npz", **mine)
    proc = bounded_run(horovodrun(np_, sys.executable, str(script)), timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for rank in range(np_):
        got = np.load(tmp_path / f"out{rank}.npz")
        np.testing.assert_array_equal(got["summed"], sum(x["dense"] for x in every))
        np.testing.assert_array_equal(got["gathered"],
                                      np.concatenate([x["gather"] for x in every]))
        np.testing.assert_array_equal(got["indices"],
                                      np.concatenate([np.arange(len(x["gather"]))
                                                      for x in every]))
        np.testing.assert_array_equal(got["root"], every[0]["broadcast"])
        # what each source sends to this rank: its rows from the offset of the splits before
        starts = [np.concatenate([[0], np.cumsum(x["splits"])]) for x in every]
        expected = np.concatenate([x["send"][s[rank]:s[rank + 1]]
                                   for x, s in zip(every, starts)])
        np.testing.assert_array_equal(got["received"], expected)
        np.testing.assert_array_equal(got["exchanged"], expected)
        np.testing.assert_array_equal(got["received_splits"],
                                      [x["splits"][rank] for x in every])
        np.testing.assert_array_equal(got["grad"], 2 * every[rank]["send"])
