"""build_optimizer: AdamW's three kernels make the same update."""

import pytest
import torch

from hybridflow.configs.schema import OptimConfig
from hybridflow.workers.optim import build_optimizer


def three_steps(implementation: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer, scheduler = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1, implementation=implementation))
    inputs = torch.randn(32, 8)
    for _ in range(3):
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()
        scheduler.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("implementation", ["fused", "foreach"])
def test_kernels_match_the_loop(implementation):
    loop, other = three_steps("for_loop"), three_steps(implementation)
    for name, value in loop.items():
        torch.testing.assert_close(other[name], value, atol=1e-6, rtol=1e-5)


def test_the_kernel_is_the_one_asked_for():
    model = torch.nn.Linear(2, 2)
    optimizer, _ = build_optimizer(model, OptimConfig(implementation="fused"))
    assert optimizer.defaults["fused"] is True


def test_an_unknown_kernel_names_the_key():
    assert any("implementation='apex'" in p for p in OptimConfig(implementation="apex").problems())
