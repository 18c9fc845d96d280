"""The spawned ranks of tests/workers/test_vllm_adapter.py (importable by name).

Each rank shards the same tiny model with FSDP2, drains
``iter_full_weights`` with ``DTensor.full_tensor`` instrumented and records
what it saw (names, equality with the unsharded weights, the bytes of earlier
gathered tensors still alive at each gather) to ``rank{r}.json``; the test
process asserts on those numbers.
"""

import copy
import json
import os
import sys
import weakref

import torch
import torch.distributed as dist
from support import tiny_model
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from hybridflow.workers.fsdp import full_parameters, shard_model
from hybridflow.workers.rollout.vllm_engine import iter_full_weights


def _gathers(drain):
    """Run ``drain()`` with ``DTensor.full_tensor`` instrumented; returns, per gather, the bytes of
    earlier gathered tensors still alive when it started, and the bytes it gathered."""
    live, alive_before, sizes = [], [], []
    original = DTensor.full_tensor

    def tracking(self, *args, **kwargs):
        alive_before.append(sum(size for ref, size in live if ref() is not None))
        full = original(self, *args, **kwargs)
        sizes.append(full.numel() * full.element_size())
        live.append((weakref.ref(full), sizes[-1]))
        return full

    DTensor.full_tensor = tracking
    try:
        drain()
    finally:
        DTensor.full_tensor = original
    return alive_before, sizes


def full_weights_rank(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        reference = tiny_model()
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        sharded = shard_model(copy.deepcopy(reference), mesh)
        expected = dict(reference.named_parameters())
        sharded_kinds = sorted({type(p).__name__ for p in sharded.parameters()})

        names, equal, plain = [], [], []

        def stream():  # a consumer that keeps nothing
            for name, tensor in iter_full_weights(sharded):
                names.append(name)
                equal.append(bool(torch.equal(tensor, expected[name])))
                plain.append(not isinstance(tensor, DTensor))
                del tensor

        alive_before, sizes = _gathers(stream)
        # Control: gathering everything first keeps every parameter alive, and the tracking sees it.
        control_before, control_sizes = _gathers(lambda: full_parameters(sharded))
        result = {
            "names": names,
            "expected_names": list(expected),
            "sharded_kinds": sharded_kinds,
            "all_equal": all(equal),
            "all_plain": all(plain),
            "gathers": len(sizes),
            "alive_before_gather": alive_before,
            "peak_bytes": max(b + s for b, s in zip(alive_before, sizes)),
            "control_peak_bytes": max(b + s for b, s in zip(control_before, control_sizes)),
        }
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()  # no rank tears down its connections while another still uses them
    finally:
        dist.destroy_process_group()
    # Skip interpreter teardown (see support.fsdp_update_rank).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
