"""Ranks of ``test_critic_fsdp.py`` (a module of their own: spawned processes import it by name)."""

import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from hybridflow.workers.critic.ppo_critic import response_values
from hybridflow.workers.critic.worker import load_value_model
from hybridflow.workers.packing import probe_packing


def value_loss(model, data, packing):
    """Values of the padded and of the packed forward, weighted by the batch's ``weights``, summed."""
    weights = data.batch["weights"]
    return sum((response_values(model, data, packing=p) * weights).sum() for p in (None, packing))


def critic_gradient_rank(rank, world, port, config, out_dir):
    """One gloo rank: the critic loaded and sharded as its worker does, one forward and backward on this
    rank's half of the batch; writes the warnings it saw (every rank) and the full gradients (rank 0)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        data = torch.load(os.path.join(out_dir, "data.pt"), weights_only=False).chunk(world)[rank]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = load_value_model(config, mesh, "cpu")
            value_loss(model, data, probe_packing(model)).backward()
        grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
        torch.save([str(w.message) for w in caught], os.path.join(out_dir, f"warnings{rank}.pt"))
        if rank == 0:
            torch.save(grads, os.path.join(out_dir, "grads.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as support.fsdp_update_rank: skip a teardown that sometimes aborts after the work is saved
