"""The Bradley-Terry pairwise loss of a reward model, and its pairwise accuracy.

A reward model gives each text one score r. Bradley-Terry models the chance
that the chosen response of a pair is preferred as ``sigmoid(r_chosen - r_rejected)``;
training maximizes that likelihood. Per pair, with an optional margin m::

    loss     = -log sigmoid(r_chosen - r_rejected - m)
    accuracy = 1 if r_chosen > r_rejected else 0

m = 0 is the plain likelihood. A margin m > 0 (Llama 2's reward models,
Touvron et al. 2023, arXiv:2307.09288, give larger margins to pairs rated
further apart) keeps pushing until the chosen score leads by more than m. Only
score differences enter, so any constant can be added to every score. A tie
counts as wrong in the accuracy: a model that scores both alike did not rank
them. The loss goes through ``logsigmoid``, finite for any difference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: float | torch.Tensor = 0.0
) -> torch.Tensor:
    """Per-pair loss ``-log sigmoid(chosen - rejected - margin)`` (shape of the scores; ``margin``: a number
    or one per pair)."""
    return -F.logsigmoid(chosen - rejected - margin)


def correct_pairs(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Per pair, whether the chosen response scores strictly above the rejected one (bool)."""
    return chosen > rejected


def pairwise_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> float:
    """The share of pairs whose chosen response scores strictly above the rejected one."""
    if chosen.numel() == 0:
        raise ValueError("pairwise accuracy of no pairs")
    return float(correct_pairs(chosen, rejected).float().mean())
