#!/usr/bin/env bash
# The GPU check, as one script for a lent GPU machine (one H200 in mind; under 8 minutes):
#
#   bash bench/gpu_check.sh [OUT_DIR] [cuda|cpu]      # cpu: the same steps, small, to try the script here first
#
# On the GPU machine (Python 3.12, a CUDA torch and transformers, no Ray, no network, 64 MiB per transfer):
# first `bash ../shared/device/pack-wheels.sh` here (it writes .whl/ with Ray minus its Java jar and the other
# missing packages; carry .whl), then this script installs them into /tmp/site, and hybridflow in place.
#
# 1. machine: nvidia-smi, torch and CUDA versions;
# 2. e2e_tiny: the default job on CUDA/nccl with the builtin tiny model, 30 steps; every worker input reaches
#    its kernels on the GPU (a CPU tensor meeting a CUDA one fails the step); rollout/training log-prob gap;
# 3. qwen05b_shape: 10 steps of a Qwen2.5-0.5B-shaped model (random weights from its config: hidden 896,
#    24 layers, 14 heads, 2 KV heads, vocab 151,936), 256-token responses, bf16 compute over fp32 master
#    weights: step breakdown, generated tokens/s, peak memory per stage, the update's MFU, log-prob parity;
# 4. memory_plan: hybridflow plan --json of step 3's job (issue 50: the plan against the measured peaks);
# 5. reshard: bench/bench_reshard.py on the device;
# 6. cpu_parity_tests: the hybrid-engine and TP-rollout tests on this machine's torch build.
# Each step's output goes to OUT_DIR and the console; a failing step is reported and the script goes on,
# exiting non-zero at the end if any failed.
set -u
OUT=${1:-gpu_check_out}
DEVICE=${2:-cuda}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
failed=()
if [ -d "$ROOT/.whl" ] && ! $PY -c 'import ray' 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$ROOT"/.whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || echo "cannot install .whl/"
fi
# The checkout is the package (setup.cfg maps hybridflow to the root): install it in place, without
# touching the image's own torch/transformers (no network there, so no dependencies).
$PY -c 'import hybridflow' 2>/dev/null || $PY -m pip install -q --no-deps --no-build-isolation -e "$ROOT" \
  || { echo "cannot install hybridflow"; exit 1; }

step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    failed+=("$name")
    echo "=== $name FAILED"
  fi
}

if [ "$DEVICE" = cuda ]; then
  step machine 60 bash -c "nvidia-smi; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())'"
  RANKS=$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  [ "$RANKS" -ge 1 ] || { echo "no CUDA device visible: nothing to check"; exit 1; }
  TRAINER=gpu; BIG=builtin:qwen2.5-0.5b-shape; BIG_STEPS=10; BIG_LEN=256; E2E_STEPS=30
else
  RANKS=2; TRAINER=cpu; BIG=builtin:small-qwen2; BIG_STEPS=3; BIG_LEN=16; E2E_STEPS=6
fi
TP=$(( RANKS >= 2 ? 2 : 1 ))

step e2e_tiny 180 $PY -m hybridflow.trainer.main trainer=$TRAINER trainer.n_gpus_per_node="$RANKS" \
  actor_rollout_ref.rollout.tensor_model_parallel_size="$TP" trainer.total_training_steps=$E2E_STEPS trainer.test_freq=10 \
  hydra.run.dir="$OUT/e2e_run"
step e2e_parity 30 $PY -c "
import json, sys
rows = [json.loads(l) for l in open('$OUT/e2e_run/metrics.jsonl')]
gap = max(r.get('rollout/log_prob_gap_max', 0.0) for r in rows)
mem = {k: v for k, v in rows[-1].items() if k.startswith('memory/')}
print('steps', sum('score/mean' in r for r in rows), 'log-prob gap max', gap, 'memory', mem)
sys.exit(0 if gap < 1e-3 else 1)"
step qwen05b_shape 300 $PY "$ROOT/bench/bench_step.py" --model "$BIG" --device "$DEVICE" --ranks "$RANKS" \
  --steps $BIG_STEPS --warmup 1 --response-length $BIG_LEN --param-dtype bfloat16 --micro-batch 8 --json "$OUT/qwen05b_shape.json"
# the memory plan of the same job, to set beside the stages' measured peaks in qwen05b_shape.json (on a GPU the
# measured figure is the allocator's: the plan's "runtime" part, the CUDA context, is not in it)
step memory_plan 60 $PY -m hybridflow.cli plan --json trainer=$TRAINER actor_rollout_ref.model.path="$BIG" \
  actor_rollout_ref.rollout.response_length=$BIG_LEN actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.fsdp_config.param_dtype=bfloat16 data.max_prompt_length=64 trainer.n_gpus_per_node="$RANKS"
step reshard 120 $PY "$ROOT/bench/bench_reshard.py" --device "$DEVICE" --ranks "$RANKS" --tp "$TP"
if [ "$DEVICE" = cuda ]; then
  step cpu_parity_tests 120 $PY -m pytest -q -p no:cacheprovider \
    "$ROOT/tests/workers/test_hybrid_engine.py" "$ROOT/tests/workers/test_tensor_parallel_rollout.py"
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed steps: ${failed[*]}"; exit 1
fi
echo "all steps passed"
