"""The spawned ranks of tests/workers/test_loading.py (importable by name).

Each of 4 gloo ranks loads every case of :data:`CHECKPOINT_CASES` and :data:`BUILTIN_CASES` through
``load_sharded_model`` and saves what it holds to ``rank{r}.pt``; the test
process compares with a single-process load. For the checkpoint cases only
rank 0 is given the checkpoint directory: ranks 1-3 get an empty directory,
so a loader that read anything on them (config, weights, tokenizer) would
fail there instead of passing unnoticed.
"""

import os
import sys

import torch
import torch.distributed as dist
from support import local_qwen2_checkpoint
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoConfig, Qwen2ForCausalLM

from hybridflow.workers.critic.worker import build_value_model
from hybridflow.workers.fsdp import full_parameters, shard_model
from hybridflow.workers.loading import load_sharded_model, read_causal_lm
from hybridflow.workers.models import load_model_and_tokenizer

WORLD = 4
BUILTIN_SEED = 7
CHECKPOINT_CASES = {  # name: (checkpoint directory under the test's folder, dtype, mesh)
    "tied-dp": ("tied", torch.float32, "dp"),
    "untied-dp": ("untied", torch.float32, "dp"),
    "untied-dp-tp": ("untied", torch.float32, "dp_tp"),
    "tied-bf16-dp-tp": ("tied", torch.bfloat16, "dp_tp"),
}


def checkpointed_shard(model, mesh):
    """A role's own sharding step: activation checkpointing, then shard_model."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return shard_model(model, mesh)


BUILTIN_CASES = {  # name: (path, reader, dtype, mesh, shard); compared with today's read + shard on every rank
    "tiny-qwen2-dp": ("builtin:tiny-qwen2", read_causal_lm, torch.float32, "dp", shard_model),
    "tiny-llama-dp-tp": ("builtin:tiny-llama", read_causal_lm, torch.float32, "dp_tp", shard_model),
    "tiny-qwen2-bf16-dp-tp": ("builtin:tiny-qwen2", read_causal_lm, torch.bfloat16, "dp_tp", shard_model),
    "critic-dp-tp": ("builtin:tiny-qwen2", build_value_model, torch.float32, "dp_tp", shard_model),
    "checkpointing-dp": ("builtin:tiny-qwen2", read_causal_lm, torch.float32, "dp", checkpointed_shard),
}


def write_checkpoints(root):
    """``root/tied`` and ``root/untied``: small Qwen2 checkpoints (4 heads, 2 KV heads) with a tokenizer;
    ``root/empty``."""
    local_qwen2_checkpoint(os.path.join(root, "tied"), hidden=32, seed=0)
    untied = local_qwen2_checkpoint(os.path.join(root, "untied"), hidden=32, seed=0)
    config = AutoConfig.from_pretrained(untied)
    config.tie_word_embeddings = False
    torch.manual_seed(1)
    Qwen2ForCausalLM(config).save_pretrained(untied)  # same tokenizer, separate LM head weights
    os.makedirs(os.path.join(root, "empty"))


def token_ids(vocab_size):
    """The batch every rank and the reference run forward."""
    return torch.randint(0, vocab_size, (2, 7), generator=torch.Generator().manual_seed(5))


def _what_it_holds(model):
    """Full parameters, buffers, tie, mode and forward logits of a loaded model (collective)."""
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    with torch.no_grad():
        logits = model(input_ids=token_ids(model.config.vocab_size)).logits.float()
    return {
        "params": full_parameters(model),
        "buffers": {name: buf.clone() for name, buf in model.named_buffers()},
        "tied": head.weight is embed.weight,
        "training": model.training,
        "generation_config": model.generation_config.to_dict(),
        "logits": logits,
    }


def _local_shards(model):
    return {name: param.to_local().clone() for name, param in model.named_parameters()}


def _generation(model):
    config = getattr(model, "generation_config", None)  # the critic's head does not generate
    return None if config is None else config.to_dict()


def _checkpointing(model):
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


def _todays_model(path, read, dtype):
    """What every rank builds today: load_model_and_tokenizer's model (the critic: build_value_model)."""
    if read is read_causal_lm:  # spelled out, so that a broken read_causal_lm cannot hide behind itself
        return load_model_and_tokenizer(path, dtype=dtype, seed=BUILTIN_SEED)[0]
    return read(path, dtype, BUILTIN_SEED)


def _same_as_today(path, read, dtype, mesh, shard):
    """This rank's shards, buffers and configs from the loader next to today's path (every rank reads, then shards)."""
    today = shard(_todays_model(path, read, dtype), mesh)
    loaded = load_sharded_model(path, dtype=dtype, seed=BUILTIN_SEED, mesh=mesh, read=read, shard=shard)
    return {
        "today": _local_shards(today),
        "loaded": _local_shards(loaded),
        "today_buffers": dict(today.named_buffers()),
        "loaded_buffers": dict(loaded.named_buffers()),
        "today_config": today.config.to_dict(),
        "loaded_config": loaded.config.to_dict(),
        "today_generation": _generation(today),
        "loaded_generation": _generation(loaded),
        "today_training": today.training,
        "loaded_training": loaded.training,
        "today_checkpointing": _checkpointing(today),
        "loaded_checkpointing": _checkpointing(loaded),
        "classes": {cls.__name__ for cls in type(loaded).__mro__},  # FSDP2 subclasses the model class
    }


def _failed_read(root, mesh):
    """The error each rank raises when rank 0 cannot read its path."""
    path = os.path.join(root, "missing" if dist.get_rank() == 0 else "empty")
    try:
        load_sharded_model(path, dtype=torch.float32, seed=None, mesh=mesh)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def loading_rank(rank, world, port, root):
    """Load every case; save ``{case: what this rank holds}`` to ``root/rank{rank}.pt``.

    An exception ends the rank; ``torch.multiprocessing`` then stops the others and
    raises it, traceback included, in the test process.
    """
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    meshes = {
        "dp": init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)),
        "dp_tp": init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp")),
    }
    report = {}
    for name, (folder, dtype, mesh) in CHECKPOINT_CASES.items():
        path = os.path.join(root, folder if rank == 0 else "empty")
        report[name] = _what_it_holds(load_sharded_model(path, dtype=dtype, seed=None, mesh=meshes[mesh]))
        report[name]["path"] = path
    for name, (path, read, dtype, mesh, shard) in BUILTIN_CASES.items():
        report[name] = _same_as_today(path, read, dtype, meshes[mesh], shard)
    report["failed-read"] = _failed_read(root, meshes["dp"])
    torch.save(report, os.path.join(root, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    # Skip interpreter teardown (see support.fsdp_update_rank).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
