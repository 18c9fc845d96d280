"""The spawned ranks of tests/workers/test_hybrid_engine.py (a module spawn can import by name).

Every rank trains the same policy sharded with FSDP2 over all 4 ranks and
keeps two rollout layouts of it: TP 2 (groups {0,1}, {2,3}) and TP 1 (a full
copy). After each optimizer step both are refreshed in place by their reshard
plans (made once) and decode the same prompts greedily; rank 0 saves the
responses of each weight version with the full weights, for the test to
replay through HF ``generate``.
"""

import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from hybridflow.core.reshard import gather_full_state, plan_reshard
from hybridflow.workers.fsdp import shard_model, sharded_parameters
from hybridflow.workers.models import build_char_tokenizer
from hybridflow.workers.rollout import BuiltinEngine, EngineConfig, SamplingParams
from hybridflow.workers.rollout.tensor_parallel import build_tp_rollout_model
from hybridflow.workers.rollout.tp_plan import rollout_slice


def _rollout(model, config, q: int, eos: int):
    """This rank's TP-q rollout model, its engine and its reshard plan from the FSDP shards."""
    if q > 1:
        mesh = init_device_mesh("cpu", (dist.get_world_size() // q, q), mesh_dim_names=("dp", "tp"))
        group, tp_rank = mesh.get_group("tp"), mesh.get_local_rank("tp")
    else:
        group, tp_rank = None, 0
    rollout = build_tp_rollout_model(config, group, tp_rank, q)
    sources = sharded_parameters(model)
    targets = dict(rollout.named_parameters())
    slices = {name: rollout_slice(name, tuple(p.shape), config, tp_rank, q) for name, p in sources if name in targets}
    engine = BuiltinEngine(rollout, build_char_tokenizer(), EngineConfig(eos_token_ids=(eos,), compact_fraction=0.0))
    return engine, plan_reshard(sources, targets, slices)


def hybrid_engine_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    """Train 3 steps; after each (and before the first) reshard to TP 2 and TP 1 and decode greedily."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    code = 0
    try:
        data = torch.load(os.path.join(out_dir, "data.pt"), weights_only=False)
        model = data["model"]
        model.train()
        shard_model(model, init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=data["lr"])
        layouts = {q: _rollout(model, model.config, q, data["eos"]) for q in (2, 1)}
        sampling = SamplingParams(max_new_tokens=data["steps"])
        seen = []
        for version in range(data["updates"] + 1):
            if version:  # one optimizer step on this rank's quarter of the batch
                ids, targets = data["train_ids"][rank::world], data["train_targets"][rank::world]
                loss = torch.nn.functional.cross_entropy(model(input_ids=ids).logits.transpose(1, 2), targets)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            record = {"version": version}
            for q, (engine, plan) in layouts.items():
                plan.run(bucket_bytes=8192)  # small: several rounds per move
                out = engine.generate(data["prompts"], sampling=sampling, greedy=True)
                record[q] = {k: out.batch[k] for k in ("responses", "rollout_log_probs", "response_mask")}
            full = gather_full_state(sharded_parameters(model))  # collective; the test's oracle
            if rank == 0:
                record["full"] = {k: v.clone() for k, v in full.items()}
            seen.append(record)
        torch.save(seen, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (see support.fsdp_update_rank)
