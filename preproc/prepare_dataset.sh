#!/usr/bin/env bash
# Raw Criteo click logs (day_0 ... day_K) -> split-binary DLRM dataset + feature_spec.yaml.
#
#   preproc/prepare_dataset.sh <CPU|DGX2> <frequency_threshold> [extra prepare_dataset.py options]
#
# Environment (defaults in brackets):
#   download_dir                 raw day files day_0 ... day_K      [/data/dlrm/criteo]
#   spark_output_path            parsed parquet + models/ (dictionaries) [/data/dlrm/spark/output]
#   conversion_intermediate_dir  per-split parquet before conversion [/data/dlrm/intermediate_binary]
#   final_output_dir             the dataset (--dataset_path)       [/data/dlrm/binary_dataset]
#   TOTAL_CORES                  Spark cores                         [all cores]
#   TOTAL_MEMORY                 GiB (or 16g, 512m) for Spark        [3/4 of RAM]
#   SPARK_MASTER                 cluster master URL                  [local[TOTAL_CORES]]
#   PREPROC_ENGINE               spark, or local (polars in one process; same output) [spark]
#   RAPIDS_JAR                   rapids-4-spark jar, needed by DGX2 [/opt/rapids/rapids-4-spark.jar if present]
#   PYTHON                       interpreter                         [repo .venv, else python3]
# Details: preproc/README.md
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
}
fail() { echo "prepare_dataset.sh: error: $*" >&2; exit 2; }

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
  usage
  echo "Options after the two arguments go to prepare_dataset.py (--help there lists them)." >&2
  exit 0
fi
if [ $# -lt 2 ]; then
  usage
  fail "expected 2 arguments <CPU|DGX2> <frequency_threshold>, found $#"
fi
mode="$1"; threshold="$2"; shift 2
case "$mode" in
  CPU|DGX2) ;;
  *) usage; fail "mode must be CPU or DGX2, found '$mode'" ;;
esac
[[ "$threshold" =~ ^[0-9]+$ ]] || fail "frequency_threshold must be a non-negative integer, found '$threshold'"
# the Dockerfile_spark image puts the jar here when built with --build-arg RAPIDS_VERSION=...
if [ -z "${RAPIDS_JAR:-}" ] && [ -f /opt/rapids/rapids-4-spark.jar ]; then
  export RAPIDS_JAR=/opt/rapids/rapids-4-spark.jar
fi
if [ "$mode" = DGX2 ] && [ -z "${RAPIDS_JAR:-}" ] && [[ " $* " != *" --rapids_jar"* ]]; then
  fail "mode DGX2 needs the RAPIDS accelerator: set RAPIDS_JAR to the rapids-4-spark_2.12 jar (see preproc/README.md), or use mode CPU"
fi

export download_dir="${download_dir:-/data/dlrm/criteo}"
export spark_output_path="${spark_output_path:-/data/dlrm/spark/output}"
export conversion_intermediate_dir="${conversion_intermediate_dir:-/data/dlrm/intermediate_binary}"
export final_output_dir="${final_output_dir:-/data/dlrm/binary_dataset}"
export TOTAL_CORES="${TOTAL_CORES:-$(nproc)}"

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
engine="${PREPROC_ENGINE:-spark}"
[[ " $* " =~ \ --engine[=\ ]([a-z]+) ]] && engine="${BASH_REMATCH[1]}"
[ "$engine" = local ] || command -v java >/dev/null 2>&1 || [ -n "${JAVA_HOME:-}" ] || fail "Spark needs Java (17 or 11): install a JRE or set JAVA_HOME"

echo "[preproc] download_dir=$download_dir spark_output_path=$spark_output_path"
echo "[preproc] conversion_intermediate_dir=$conversion_intermediate_dir final_output_dir=$final_output_dir"
echo "[preproc] engine=$engine TOTAL_CORES=$TOTAL_CORES TOTAL_MEMORY=${TOTAL_MEMORY:-auto} SPARK_MASTER=${SPARK_MASTER:-local}"
exec "$PYTHON" "$here/prepare_dataset.py" --mode "$mode" --frequency_threshold "$threshold" "$@"
