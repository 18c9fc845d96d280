#!/usr/bin/env bash
# The memory plan of three of veRL's example jobs on 80 GB GPUs (docs/memory.md, "Public recipes"): each example's
# settings key for key, the model's shape built in (builtin:qwen2.5-*-shape), then the changes that make it fit.
#   bash bench/plan_recipes.sh
set -u
cd "$(dirname "$0")/.."
PLAN=(.venv/bin/hybridflow plan trainer.device=cuda trainer.memory_limit_gb=80 actor_rollout_ref.model.dtype=bfloat16)

# veRL's quickstart: PPO on GSM8K, Qwen2.5-0.5B-Instruct, one GPU
QUICKSTART=(actor_rollout_ref.model.path=builtin:qwen2.5-0.5b-shape algorithm.adv_estimator=gae
  data.train_batch_size=256 data.max_prompt_length=512 data.max_response_length=256
  actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 critic.ppo_micro_batch_size_per_gpu=4
  trainer.n_gpus_per_node=1 actor_rollout_ref.rollout.n=1)
# examples/grpo_trainer/run_qwen2-7b.sh
QWEN7B=(actor_rollout_ref.model.path=builtin:qwen2.5-7b-shape algorithm.adv_estimator=grpo
  data.train_batch_size=1024 data.max_prompt_length=512 data.max_response_length=1024
  actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
  actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.rollout.tensor_model_parallel_size=2
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
  actor_rollout_ref.ref.fsdp_config.param_offload=True trainer.n_gpus_per_node=8)
# examples/grpo_trainer/run_qwen2-32b_sglang_fsdp_npu.sh (vLLM here in place of SGLang)
QWEN32B=(actor_rollout_ref.model.path=builtin:qwen2.5-32b-shape algorithm.adv_estimator=grpo
  data.train_batch_size=32 data.max_prompt_length=2048 data.max_response_length=8192
  actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
  actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 actor_rollout_ref.rollout.tensor_model_parallel_size=4
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.5 actor_rollout_ref.rollout.n=8
  actor_rollout_ref.actor.fsdp_config.param_offload=True actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
  actor_rollout_ref.ref.fsdp_config.param_offload=True trainer.n_gpus_per_node=8 trainer.nnodes=2)

for job in QUICKSTART QWEN7B QWEN32B; do
  declare -n overrides=$job
  echo "== $job"
  "${PLAN[@]}" "${overrides[@]}"
done
echo "== QWEN7B, gradients reduced every micro-batch, smaller micro-batches"
"${PLAN[@]}" "${QWEN7B[@]}" actor_rollout_ref.actor.fsdp_config.accumulate_unsharded_grads=false \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
echo "== QWEN32B, gradients reduced every micro-batch"
"${PLAN[@]}" "${QWEN32B[@]}" actor_rollout_ref.actor.fsdp_config.accumulate_unsharded_grads=false
