#!/usr/bin/env bash
# One-command set-up: .venv/ with the pinned requirements and horovod built
# against them. Quick when nothing changed (a stamp records what was installed).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
HOROVOD_VERSION=0.28.1
TF_VERSION=$(sed -n 's/^tensorflow-cpu==//p' requirements.txt)
# DLRM_DEVICE=gpu|cpu forces the flavour (e.g. in a docker build, where no GPU is visible).
HAS_GPU=0
case "${DLRM_DEVICE:-auto}" in
  gpu) HAS_GPU=1 ;;
  cpu) HAS_GPU=0 ;;
  auto) if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then HAS_GPU=1; fi ;;
  *) echo "DLRM_DEVICE must be gpu, cpu or auto, found '$DLRM_DEVICE'" >&2; exit 2 ;;
esac

stamp_of() { cat requirements.txt tools/setup_env.sh | sha1sum | cut -c1-16; echo "gpu=$HAS_GPU"; }
STAMP="$VENV/.setup-stamp"
# the project's CPU kernels (ops/*.cc -> build/), rebuilt whenever their source changed
# (absent in a docker layer that holds only this script: the Dockerfile builds them later)
build_ops() {
  [ ! -f core/fused_ops.py ] || TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" -m core.fused_ops --build
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_of)" ]; then
  build_ops
  exit 0
fi

need_apt=()
command -v g++ >/dev/null || need_apt+=(g++)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v make >/dev/null || need_apt+=(make)
command -v java >/dev/null || need_apt+=(default-jre-headless)   # pyspark
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip setuptools wheel packaging

if [ "$HAS_GPU" = 1 ]; then
  echo "[setup] NVIDIA GPU found: tensorflow[and-cuda]==$TF_VERSION, horovod with NCCL"
  grep -v '^tensorflow-cpu' requirements.txt > "$VENV/requirements-gpu.txt"
  echo "tensorflow[and-cuda]==$TF_VERSION" >> "$VENV/requirements-gpu.txt"
  "$PY" -m pip install -q -r "$VENV/requirements-gpu.txt"
  export HOROVOD_GPU_OPERATIONS=NCCL
else
  echo "[setup] installing requirements.txt (CPU)"
  "$PY" -m pip install -q -r requirements.txt
fi

if ! "$PY" -c "import horovod.tensorflow" 2>/dev/null; then
  echo "[setup] building horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (5-7 min on 2 cores, cached afterwards)"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 MAKEFLAGS="-j$(nproc)" \
    "$PY" -m pip install -q --no-build-isolation "horovod==$HOROVOD_VERSION"
fi
"$PY" -c "import tensorflow as tf, horovod.tensorflow as hvd; print('[setup] tensorflow', tf.__version__, '| horovod', hvd.__version__ if hasattr(hvd,'__version__') else 'ok')"
build_ops
stamp_of > "$STAMP"
