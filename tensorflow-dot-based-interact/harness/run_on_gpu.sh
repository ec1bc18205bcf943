#!/usr/bin/env bash
# Build the harness library (same CUDA sources as the TF op), check correctness against
# the float64 numpy reference over a grid of shapes, then time B=65536 R=27 C=128.
# Needs: nvcc, python3 with numpy + cupy, an NVIDIA GPU. No TensorFlow.
#
#   tensorflow-dot-based-interact/harness/run_on_gpu.sh            # full check + bench
#   QUICK=1 ./run_on_gpu.sh                                         # a few shapes only
#   SANITIZE=1 ./run_on_gpu.sh     # also compute-sanitizer memcheck+racecheck (quick grid)
#   RESULTS=/some/dir ./run_on_gpu.sh                               # where logs/json go
# Environment: PYTHON (default python3), ARCH (default: the GPU's, e.g. 90).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PKG="$(dirname "$HERE")"
PYTHON="${PYTHON:-python3}"
RESULTS="${RESULTS:-$HERE/build}"
mkdir -p "$RESULTS"

if [[ -z "${ARCH:-}" ]]; then
  ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '. ')"
fi
LIB="$HERE/build/libdbi_harness_sm${ARCH}.so"
echo "== build $LIB (ARCH=$ARCH)"
make -C "$PKG" harness ARCHS="$ARCH" HARNESS_OUT="$LIB" >"$RESULTS/build.log" 2>&1 \
  || { cat "$RESULTS/build.log"; exit 1; }
tail -n 2 "$RESULTS/build.log"

if [[ "${SANITIZE:-0}" == "1" ]]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool (quick grid)"
    timeout "${SAN_TIMEOUT:-240}" compute-sanitizer --tool "$tool" --error-exitcode 7 "$PYTHON" "$HERE/check_and_bench.py" \
      --lib "$LIB" --quick --no-bench >"$RESULTS/sanitize_$tool.log" 2>&1 \
      && echo "   $tool: clean" || { echo "   $tool: FAILED"; tail -n 30 "$RESULTS/sanitize_$tool.log"; }
  done
fi

ARGS=(--lib "$LIB" --json "$RESULTS/results.json")
[[ "${QUICK:-0}" == "1" ]] && ARGS+=(--quick)
echo "== check + bench"
PYTHONUNBUFFERED=1 "$PYTHON" "$HERE/check_and_bench.py" "${ARGS[@]}" "$@" 2>&1 | tee "$RESULTS/run.log"
exit "${PIPESTATUS[0]}"
