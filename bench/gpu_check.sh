#!/usr/bin/env bash
# The hybrid engine's GPU check, as one script for a lent GPU machine (under 5 minutes):
#
#   bash bench/gpu_check.sh [OUT_DIR]
#
# 1. the machine: nvidia-smi, torch and CUDA versions;
# 2. bench/bench_reshard.py on CUDA with nccl: FSDP over all GPUs -> rollout TP 2 (TP 1 on a
#    single GPU, where nccl cannot form a multi-rank group on one device);
# 3. the hybrid-engine and tensor-parallel rollout tests as they run on CPU (gloo), for parity
#    with the CPU results on this machine's torch build;
# 4. the end-to-end job on the GPUs (nccl, trainer=gpu, rollout TP 2 when there are >= 2 GPUs),
#    if Ray is importable (it is not on every GPU image: the script says so and goes on).
#
# Every step's output goes to OUT_DIR (default: ./gpu_check_out) and the console; a failing
# step is reported and the script continues, exiting non-zero at the end if any step failed.
set -u
OUT=${1:-gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
failed=()
# The checkout is the package (setup.cfg maps hybridflow to the root): install it in place, without
# touching the image's own torch/transformers (the GPU image has no network, so no dependencies).
$PY -m pip install -q --no-deps --no-build-isolation -e "$ROOT" || { echo "cannot install hybridflow"; exit 1; }

step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    failed+=("$name")
    echo "=== $name FAILED"
  fi
}

step machine 60 bash -c "nvidia-smi; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())'"
GPUS=$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$GPUS" -lt 1 ]; then
  echo "no CUDA device visible: nothing to check"; exit 1
fi
TP=$(( GPUS >= 2 ? 2 : 1 ))
step reshard 150 $PY "$ROOT/bench/bench_reshard.py" --device cuda --ranks "$GPUS" --tp "$TP"
step cpu_parity_tests 150 $PY -m pytest -q -p no:cacheprovider \
  "$ROOT/tests/workers/test_hybrid_engine.py" "$ROOT/tests/workers/test_tensor_parallel_rollout.py"
if $PY -c 'import ray' 2>/dev/null; then
  step e2e_job 240 hybridflow-train trainer=gpu trainer.n_gpus_per_node="$GPUS" \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$TP" trainer.total_training_steps=30 trainer.test_freq=10 \
    hydra.run.dir="$OUT/e2e_run"
else
  echo "=== e2e_job SKIPPED: ray is not importable on this machine (pip install 'ray>=2.49' to run it)" | tee "$OUT/e2e_job.log"
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed steps: ${failed[*]}"; exit 1
fi
echo "all steps passed"
