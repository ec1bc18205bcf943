#!/usr/bin/env bash
#SBATCH --exclusive
#SBATCH --mem=0
#SBATCH --overcommit
# Multi-node hybrid-parallel training with Slurm, one rank per task. Two ways:
#  - with `cont`: srun runs every task inside that container (pyxis/enroot) and Horovod
#    talks MPI through PMIx (NVIDIA's images):
#      cmd="python main.py --dataset_path /data/dlrm --amp --xla" \
#      cont=dlrm-tf2:latest mounts=/raid/dlrm:/data sbatch -n 32 -N 4 slurm_multinode.sh
#  - without `cont` (a plain cluster, Horovod built with Gloo): every task runs `cmd` in the
#    submit directory with its .venv (if there is one); tools/slurm_launch.py starts Horovod's
#    Gloo rendezvous server here and gives each task its ranks. Submit from the repository root:
#      cmd="python main.py --dataset_path /data/dlrm --cpu" sbatch -n 4 -N 2 slurm_multinode.sh
#
# Environment:
#   cmd         the training command, run by every task (required)
#   cont        container image with this project installed (optional, see above)
#   mounts      container mounts, src:dst[,src:dst...] (with cont)
#   srun_flags  extra srun flags, e.g. "--mpi=pmi2" on clusters without PMIx (optional)
set -euo pipefail

: "${cmd:?set cmd to the training command, e.g. cmd=\"python main.py --dataset_path /data\"}"
cont="${cont:-}"
mounts="${mounts:-}"
srun_flags="${srun_flags:-}"

echo "[slurm_multinode] ${SLURM_NTASKS:-?} tasks on ${SLURM_JOB_NUM_NODES:-?} nodes" \
  "(${cont:-no container}): $cmd"
if [ -z "$cont" ]; then
  cd "${SLURM_SUBMIT_DIR:-.}"
  if [ ! -f tools/slurm_launch.py ]; then
    echo "error: submit slurm_multinode.sh from the repository root ($PWD has no tools/slurm_launch.py)" >&2
    exit 2
  fi
  if [ -x .venv/bin/python ]; then
    PATH="$PWD/.venv/bin:$PATH"
    export PATH
  fi
  exec python tools/slurm_launch.py launch -- "$cmd"  # reads srun_flags from the environment
fi

container_flags=(--container-image="$cont" --container-workdir=/workspace/dlrm)
if [ -n "$mounts" ]; then
  container_flags+=(--container-mounts="$mounts")
fi
# shellcheck disable=SC2086  # srun_flags is a list of flags on purpose
srun --mpi=pmix "${container_flags[@]}" $srun_flags bash -c "$cmd"
