"""The PPO update under FSDP2 on 2 gloo ranks equals the single-process update.

Real torch.distributed: two processes started with torch.multiprocessing, a
gloo process group, FSDP2 sharding; each rank gets half of the mini-batch and
its micro-batches are smaller than the single process's.
"""

import copy

import pytest
import torch
import torch.multiprocessing as mp
from support import fsdp_update_rank, rollout_batch, tiny_model

from hybridflow.configs.schema import ActorConfig
from hybridflow.core.worker import free_ports
from hybridflow.workers.actor.ppo_actor import PPOActor


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,accumulate_unsharded",
    [("token-mean", True), ("seq-mean-token-mean", True), ("token-mean", False)],
    ids=["token-mean", "seq-mean-token-mean", "reduced-every-micro-batch"],
)
def test_dp2_fsdp_update_equals_dp1(tmp_path, mode, accumulate_unsharded):
    """Two micro-batches a rank: summed unsharded and reduced once, or reduced in each backward
    (``fsdp_config.accumulate_unsharded_grads=false``), the update is the one-process update."""
    data = rollout_batch(rows=8)
    base = tiny_model()
    single = copy.deepcopy(base)
    reference = PPOActor(
        single,
        torch.optim.SGD(single.parameters(), lr=0.5),
        ActorConfig(ppo_micro_batch_size_per_gpu=8),
        loss_agg_mode=mode,
        rows_per_mini_batch=8,
    )
    data.union(reference.compute_log_prob(data, temperature=1.0))
    torch.save(data, tmp_path / "data.pt")
    reference.update_policy(data, temperature=1.0)

    mp.start_processes(
        fsdp_update_rank,
        args=(2, free_ports(1)[0], mode, 2, str(tmp_path), 1, True, accumulate_unsharded),
        nprocs=2,
        start_method="spawn",
    )
    sharded = torch.load(tmp_path / "params.pt")
    before = dict(base.named_parameters())
    changed = False
    for name, param in single.named_parameters():
        assert torch.allclose(sharded[name], param, atol=1e-5), name
        changed |= not torch.equal(param, before[name])
    assert changed


@pytest.mark.slow
def test_parameters_kept_gathered_update_like_dp1_over_two_optimizer_steps(tmp_path):
    """reshard_after_forward=False: the gathered copies live across micro-batches, and the optimizer step
    must not leave them stale (the second mini-batch's forward would then use the old weights)."""
    data = rollout_batch(rows=8)
    base = tiny_model()
    single = copy.deepcopy(base)
    reference = PPOActor(
        single,
        torch.optim.SGD(single.parameters(), lr=0.5),
        ActorConfig(ppo_micro_batch_size_per_gpu=8),
        loss_agg_mode="token-mean",
        rows_per_mini_batch=4,
    )
    data.union(reference.compute_log_prob(data, temperature=1.0))
    torch.save(data, tmp_path / "data.pt")
    # dp rank r holds rows 4r..4r+3 and steps on 2 of them at a time, one row per micro-batch; the single
    # process steps on the same rows: (0, 1, 4, 5), then (2, 3, 6, 7)
    reference.update_policy(data[[0, 1, 4, 5, 2, 3, 6, 7]], temperature=1.0)

    mp.start_processes(
        fsdp_update_rank,
        args=(2, free_ports(1)[0], "token-mean", 1, str(tmp_path), 2, False),
        nprocs=2,
        start_method="spawn",
    )
    sharded = torch.load(tmp_path / "params.pt")
    for name, param in single.named_parameters():
        assert torch.allclose(sharded[name], param, atol=1e-5), name


def test_the_gradients_are_freed_once_applied():
    """Kept until the next update they would sit through every other stage (a shard of the model's size per rank)."""
    data = rollout_batch(rows=8)
    model = tiny_model()
    actor = PPOActor(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        ActorConfig(ppo_micro_batch_size_per_gpu=4),
        loss_agg_mode="token-mean",
        rows_per_mini_batch=8,
    )
    data.union(actor.compute_log_prob(data, temperature=1.0))
    before = [p.detach().clone() for p in model.parameters()]
    actor.update_policy(data, temperature=1.0)
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))  # it did update
    assert all(p.grad is None for p in model.parameters())
