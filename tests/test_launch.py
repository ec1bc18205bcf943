"""Launch scripts and the CLI surface: slurm_multinode.sh composes the srun call from its
environment, and main.py --help documents every flag."""
import os
import stat
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_srun(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text('#!/usr/bin/env bash\nfor a in "$@"; do echo "ARG[$a]"; done\n')
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


def test_slurm_script_builds_the_srun_command(tmp_path):
    env = fake_srun(tmp_path)
    env.update(cmd="python main.py --dataset_path /data --amp", cont="dlrm:1",
               mounts="/raid:/data", srun_flags="--gpus-per-task=1 --label")
    proc = subprocess.run(["bash", os.path.join(ROOT, "slurm_multinode.sh")], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    args = [line[4:-1] for line in proc.stdout.splitlines() if line.startswith("ARG[")]
    assert args == ["--mpi=pmix", "--container-image=dlrm:1",
                    "--container-workdir=/workspace/dlrm", "--container-mounts=/raid:/data",
                    "--gpus-per-task=1", "--label", "bash", "-c",
                    "python main.py --dataset_path /data --amp"]


def test_slurm_script_requires_cmd_and_container(tmp_path):
    env = fake_srun(tmp_path)
    env.pop("cmd", None)
    env["cont"] = "x"
    proc = subprocess.run(["bash", os.path.join(ROOT, "slurm_multinode.sh")], env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "set cmd to the training command" in proc.stderr


def test_help_documents_every_flag():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "--helpfull"],
                          capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    text = proc.stdout
    for flag in ("dataset_path", "feature_spec", "dataset_type", "mode", "amp", "xla",
                 "batch_size", "valid_batch_size", "epochs", "optimizer", "learning_rate",
                 "warmup_steps", "decay_start_step", "decay_steps", "evals_per_epoch",
                 "max_steps", "save_checkpoint_path", "restore_checkpoint_path", "run_eagerly",
                 "print_freq", "cpu", "loss_scale", "embedding_dim", "bottom_mlp_dims",
                 "top_mlp_dims", "embedding_trainable", "seed", "log_path", "interaction",
                 "dot_interaction", "column_slice_threshold", "data_parallel_threshold",
                 "cpu_offloading_threshold_gb", "synthetic_dataset_cardinalities",
                 "saved_model_output_path", "checkpoint_steps", "print_plan"):
        assert f"--{flag}" in text or f"--[no]{flag}" in text, flag
