#!/usr/bin/env bash
#SBATCH --exclusive
#SBATCH --mem=0
#SBATCH --overcommit
# Multi-node hybrid-parallel training with SLURM: one task per GPU, launched by srun inside
# the training container (pyxis/enroot); Horovod talks MPI through PMIx.
#
#   cmd="python main.py --dataset_path /data/dlrm --amp --xla" \
#   cont=dlrm-tf2:latest mounts=/raid/dlrm:/data \
#   sbatch -n 32 -N 4 slurm_multinode.sh
#
# Environment:
#   cmd         the training command, run by every task (required)
#   cont        container image with this project installed (required)
#   mounts      container mounts, src:dst[,src:dst...] (optional)
#   srun_flags  extra srun flags, e.g. "--mpi=pmi2" on clusters without PMIx (optional)
set -euo pipefail

: "${cmd:?set cmd to the training command, e.g. cmd=\"python main.py --dataset_path /data\"}"
: "${cont:?set cont to the container image that has this project installed}"
mounts="${mounts:-}"
srun_flags="${srun_flags:-}"

container_flags=(--container-image="$cont" --container-workdir=/workspace/dlrm)
if [ -n "$mounts" ]; then
  container_flags+=(--container-mounts="$mounts")
fi

echo "[slurm_multinode] ${SLURM_NTASKS:-?} tasks on ${SLURM_JOB_NUM_NODES:-?} nodes: $cmd"
# shellcheck disable=SC2086  # srun_flags is a list of flags on purpose
srun --mpi=pmix "${container_flags[@]}" $srun_flags bash -c "$cmd"
