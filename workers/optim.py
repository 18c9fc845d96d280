"""Optimizer and learning-rate schedule from an ``optim`` config section."""

from __future__ import annotations

import torch
from torch import nn

from hybridflow.configs.schema import OptimConfig
from hybridflow.core import dtensor


def build_optimizer(
    model: nn.Module, config: OptimConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW over the trainable parameters (the kernel ``config.implementation`` names), with linear
    warm-up to ``lr`` then constant."""
    params = [p for p in model.parameters() if p.requires_grad]
    kernel = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for_loop": {"foreach": False}}[
        config.implementation
    ]
    optimizer = torch.optim.AdamW(
        params, lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay, **kernel
    )
    warmup = max(0, config.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
    )
    return optimizer, scheduler


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes this rank's optimizer state holds (AdamW's moments and step counts over its shards)."""
    tensors = (t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor))
    return sum(t.numel() * t.element_size() for t in map(dtensor.local, tensors))
