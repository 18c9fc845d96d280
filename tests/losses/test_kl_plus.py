"""veRL's straight-through KL names (``kl+``, ``abs+``, ``mse+``, ``low_var_kl+`` beside ``k1+``/``k2+``/``k3+``):
the base estimator's value, the gradient of d^2 / 2, against numbers worked out by hand.

veRL's ``kl_penalty`` strips the ``+``, computes the base estimator and, unless the name is ``mse``/``k2``,
returns ``k2 - k2.detach() + base.detach()``; for ``mse+`` that is k2 itself.
"""

import math
import re

import pytest
import torch

from hybridflow.losses import KL_PENALTIES, kl_penalty

# d = log pi - log pi_ref per token: 0.5, -1.0, 2.0
LOG_PROBS = [-0.5, -2.0, 1.0]
REF = [-1.0, -1.0, -1.0]
D = [0.5, -1.0, 2.0]

VALUES = {
    "kl+": D,
    "abs+": [0.5, 1.0, 2.0],
    "mse+": [0.125, 0.5, 2.0],
    "low_var_kl+": [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0, math.exp(-2.0) - 1 + 2.0],
}


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_plus_alias_has_the_base_value_and_the_k2_gradient(kind):
    lp = torch.tensor(LOG_PROBS, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor(REF, dtype=torch.float64, requires_grad=True)
    value = kl_penalty(lp, ref, kind)
    assert value.tolist() == pytest.approx(VALUES[kind], abs=1e-12)
    weights = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)  # a weighted sum: each token's gradient on its own
    grad_lp, grad_ref = torch.autograd.grad((value * weights).sum(), (lp, ref))
    # d/d lp of d^2/2 is d; the reference gets -d
    assert grad_lp.tolist() == pytest.approx([w * d for w, d in zip([1, 2, 3], D)], abs=1e-12)
    assert grad_ref.tolist() == pytest.approx([-w * d for w, d in zip([1, 2, 3], D)], abs=1e-12)


def test_the_aliases_are_the_short_names():
    lp, ref = torch.tensor(LOG_PROBS), torch.tensor(REF)
    for alias, short in (("kl+", "k1+"), ("mse+", "k2+"), ("low_var_kl+", "k3+")):
        assert torch.equal(kl_penalty(lp, ref, alias), kl_penalty(lp, ref, short))


def test_the_base_gradients_differ_so_the_test_above_can_tell():
    """Without the straight-through swap the gradients would be 1 (kl), sign(d) (abs), 1 - exp(-d) (k3)."""
    lp = torch.tensor(LOG_PROBS, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor(REF, dtype=torch.float64)
    for kind, expected in (
        ("kl", [1.0, 1.0, 1.0]),
        ("abs", [1.0, -1.0, 1.0]),
        ("low_var_kl", [1 - math.exp(-d) for d in D]),
    ):
        (grad,) = torch.autograd.grad(kl_penalty(lp, ref, kind).sum(), lp)
        assert grad.tolist() == pytest.approx(expected, abs=1e-12)
        assert grad.tolist() != pytest.approx(D)


def test_every_name_takes_a_plus_and_nothing_else_does():
    assert {"kl+", "abs+", "mse+", "low_var_kl+", "k1+", "k2+", "k3+"} <= set(KL_PENALTIES)
    lp, ref = torch.zeros(2), torch.zeros(2)
    for kind in ("k4+", "full+", "++", "k3++"):
        with pytest.raises(ValueError, match=re.escape(f"unknown kl penalty {kind!r};")):
            kl_penalty(lp, ref, kind)
