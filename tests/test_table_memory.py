"""Host memory of embedding tables at scale: a table is initialised in row chunks straight
into its variable (no whole numpy copy), and Adam's moments live on their table's device.
Both run in a fresh process: peak RSS and logical devices are per process."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(code):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", f"import sys\nsys.path.insert(0, {ROOT!r})\n"
                           + code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_building_a_2gb_table_peaks_below_1_3x_its_size():
    out = run("""
import json, resource
import numpy as np, psutil, tensorflow as tf
from core.parallel.placement import make_plan
from embedding import EmbeddingLayer
rows, dim = 4_194_304, 128                       # 2 GiB of float32
tf.zeros([1])                                    # TensorFlow's own start-up is not counted
before = psutil.Process().memory_info().rss
layer = EmbeddingLayer(make_plan([rows], dim), seed=5)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
table = layer.piece_variables[0]
tail = table[-3:].numpy()
print(json.dumps({"before": before, "peak": peak, "bytes": rows * dim * 4,
                  "shape": table.shape.as_list(), "tail_abs_max": float(np.abs(tail).max()),
                  "bound": float(np.sqrt(1 / rows))}))
""")
    assert out["shape"] == [4_194_304, 128]
    assert 0 < out["tail_abs_max"] <= out["bound"]  # the last chunk was written, in range
    assert out["peak"] - out["before"] < 1.3 * out["bytes"], out


def test_adam_moments_are_created_on_their_tables_device():
    out = run("""
import json
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from core.parallel.placement import make_plan
from core.optimizers import LearningRateSchedule
from model import DLRM, ModelConfig
from trainer import DlrmTrainer
config = ModelConfig(num_numerical=3, cardinalities=(300, 7), embedding_dim=4,
                     bottom_mlp_dims=(4,), top_mlp_dims=(4, 1))
with tf.device("/CPU:1"):  # stands for the GPU; tables go to host memory (CPU:0): table 0
                          # offloaded, table 1 placed by default (this machine has no GPU)
    model = DLRM(config, make_plan(config.cardinalities, 4), offload_threshold_bytes=1000)
    trainer = DlrmTrainer(model, "adam", LearningRateSchedule(0.1, 0, 0, 0))
named = dict(trainer.dense_vars)
named.update({f"table/{i}": var for i, (_, var) in enumerate(trainer.table_pairs)})
pairs = [(var.device, slot.device) for name, var in named.items()
         for slot in trainer.optimizer.slots(name).values()]
print(json.dumps({"tables": [v.device for _, v in trainer.table_pairs], "pairs": pairs,
                  "variables": len(named)}))
""")
    assert [d.split(":")[-1] for d in out["tables"]] == ["0", "0"]
    assert len(out["pairs"]) == 2 * out["variables"]                # m and v of each
    assert {var.split(":")[-1] for var, _ in out["pairs"]} == {"0", "1"}  # dense on CPU:1
    for var_device, slot_device in out["pairs"]:
        assert slot_device == var_device
