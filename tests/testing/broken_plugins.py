"""Estimators and losses broken on purpose, each in one realistic way, for proving that the contract kit fails on them.

The reward verifiers are in ``broken_verifiers.py``, which stays free of torch.
"""

import torch


def _scores_and_groups(token_level_rewards, index):
    scores = token_level_rewards.sum(dim=-1)
    groups = int(index.max()) + 1
    mean = torch.zeros(groups).index_add_(0, index, scores) / torch.bincount(index, minlength=groups)
    return scores, mean[index]


# --- estimators -----------------------------------------------------------------


def leaky_advantage(token_level_rewards, response_mask, index):
    """Group-centred score broadcast over every position: the mask is forgotten."""
    scores, mean = _scores_and_groups(token_level_rewards, index)
    advantages = (scores - mean).unsqueeze(-1).expand_as(response_mask).clone()
    return advantages, advantages


def first_row_baseline_advantage(token_level_rewards, response_mask, index):
    """Score minus the score of the group's first row by position: depends on the order of the rows."""
    scores = token_level_rewards.sum(dim=-1)
    first = {}
    for row, group in enumerate(index.tolist()):
        first.setdefault(group, float(scores[row]))
    baseline = torch.tensor([first[g] for g in index.tolist()])
    advantages = (scores - baseline).unsqueeze(-1) * response_mask
    return advantages, advantages


def no_baseline_advantage(token_level_rewards, response_mask, index):
    """The raw outcome score, though it declares groups: a group of equal scores still gets its score."""
    advantages = token_level_rewards.sum(dim=-1, keepdim=True) * response_mask
    return advantages, advantages


def std_without_epsilon_advantage(token_level_rewards, response_mask, index):
    """GRPO dividing by the group std with no guard: a group of one divides 0 by 0."""
    scores, mean = _scores_and_groups(token_level_rewards, index)
    groups = int(index.max()) + 1
    count = torch.bincount(index, minlength=groups)
    var = torch.zeros(groups).index_add_(0, index, (scores - mean) ** 2) / (count - 1)
    advantages = ((scores - mean) / var.sqrt()[index]).unsqueeze(-1) * response_mask
    return advantages, advantages


def in_place_advantage(token_level_rewards, response_mask, index):
    """Group-centred scores of the rewards clipped at 0, clipped in place: the caller's rewards change."""
    token_level_rewards.clamp_(min=0.0)
    scores, mean = _scores_and_groups(token_level_rewards, index)
    advantages = (scores - mean).unsqueeze(-1) * response_mask
    return advantages, advantages


# --- policy losses --------------------------------------------------------------


def unmasked_sequence_ratio_loss(old_log_probs, log_probs, advantages, response_mask, *, rollout_is_weights=None):
    """GSPO with the sequence log-ratio averaged over every position, padding included."""
    seq_log_ratio = (log_probs - old_log_probs).mean(dim=-1, keepdim=True)
    token_losses = -advantages * torch.exp(seq_log_ratio)
    return token_losses if rollout_is_weights is None else token_losses * rollout_is_weights, {}


def sign_flipped_loss(old_log_probs, log_probs, advantages, response_mask, *, rollout_is_weights=None):
    """PPO's surrogate with its sign flipped: it makes good responses less likely."""
    token_losses = advantages * torch.exp(log_probs - old_log_probs)
    return token_losses if rollout_is_weights is None else token_losses * rollout_is_weights, {}


def tensor_metrics_loss(old_log_probs, log_probs, advantages, response_mask, *, rollout_is_weights=None):
    """A correct REINFORCE loss whose metric is a tensor, not a float."""
    token_losses = -advantages * log_probs
    return token_losses, {"ppo_kl": (old_log_probs - log_probs).mean()}


def no_weights_loss(old_log_probs, log_probs, advantages, response_mask):
    """A correct REINFORCE loss that does not accept ``rollout_is_weights``."""
    return -advantages * log_probs, {}
