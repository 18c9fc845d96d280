"""The critic under FSDP2 on 2 gloo ranks: no view-tensor warning, and the gradients of one process.

FSDP2 warns when a module it wraps returns a view (an in-place op on it would skip the pre-backward
hook). The critic's head was HF's biased ``nn.Linear``, whose (B, T, 1) output over a (B, T, H) input is a
view of one ``addmm``; ``workers/critic/worker.py``'s ``ValueHead`` computes it without one.
"""

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from support import rollout_batch
from torch import nn

from hybridflow.configs.schema import PPOConfig
from hybridflow.core.worker import free_ports
from hybridflow.workers.critic.worker import ValueHead, build_value_model
from hybridflow.workers.packing import probe_packing

MODEL = "builtin:tiny-qwen2"
WORLD = 2


def test_value_head_output_is_not_a_view_and_equals_the_linear():
    linear = nn.Linear(8, 1)
    head = ValueHead.like(linear)
    hidden = torch.randn(3, 5, 8, requires_grad=True)
    assert linear(hidden)._base is not None  # what FSDP2 warned of
    assert head(hidden)._base is None
    torch.testing.assert_close(head(hidden), linear(hidden))
    assert head.weight is linear.weight and head.bias is linear.bias
    assert list(head.state_dict()) == ["weight", "bias"]


@pytest.mark.slow
def test_sharded_critic_warns_no_view_and_its_gradients_equal_one_process(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # spawned ranks import critic_ranks (sys.path travels)
    from critic_ranks import critic_gradient_rank, value_loss

    cfg = OmegaConf.structured(PPOConfig)
    OmegaConf.update(cfg, "actor_rollout_ref.model.path", MODEL)
    config = OmegaConf.to_object(cfg)
    data = rollout_batch(rows=8)
    data.batch["weights"] = torch.randn(data.batch["response_mask"].shape, generator=torch.Generator().manual_seed(1))
    torch.save(data, tmp_path / "data.pt")

    mp.start_processes(
        critic_gradient_rank, args=(WORLD, free_ports(1)[0], config, str(tmp_path)), nprocs=WORLD, start_method="spawn"
    )

    for rank in range(WORLD):
        seen = torch.load(tmp_path / f"warnings{rank}.pt")
        assert not [m for m in seen if "view tensor" in m], seen
    # the reference: one process, the whole batch, HF's own nn.Linear head holding the same weights
    reference = build_value_model(MODEL, torch.float32, config.trainer.seed)
    plain = nn.Linear(reference.score.in_features, 1)
    plain.load_state_dict(reference.score.state_dict())
    reference.score = plain
    # FSDP2 averages the ranks' gradients; each rank's loss sums over its half of the rows
    (value_loss(reference, data, probe_packing(reference)) / WORLD).backward()
    sharded = torch.load(tmp_path / "grads.pt")
    assert set(sharded) == {name for name, _ in reference.named_parameters()}
    for name, param in reference.named_parameters():
        assert param.grad.abs().sum() > 0, name
        torch.testing.assert_close(sharded[name], param.grad, atol=1e-5, rtol=1e-4, msg=name)
