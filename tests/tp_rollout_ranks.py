"""The spawned ranks of tests/workers/test_tensor_parallel_rollout.py (a module spawn can import by name).

Every rank runs every case: for each model in ``data.pt`` and each tp size q,
the ranks form a (world/q, q) mesh, build their shard of the rollout model,
load the full weights and decode; each rank saves what it holds and produced
to ``rank{r}.pt`` for the test process to check against the full model.
"""

import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from hybridflow.workers.models import build_char_tokenizer
from hybridflow.workers.rollout import BuiltinEngine, EngineConfig, SamplingParams
from hybridflow.workers.rollout.tensor_parallel import build_tp_rollout_model, load_full_weights


def _tp_groups(world: int, sizes: tuple[int, ...]) -> dict[int, tuple[object, int]]:
    """tp size -> (this rank's tp group, its rank in it); the tp dim of a (world/q, q) mesh is consecutive ranks."""
    groups = {}
    for q in sizes:
        if q == 1:
            groups[q] = (None, 0)  # no process group at all: the plain model
            continue
        mesh = init_device_mesh("cpu", (world // q, q), mesh_dim_names=("dp", "tp"))
        groups[q] = (mesh.get_group("tp"), mesh.get_local_rank("tp"))
    return groups


def _run_case(case: dict, prompts, tp_group, tp_rank: int, q: int) -> dict:
    model = build_tp_rollout_model(case["config"], tp_group, tp_rank, q, dtype=torch.float32, device="cpu")
    load_full_weights(model, case["weights"], tp_rank, q)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    held = {
        "tp_rank": tp_rank,
        "params": {name: p.detach().clone() for name, p in model.named_parameters()},
        "buffers": {name: b.clone() for name, b in model.named_buffers()},
        "tied": head.weight is embed.weight,
    }
    tokenizer = build_char_tokenizer()
    engine = BuiltinEngine(model, tokenizer, EngineConfig(eos_token_ids=(case["eos"],), compact_fraction=0.0))
    greedy = engine.generate(prompts, sampling=SamplingParams(max_new_tokens=case["steps"]), greedy=True)
    sampler = BuiltinEngine(model, tokenizer, EngineConfig(eos_token_ids=case["sample_eos"], compact_fraction=0.0))
    sampled = sampler.generate(
        prompts, n=3, sampling=SamplingParams(temperature=1.0, top_k=8, max_new_tokens=case["steps"]), seed=11
    )
    # The reshard writes new weights into the same parameters; the engine must decode with them.
    before = [(id(p), p.data_ptr()) for p in model.parameters()]
    load_full_weights(model, case["weights_b"], tp_rank, q)
    held["same_param_objects"] = before == [(id(p), p.data_ptr()) for p in model.parameters()]
    greedy_b = engine.generate(prompts, sampling=SamplingParams(max_new_tokens=case["steps"]), greedy=True)
    keys = ("responses", "rollout_log_probs", "response_mask")
    return held | {
        "greedy": {k: greedy.batch[k] for k in keys},
        "sampled": {k: sampled.batch[k] for k in keys},
        "greedy_b": {k: greedy_b.batch[k] for k in keys},
    }


def tp_rollout_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank: every case of ``data.pt`` at every tp size; results saved to ``rank{rank}.pt``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # A rank that fails leaves the others waiting in a collective: time them out, not the test run.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    code = 0
    try:
        data = torch.load(os.path.join(out_dir, "data.pt"), weights_only=False)
        groups = _tp_groups(world, data["tp_sizes"])
        results = {}
        for name, case in data["cases"].items():
            for q, (group, tp_rank) in groups.items():
                results[name, q] = _run_case(case, data["prompts"], group, tp_rank, q)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears down its connections while another still uses them
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        dist.destroy_process_group()
    # Skip interpreter teardown (see support.fsdp_update_rank: a gloo thread can abort it).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
