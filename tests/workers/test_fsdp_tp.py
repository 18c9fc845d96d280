"""FSDP2 over dp 2 x tensor parallel 2 (4 gloo ranks) computes what the unsharded model computes.

Forward logits of an untied uneven-vocab Qwen2 and of tiny-llama equal the
unsharded model's; on tiny-qwen2 (tied embeddings) ``compute_log_prob``
equals the single-process log-probs and one PPO update, with gradient clipping
active, gives the parameters, gradient norm and parameter norm of the dp=1
update.
"""

import copy

import pytest
import torch
import torch.multiprocessing as mp
from reshard_ranks import build_model, tp_update_rank
from support import rollout_batch

from hybridflow.configs.schema import ActorConfig, OptimConfig
from hybridflow.core.worker import free_ports
from hybridflow.workers.actor.ppo_actor import PPOActor


def test_heads_must_divide_over_tp():
    from hybridflow.workers.fsdp import _check_heads

    model = build_model("builtin:tiny-qwen2")  # 4 heads, 2 KV heads
    _check_heads(model, 2)
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        _check_heads(model, 4)


@pytest.mark.slow
def test_dp2_tp2_forward_log_probs_and_ppo_update_equal_dp1(tmp_path):
    data = rollout_batch(rows=8)
    base = build_model("builtin:tiny-qwen2")
    single = copy.deepcopy(base)
    config = ActorConfig(ppo_micro_batch_size_per_gpu=8, optim=OptimConfig(grad_clip=0.05))
    reference = PPOActor(
        single,
        torch.optim.SGD(single.parameters(), lr=0.5),
        config,
        loss_agg_mode="token-mean",
        rows_per_mini_batch=8,
    )
    data.union(reference.compute_log_prob(data, temperature=1.0))
    torch.save(data, tmp_path / "data.pt")
    expected_metrics = reference.update_policy(data, temperature=1.0)
    assert expected_metrics["actor/grad_norm"] > 0.05 * 2  # the clip really scales the gradient

    mp.start_processes(tp_update_rank, args=(4, free_ports(1)[0], str(tmp_path)), nprocs=4, start_method="spawn")
    reports = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(4)]

    for report in reports:
        assert report["uneven-qwen2", "logits_diff"] < 1e-5
        assert report["builtin:tiny-llama", "logits_diff"] < 1e-5
        assert report["tied_before"] and report["tied_after"]
        half = data.chunk(2)[report["dp_rank"]].batch["old_log_probs"]
        assert torch.allclose(report["old_log_probs"], half, atol=1e-5)
        for key in ("actor/grad_norm", "actor/param_norm"):
            assert report["metrics"][key] == pytest.approx(expected_metrics[key], rel=1e-5), key
    before = dict(base.named_parameters())
    changed = set()
    for name, param in single.named_parameters():
        assert torch.allclose(reports[0]["params"][name], param, atol=1e-6), name
        if not torch.equal(param, before[name]):
            changed.add(name)
    assert "model.embed_tokens.weight" in changed and len(changed) == len(before)
