#!/usr/bin/env bash
# RLHF on the default task, offline (docs/benchmarks.md, "RLHF end to end"): per seed, a Bradley-Terry reward
# model (hybridflow-train-rm on the synthetic preferences), then GRPO (experiment=rlhf) and PPO
# (experiment=rlhf_ppo) against it alone, then hybridflow compare. About 17 minutes on 2 CPU cores.
#   bash bench/rlhf_pipeline.sh [OUT_DIR] [STEPS]
set -euo pipefail
OUT=$(realpath -m "${1:-outputs/rlhf_pipeline}")
STEPS=${2:-300}
BIN=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin
mkdir -p "$OUT" && cd "$OUT"
for seed in 0 1 2; do
  "$BIN/hybridflow-train-rm" trainer.seed=$seed trainer.output_dir="$OUT/rm_s$seed" hydra.run.dir="$OUT/rmrun_s$seed" \
      data.synthetic_dir="$OUT/prefs" > "rm_s$seed.log" 2>&1
done
for seed in 0 1 2; do
  for exp in rlhf rlhf_ppo; do
    "$BIN/hybridflow-train" experiment=$exp reward_model.model.path="$OUT/rm_s$seed" trainer.seed=$seed \
        trainer.total_training_steps="$STEPS" trainer.test_freq=25 'trainer.logger=[console,jsonl]' \
        hydra.run.dir="$OUT/${exp}_s$seed" data.synthetic_dir="$OUT/data" > "${exp}_s$seed.log" 2>&1
  done
done
"$BIN/hybridflow" compare rlhf_s0 rlhf_s1 rlhf_s2 rlhf_ppo_s0 rlhf_ppo_s1 rlhf_ppo_s2 --out cmp --threshold 0.8 \
    --ignore reward_model.model.path --label rlhf=GRPO --label rlhf_ppo=PPO \
    --title "RLHF on the default task: the reward model's score alone"
