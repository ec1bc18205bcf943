#!/usr/bin/env bash
# One-command set-up: .venv/ with the pinned requirements and horovod built
# against them. Quick when nothing changed (a stamp records what was installed).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
HOROVOD_VERSION=0.28.1
# horovod's last release predates TensorFlow 2.18: built from its sdist with this patch
HOROVOD_PATCH=tools/horovod-0.28.1-tf2.21.patch
TF_VERSION=$(sed -n 's/^tensorflow-cpu==//p' requirements.txt)
# PYTHON picks the interpreter of a new .venv; TensorFlow 2.21 has wheels for 3.10-3.13 only
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ] && ! "$PYTHON" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
  echo "error: the set-up needs Python 3.10-3.13 (TensorFlow $TF_VERSION's wheels), '$PYTHON' is $("$PYTHON" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo missing); run with PYTHON=python3.X" >&2
  exit 2
fi
# DLRM_DEVICE=gpu|cpu forces the flavour (e.g. in a docker build, where no GPU is visible).
HAS_GPU=0
case "${DLRM_DEVICE:-auto}" in
  gpu) HAS_GPU=1 ;;
  cpu) HAS_GPU=0 ;;
  auto) if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then HAS_GPU=1; fi ;;
  *) echo "DLRM_DEVICE must be gpu, cpu or auto, found '$DLRM_DEVICE'" >&2; exit 2 ;;
esac

stamp_of() { cat requirements.txt tools/setup_env.sh "$HOROVOD_PATCH" | sha1sum | cut -c1-16; echo "gpu=$HAS_GPU"; }
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
command -v git >/dev/null || need_apt+=(git)   # applies the horovod patch
command -v java >/dev/null || need_apt+=(default-jre-headless)   # pyspark
[ -x "$VENV/bin/python" ] || "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
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

# horovod's compiled ops hold TensorFlow's ABI: rebuilt when TF, the patch or the flavour change
HVD_STAMP="$VENV/.horovod-stamp"
hvd_key="horovod=$HOROVOD_VERSION tf=$TF_VERSION gpu=$HAS_GPU patch=$(sha1sum < "$HOROVOD_PATCH" | cut -c1-16)"
if [ "$(cat "$HVD_STAMP" 2>/dev/null)" != "$hvd_key" ] || ! "$PY" -c "import horovod.tensorflow" 2>/dev/null; then
  echo "[setup] building horovod $HOROVOD_VERSION (patched) against TensorFlow $TF_VERSION (5-7 min on 2 cores, cached afterwards)"
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$src" "horovod==$HOROVOD_VERSION"
  tar xzf "$src/horovod-$HOROVOD_VERSION.tar.gz" -C "$src"
  git -C "$src/horovod-$HOROVOD_VERSION" apply "$PWD/$HOROVOD_PATCH"
  "$PY" -m pip uninstall -q -y horovod 2>/dev/null || true
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 MAKEFLAGS="-j$(nproc)" \
    "$PY" -m pip install -q --no-build-isolation --no-cache-dir "$src/horovod-$HOROVOD_VERSION"
  echo "$hvd_key" > "$HVD_STAMP"
fi
"$PY" -c "import tensorflow as tf, horovod.tensorflow as hvd; print('[setup] tensorflow', tf.__version__, '| horovod', hvd.__version__ if hasattr(hvd,'__version__') else 'ok')"
build_ops
stamp_of > "$STAMP"
