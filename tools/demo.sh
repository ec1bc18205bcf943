#!/usr/bin/env bash
# make demo: synthetic dataset with a planted signal -> train on CPU -> evaluate -> plot.
# Everything lands in out/demo/ (the log, the checkpoint, curves.png), or in $DEMO_OUT.
# DEMO_SMOKE=1: the same steps on a few batches (what `make test` runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${DEMO_OUT:-out/demo}
TRAIN_BATCHES=120 TEST_BATCHES=12 EPOCHS=2
if [ "${DEMO_SMOKE:-0}" = 1 ]; then TRAIN_BATCHES=6 TEST_BATCHES=2 EPOCHS=1; fi
VALIDATION_BATCHES=$TEST_BATCHES
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT"
rm -rf "$OUT/spec" "$OUT/data" "$OUT/checkpoint" "$OUT/checkpoint.best" "$OUT/train_log.json" \
    "$OUT/eval_log.json"

echo "== 1/5 feature spec: 13 numerical, 26 categorical features"
CARDS=$(python3 -c "print(','.join(str(c) for c in [20000,5000,300,12,40000,3,800,90,2,30000,2500,15000,10,700,6000,60,4,500,15,25000,8000,20000,1000,600,50,30]))")
$PY generate_feature_spec.py --num_numerical 13 --cardinalities "$CARDS" --dst "$OUT/spec/feature_spec.yaml"

echo "== 2/5 synthetic split-binary dataset (planted signal, power-law ids; train, validation, test)"
$PY transcribe.py --src_dataset_type synthetic --src_dataset_path "$OUT/spec" \
    --dst_dataset_path "$OUT/data" --dst_dataset_type tf_raw --src_batch_size 4096 \
    --max_batches_train $TRAIN_BATCHES --max_batches_test $TEST_BATCHES \
    --max_batches_validation $VALIDATION_BATCHES --signal_strength 2 --seed 1

MODEL="--dataset_path $OUT/data --cpu --embedding_dim 64 --bottom_mlp_dims 256,128,64
       --top_mlp_dims 512,256,1 --batch_size 4096 --valid_batch_size 16384"
echo "== 3/5 train up to $EPOCHS epochs (validation 4 times each), keep the best evaluation"
$PY main.py $MODEL --mode train --optimizer sgd --learning_rate 0.5 --warmup_steps 20 \
    --decay_start_step 120 --decay_steps 120 --evals_per_epoch 4 --print_freq 10 \
    --epochs $EPOCHS --keep_best --early_stopping_patience 3 \
    --save_checkpoint_path "$OUT/checkpoint" --log_path "$OUT/train_log.json"

echo "== 4/5 evaluate the checkpoint (the kept state) on the held-out test data"
$PY main.py $MODEL --mode eval --restore_checkpoint_path "$OUT/checkpoint" \
    --log_path "$OUT/eval_log.json"

echo "== 5/5 training curves"
$PY -m core.plot_log "$OUT/train_log.json" --out "$OUT/curves.png"

$PY - "$OUT" <<'PYEOF'
import sys
from core.dllog import read_log
out = sys.argv[1]
train = [r for r in read_log(f"{out}/train_log.json") if r["type"] == "LOG"]
speed = [r["data"]["samples_per_second"] for r in train if "samples_per_second" in r["data"]]
final = [r["data"] for r in read_log(f"{out}/eval_log.json") if r["step"] == []][-1]
kept = [r["data"] for r in train if r["step"] == []][-1]
print(f"\ndemo result: test AUC {final['auc']:.4f} over {final['eval_samples']:,} rows, "
      f"test loss {final['validation_loss']:.4f} (the state kept on validation AUC "
      f"{kept['best_auc']:.4f}: epoch {kept['kept_epoch']}, step {kept['kept_step']} of "
      f"{kept['step']}), "
      f"training {max(speed[1:] or speed):,.0f} samples/s (best interval) on CPU; "
      f"curves in {out}/curves.png")
PYEOF
