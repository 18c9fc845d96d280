"""The spawned ranks of tests/core/test_reshard.py and tests/workers/test_fsdp_tp.py (importable by name).

Every rank builds the same model from the same seed, shards it (FSDP2 over 4
ranks, or dp 2 x tp 2), runs the checks and saves what it saw to
``rank{r}.pt``; the test process asserts on those numbers.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import Qwen2Config, Qwen2ForCausalLM

from hybridflow.core.reshard import gather_full_state, plan_reshard
from hybridflow.workers.fsdp import data_parallel_group, full_parameters, shard_model, sharded_parameters
from hybridflow.workers.models import load_model_and_tokenizer
from hybridflow.workers.rollout.tp_plan import rollout_slice

SMALL_BUCKET = 4096  # bytes: smaller than every weight matrix of the test models
STEP_BUCKET = 16384  # a third size, after the training step
LARGE_BUCKET = 64 << 20


def build_model(name: str, seed: int = 0):
    """A built-in model, or ``uneven-qwen2``: vocab 30 (uneven over 4 ranks, 8/8/8/6), untied, 4 heads, 2 KV heads."""
    if name != "uneven-qwen2":
        return load_model_and_tokenizer(name, dtype=torch.float32, seed=seed)[0]
    config = Qwen2Config(
        vocab_size=30,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config).float()


def _start(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _exit():
    # Skip interpreter teardown (see support.fsdp_update_rank); reached only when the rank succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _mesh(layout, world):
    if layout == "fsdp":
        return init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    return init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))


def _rollout_targets(full, config, rank, q):
    """NaN-filled rollout tensors of tp rank ``rank % q`` and their slices (a missed element stays NaN)."""
    slices = {name: rollout_slice(name, tuple(t.shape), config, rank % q, q) for name, t in full.items()}
    targets = {name: torch.full(slices[name].shape(tuple(t.shape)), float("nan")) for name, t in full.items()}
    return targets, slices


def _mismatches(targets, slices, full):
    return sorted(name for name, t in targets.items() if not torch.equal(t, slices[name].take(full[name])))


def _train_step(model, vocab):
    ids = torch.randint(0, vocab, (2, 6), generator=torch.Generator().manual_seed(3))
    model(input_ids=ids).logits.float().square().mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.5 * p.grad
    model.zero_grad(set_to_none=True)


def reshard_rank(rank, world, port, layout, models, qs, out_dir):
    """Reshard each model from ``layout`` to rollout TP ``q`` for each q: two buckets, then again after a step."""
    _start(rank, world, port)
    try:
        mesh = _mesh(layout, world)
        report = {}
        for name in models:
            model = build_model(name)
            full = {n: p.detach().clone() for n, p in model.named_parameters()}
            shard_model(model, mesh)
            ids = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
            with torch.no_grad():  # leaves FSDP2's root gathered, as compute_log_prob does
                model(input_ids=ids)
            sources = sharded_parameters(model)
            plans = {}
            for q in qs:
                targets, slices = _rollout_targets(full, model.config, rank, q)
                plans[q] = (plan_reshard(sources, targets, slices), targets, slices)
                for bucket in (SMALL_BUCKET, LARGE_BUCKET):
                    for t in targets.values():
                        t.fill_(float("nan"))
                    stats = plans[q][0].run(bucket)
                    report[name, q, bucket] = {
                        "stats": stats,
                        "wrong": _mismatches(targets, slices, full),
                        "target_bytes": sum(t.nbytes for t in targets.values()),
                    }
            _train_step(model, model.config.vocab_size)
            after = gather_full_state(sources)  # the naive all-gather is the oracle here
            report[name, "changed"] = sorted(n for n in full if not torch.equal(full[n], after[n]))
            report[name, "full_bytes"] = sum(t.nbytes for t in full.values())
            with torch.no_grad():  # the plan reads the sharded parameters even while the root is gathered
                model(input_ids=ids)
            for q, (plan, targets, slices) in plans.items():
                stats = plan.run(STEP_BUCKET)
                report[name, q, "after_step"] = {"stats": stats, "wrong": _mismatches(targets, slices, after)}
        torch.save(report, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears down its connections while another still uses them
    finally:
        dist.destroy_process_group()
    _exit()


def tp_update_rank(rank, world, port, out_dir):
    """dp 2 x tp 2: forward logits of two models, then compute_log_prob and one PPO update of tiny-qwen2 (tied)."""
    from hybridflow.configs.schema import ActorConfig, OptimConfig
    from hybridflow.workers.actor.ppo_actor import PPOActor

    _start(rank, world, port)
    try:
        mesh = _mesh("dp2xtp2", world)
        report = {}
        ids = torch.randint(0, 30, (3, 7), generator=torch.Generator().manual_seed(5))
        for name in ("uneven-qwen2", "builtin:tiny-llama"):
            model = build_model(name)
            with torch.no_grad():
                expected = model(input_ids=ids).logits
                got = shard_model(model, mesh)(input_ids=ids).logits
            report[name, "logits_diff"] = (got - expected).abs().max().item()

        model = build_model("builtin:tiny-qwen2")
        report["tied_before"] = model.lm_head.weight is model.model.embed_tokens.weight
        shard_model(model, mesh)
        report["tied_after"] = model.lm_head.weight is model.model.embed_tokens.weight
        data = torch.load(os.path.join(out_dir, "data.pt"), weights_only=False)
        dp_rank, dp_size = mesh.get_local_rank("dp"), mesh.size(0)
        shard = data.chunk(dp_size)[dp_rank]
        config = ActorConfig(ppo_micro_batch_size_per_gpu=2, optim=OptimConfig(grad_clip=0.05))
        actor = PPOActor(
            model,
            torch.optim.SGD(model.parameters(), lr=0.5),
            config,
            loss_agg_mode="token-mean",
            rows_per_mini_batch=len(shard),
            dp_group=data_parallel_group(mesh),
        )
        report["old_log_probs"] = actor.compute_log_prob(shard, temperature=1.0).batch["old_log_probs"]
        report["dp_rank"] = dp_rank
        report["metrics"] = actor.update_policy(shard, temperature=1.0)
        report["params"] = full_parameters(model)
        torch.save(report, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears down its connections while another still uses them
    finally:
        dist.destroy_process_group()
    _exit()


def reshard_tamper_rank(rank, world, port, out_dir):
    """FSDP over 2 ranks to rollout TP 1 (each rank receives the other's half): rank 1 flips one bit of round 0 as
    it arrives (a test seam), then both run again untouched."""
    from hybridflow.core.weight_transfer import WeightSyncError

    _start(rank, world, port)
    try:
        model = build_model("uneven-qwen2")
        full = {n: p.detach().clone() for n, p in model.named_parameters()}
        shard_model(model, _mesh("fsdp", world))
        targets, slices = _rollout_targets(full, model.config, rank, 1)
        plan = plan_reshard(sharded_parameters(model), targets, slices)
        report = {}

        def flip_a_bit(index, received):
            if index == 0 and received.numel():
                received.view(torch.int32)[0] ^= 1 << 7

        plan.tamper = flip_a_bit if rank == 1 else None
        try:
            stats = plan.run(SMALL_BUCKET)
            report["first"] = {"rounds": stats.rounds, "verify_s": stats.verify_seconds}
        except WeightSyncError as err:
            report["first"] = {"error": str(err), "unwritten": sum(bool(t.isnan().any()) for t in targets.values())}
        plan.tamper = None
        for t in targets.values():
            t.fill_(float("nan"))
        stats = plan.run(SMALL_BUCKET)
        report["second"] = {"rounds": stats.rounds, "wrong": _mismatches(targets, slices, full)}
        torch.save(report, os.path.join(out_dir, f"tamper{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _exit()
