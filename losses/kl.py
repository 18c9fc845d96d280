"""KL estimators between the policy and the reference, per token.

With d = log pi(a) - log pi_ref(a) at each sampled token (Schulman, "Approximating
KL divergence", 2020)::

    k1 / kl          d                                   unbiased, high variance
    abs              |d|
    k2 / mse         d^2 / 2                             low variance, biased
    k3 / low_var_kl  exp(-d) - 1 + d, clamped to [-10, 10]   unbiased, non-negative

``d`` is clamped to [-20, 20] before the exponential in k3 so a rare huge
log-ratio cannot overflow.

As a *loss*, k1 and k3 have the right expected value but not the right
expected gradient (the gradient of k1 is zero in expectation under pi); k2's
gradient is the KL's. A ``+`` after any name (veRL's ``kl_penalty``: it strips
the ``+``, computes the base estimator, and swaps its gradient for k2's
straight through) keeps the value of the base estimator and takes the
gradient of d^2 / 2::

    k1+ / kl+, abs+, k3+ / low_var_kl+    value of k1 / abs / k3,  gradient of d^2 / 2
    k2+ / mse+                            k2 itself
"""

from __future__ import annotations

import torch

_BASE = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
KL_PENALTIES = (*_BASE, *(f"{name}+" for name in _BASE))


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of ``kind`` (one of :data:`KL_PENALTIES`), same shape as the inputs."""
    diff = log_probs - ref_log_probs
    if kind in ("k1", "kl"):
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("k2", "mse", "k2+", "mse+"):
        return 0.5 * diff.square()
    if kind in ("k3", "low_var_kl"):
        neg = torch.clamp(-diff, min=-20, max=20)
        return torch.clamp(torch.exp(neg) - neg - 1, min=-10, max=10)
    if kind.endswith("+") and kind[:-1] in _BASE:
        value = kl_penalty(log_probs, ref_log_probs, kind[:-1])
        k2 = 0.5 * diff.square()
        return k2 - k2.detach() + value.detach()  # value of the base estimator, gradient of k2
    raise ValueError(f"unknown kl penalty {kind!r}; allowed: {', '.join(KL_PENALTIES)}")
