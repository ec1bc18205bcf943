#!/usr/bin/env bash
# Wide & Deep end to end on CPU: spec -> synthetic Outbrain-shaped data -> train -> evaluate
# the checkpoint -> curves PNG. Output under out/demo_wd/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=out/demo_wd
rm -rf "$OUT"
mkdir -p "$OUT"
$PY -m wide_and_deep.generate_feature_spec --dst "$OUT/spec/feature_spec.yaml" --scale 0.01
$PY -m wide_and_deep.synthetic --feature_spec "$OUT/spec/feature_spec.yaml" --dst "$OUT/data" \
    --train_rows 60000 --test_rows 10000 --signal_strength 2
TRAIN=(--dataset_path "$OUT/data" --cpu --model_dir "$OUT/model" --results_dir "$OUT/results"
       --global_batch_size 1024 --eval_batch_size 4096 --deep_hidden_units 64 64 64
       --deep_learning_rate 0.002 --deep_warmup_epochs 0.5 --print_freq 20)
$PY -m wide_and_deep.main "${TRAIN[@]}" --num_epochs 3
$PY -m wide_and_deep.main "${TRAIN[@]}" --evaluate --use_checkpoint --log_filename eval_log.json
echo "curves: $OUT/results/curves.png  log: $OUT/results/log.json  SavedModel: $OUT/model/saved_model"
