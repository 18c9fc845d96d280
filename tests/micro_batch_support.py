"""Helpers of tests/workers/test_packing.py and test_dynamic_bsz.py: ragged batches, a tiny critic, and the
body of the 2-rank FSDP2 test (importable by spawned processes: tests/ is on sys.path)."""

import os
import sys

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForTokenClassification

from hybridflow.core import DataProto

PROMPT_LENS = [1, 7, 20, 3, 12, 2, 5, 16]
RESPONSE_LENS = [30, 1, 4, 17, 2, 9, 30, 1]


def ragged_batch(prompt_lens=PROMPT_LENS, response_lens=RESPONSE_LENS, seed=0):
    """Left-padded prompts and right-padded responses of the given lengths, tokens 3..23, position ids from 0,
    an advantage per row."""
    gen = torch.Generator().manual_seed(seed)
    rows, width_p, width_r = len(prompt_lens), max(prompt_lens), max(response_lens)
    p_mask = (torch.arange(width_p) >= width_p - torch.tensor(prompt_lens)[:, None]).long()
    r_mask = (torch.arange(width_r) < torch.tensor(response_lens)[:, None]).long()
    prompts = torch.randint(3, 24, (rows, width_p), generator=gen) * p_mask
    responses = torch.randint(3, 24, (rows, width_r), generator=gen) * r_mask
    attention = torch.cat([p_mask, r_mask], dim=1)
    advantages = torch.randn(rows, 1, generator=gen).expand(rows, width_r) * r_mask
    return DataProto.from_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "response_mask": r_mask,
            "advantages": advantages.contiguous(),
        }
    )


def grouped_batch(groups=((2, 0, 1), (4, 3, 5, 6)), seed=0):
    """``ragged_batch`` where the rows of each group take its first row's prompt (GRPO's samples of one prompt):
    rows 0-2 share row 2's 20 prompt tokens, rows 3-6 row 4's 12; row 7 is alone. Responses stay ragged."""
    batch = ragged_batch(seed=seed)
    width = batch.batch["prompts"].shape[1]
    for source, *members in groups:
        for key in ("prompts", "input_ids", "attention_mask"):
            batch.batch[key][members, :width] = batch.batch[key][source, :width].clone()
    batch.batch["position_ids"] = (batch.batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return batch


def tiny_critic(seed=0):
    """The value-model twin of ``support.tiny_model``: a Qwen2 token classifier with one output, float32."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=24,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        num_labels=1,
        classifier_dropout=0.0,
    )
    return Qwen2ForTokenClassification(config).float()


def dynamic_update_rank(rank, world, port, out_dir):
    """dp=``world`` FSDP2: the actor's packed token-budget log-probs and update, then the reference worker's
    log-probs; each rank holds its contiguous share of the rows and saves what it computed."""
    from support import tiny_model
    from torch.distributed.device_mesh import init_device_mesh

    from hybridflow.configs.schema import ActorConfig, PPOConfig
    from hybridflow.core.parallel_dims import ParallelDims
    from hybridflow.workers.actor.ppo_actor import PPOActor
    from hybridflow.workers.fsdp import full_parameters, shard_model
    from hybridflow.workers.reference import RefWorker

    env = dict(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    os.environ.update(env)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        setup = torch.load(os.path.join(out_dir, "setup.pt"), weights_only=False)
        data, budget = setup["data"], setup["budget"]
        shard = data.chunk(world)[rank]
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        model = shard_model(tiny_model(), mesh)
        config = ActorConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=budget, entropy_coeff=0.01)
        actor = PPOActor(
            model,
            torch.optim.SGD(model.parameters(), lr=0.5),
            config,
            loss_agg_mode="token-mean",
            rows_per_mini_batch=len(shard),
            dp_group=mesh.get_group(),
        )
        report = {"micro_batches": len(actor.update_batching.split(shard, mesh.get_group())[0])}
        report["old_log_probs"] = actor.compute_log_prob(shard, temperature=1.0).batch["old_log_probs"]
        report["metrics"] = actor.update_policy(shard, temperature=1.0)
        report["params"] = full_parameters(model)

        ppo = PPOConfig()
        ppo.trainer.n_gpus_per_node = world
        ppo.actor_rollout_ref.actor.use_dynamic_bsz = True
        ppo.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu = budget
        ppo.actor_rollout_ref.rollout.temperature = 0.8
        ref = RefWorker(ppo, ParallelDims.from_config(ppo))
        ref.init_model()
        report["ref_log_probs"] = ref.compute_ref_log_prob(shard).batch["ref_log_probs"]
        torch.save(report, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears down its connections while another still uses them
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (see support.fsdp_update_rank)
