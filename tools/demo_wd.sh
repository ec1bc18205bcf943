#!/usr/bin/env bash
# Wide & Deep end to end on CPU: spec -> synthetic Outbrain-shaped data -> train -> evaluate
# the checkpoint -> curves PNG. Output under out/demo_wd/, or $DEMO_OUT.
# DEMO_SMOKE=1: the same steps on a few thousand rows (what `make test` runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${DEMO_OUT:-out/demo_wd}
TRAIN_ROWS=200000 TEST_ROWS=20000 EPOCHS=10
if [ "${DEMO_SMOKE:-0}" = 1 ]; then TRAIN_ROWS=3000 TEST_ROWS=1000 EPOCHS=2; fi
rm -rf "$OUT"
mkdir -p "$OUT"
$PY -m wide_and_deep.generate_feature_spec --dst "$OUT/spec/feature_spec.yaml" --scale 0.01
$PY -m wide_and_deep.synthetic --feature_spec "$OUT/spec/feature_spec.yaml" --dst "$OUT/data" \
    --train_rows $TRAIN_ROWS --test_rows $TEST_ROWS --validation_rows $TEST_ROWS --signal_strength 2
TRAIN=(--dataset_path "$OUT/data" --cpu --model_dir "$OUT/model" --results_dir "$OUT/results"
       --global_batch_size 1024 --eval_batch_size 4096 --deep_hidden_units 64 64 64
       --deep_learning_rate 0.0002 --linear_learning_rate 0.002 --deep_warmup_epochs 0.5 --print_freq 20)
# up to $EPOCHS epochs: stops after 2 without a better validation MAP@12 and keeps the best
# one; --evaluate then reads the held-out test data
$PY -m wide_and_deep.main "${TRAIN[@]}" --num_epochs $EPOCHS --keep_best --early_stopping_patience 2
$PY -m wide_and_deep.main "${TRAIN[@]}" --evaluate --use_checkpoint --log_filename eval_log.json
$PY - "$OUT" <<'PYEOF'
import sys
from core.dllog import read_log
out = sys.argv[1]
final = [r["data"] for r in read_log(f"{out}/results/eval_log.json") if r["step"] == []][-1]
kept = [r["data"] for r in read_log(f"{out}/results/log.json") if r["step"] == []][-1]
print(f"\ndemo result: test AUC {final['auc']:.4f}, MAP@12 {final['map12']:.4f} over "
      f"{final['eval_samples']:,} test rows (the state kept on validation MAP@12 "
      f"{kept['best_map12']:.4f}: epoch {kept['kept_epoch']}, step {kept['kept_step']} of "
      f"{kept['step']}); curves: {out}/results/curves.png  log: "
      f"{out}/results/log.json  SavedModel: {out}/model/saved_model")
PYEOF
