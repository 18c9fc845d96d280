"""The update loop of every trained model: the actor's, the critic's and the reward model trainer's.

:func:`update_epochs` makes the optimizer steps of one update: epochs over this rank's rows, one step per
mini-batch (:func:`optimizer_step`), the mini-batch's loss given by its owner for each micro-batch.
Gradients accumulate over micro-batches; the loss function returns each
micro-batch's *share* of the global mini-batch loss, so accumulation sums to
the global mean. ``loss_scale`` (the dp size under FSDP, which averages over
ranks) turns that average back into the sum. A non-finite gradient norm skips
the step and is counted.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from hybridflow.core import DataProto
from hybridflow.core.memory import trim_heap
from hybridflow.workers.fsdp import reshard

logger = logging.getLogger(__name__)

MicroLoss = Callable[[DataProto], "tuple[torch.Tensor, dict[str, float]]"]


def _by_mesh(tensors) -> dict:
    """Tensors grouped by DTensor mesh (None: plain tensors). Under FSDP2 with tensor parallelism the
    parameters live on two meshes (split weights on ``(dp, tp)``, norms on ``dp``) and DTensor ops
    refuse to mix meshes, so each group is handled on its own."""
    groups: dict = defaultdict(list)
    for tensor in tensors:
        groups[getattr(tensor, "device_mesh", None)].append(tensor)
    return groups


def total_norm(tensors) -> torch.Tensor:
    """The L2 norm of all ``tensors`` together (float64 scalar; collective when some are DTensors)."""
    squares = torch.zeros((), dtype=torch.float64)
    for mesh, group in _by_mesh(tensors).items():
        norm = torch.nn.utils.get_total_norm(group)
        if mesh is not None:
            norm = norm.full_tensor()
        squares += norm.double().cpu().square()
    return squares.sqrt()


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm (DTensor-aware, any mix of meshes); returns the norm before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = total_norm([p.grad for p in params])
    for group in _by_mesh(params).values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm.float())
    return float(norm)


def global_counts(mask: torch.Tensor, group: dist.ProcessGroup | None) -> tuple[float, float]:
    """Valid tokens, and sequences with at least one valid token, of a mini-batch summed over the dp group.

    A fully masked row is not a sequence of the mean (as in veRL's ``agg_loss``),
    so it does not dilute the ``seq-mean-*`` losses of the others.
    """
    # on the mask's device: an NCCL group reduces CUDA tensors only
    counts = torch.tensor(
        [mask.sum().item(), float((mask.sum(-1) > 0).sum().item())], dtype=torch.float64, device=mask.device
    )
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(counts, group=group)
    return counts[0].item(), counts[1].item()


def parameter_norm(model: nn.Module) -> float:
    """L2 norm of all parameters (under FSDP2 a collective: the shards' norms are combined)."""
    with torch.no_grad():
        return float(total_norm([p.detach() for p in model.parameters()]))


StepLoss = Callable[[int, DataProto], "tuple[MicroLoss, dict[str, float]]"]
"""``(index, mini_batch) -> (micro_loss, diagnostics)``: the loss of the ``index``-th optimizer step's
micro-batches, with the dict it fills with the step's own metrics (summed from the micro-batches' shares)."""


def update_epochs(
    data: DataProto,
    step_loss: StepLoss,
    split: Callable[[DataProto], Sequence[DataProto]],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    rows_per_mini_batch: int,
    epochs: int = 1,
    shuffle: bool = False,
    seed: int = 0,
    grad_clip: float,
    loss_scale: float = 1.0,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    prefix: str = "actor",
    accumulate_unsharded: bool = True,
) -> dict[str, float]:
    """``epochs`` passes over this rank's rows in mini-batches of ``rows_per_mini_batch`` (drawn in a
    ``seed``-ed order with ``shuffle``), one optimizer step each; returns the steps' metrics averaged
    (:func:`mean_metrics`). ``split`` makes a mini-batch's micro-batches (collective when it balances a token
    budget over the dp group).

    :raises ValueError: when the rows are not a whole number of mini-batches (every rank must take as many
        optimizer steps as the others: their gradients are reduced together).
    """
    if len(data) % rows_per_mini_batch:
        raise ValueError(
            f"this rank holds {len(data)} rows, not a multiple of its {rows_per_mini_batch} rows per mini-batch"
        )
    model.train()
    steps = []
    for index, mini in enumerate(data.make_iterator(rows_per_mini_batch, epochs=epochs, shuffle=shuffle, seed=seed)):
        micro_loss, diagnostics = step_loss(index, mini)
        step = optimizer_step(
            split(mini),
            micro_loss,
            model,
            optimizer,
            grad_clip=grad_clip,
            loss_scale=loss_scale,
            scheduler=scheduler,
            prefix=prefix,
            accumulate_unsharded=accumulate_unsharded,
        )
        steps.append({**step, **diagnostics})
    return mean_metrics(steps)


def token_counts(response_mask: torch.Tensor, group: dist.ProcessGroup | None, norm_len: float | None):
    """The normalizers a PPO loss of one mini-batch divides by: ``(over the dp group, this rank's own)``, each
    ``num_tokens``, ``num_seqs`` (:func:`global_counts`; the rank's at least 1) and the constant ``norm_len``."""
    tokens, seqs = global_counts(response_mask, group)
    local_tokens, local_seqs = global_counts(response_mask, None)
    return (
        {"num_tokens": tokens, "num_seqs": seqs, "norm_len": norm_len},
        {"num_tokens": max(local_tokens, 1.0), "num_seqs": max(local_seqs, 1.0), "norm_len": norm_len},
    )


def optimizer_step(
    micro_batches: Sequence[DataProto],
    micro_loss: MicroLoss,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    grad_clip: float,
    loss_scale: float = 1.0,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    prefix: str = "actor",
    accumulate_unsharded: bool = True,
) -> dict[str, float]:
    """Accumulate ``micro_loss`` over the micro-batches of one mini-batch, clip, step; returns metrics.

    Under FSDP2 the gradients are reduced across ranks once, in the last
    micro-batch's backward (the earlier ones accumulate unsharded gradients
    locally: :func:`gradient_sync`), or with ``accumulate_unsharded=False`` in
    every micro-batch's (``fsdp_config.accumulate_unsharded_grads``). Micro-batch diagnostics are averaged
    weighted by rows; ``grad_norm``, ``optimizer_steps`` (1), ``skipped_steps``
    and ``lr`` are added under ``prefix/``.
    """
    optimizer.zero_grad(set_to_none=True)
    if _on_cpu(model):  # the previous step's freed tensors: without this the heap keeps their pages, step after step
        trim_heap()
    metrics: dict[str, float] = defaultdict(float)
    rows = sum(len(micro) for micro in micro_batches)
    for index, micro in enumerate(micro_batches):
        with gradient_sync(model, last=index == len(micro_batches) - 1 or not accumulate_unsharded):
            loss, micro_metrics = micro_loss(micro)
            (loss * loss_scale).backward()
        for key, value in micro_metrics.items():
            metrics[key] += value * len(micro) / rows
    grad_norm = clip_grad_norm(model, grad_clip)
    reshard(model)  # parameters a no-grad pass left gathered (reshard_after_forward=False) would be stale after it
    if math.isfinite(grad_norm):
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    else:
        logger.warning("%s: non-finite gradient norm %s, skipping this optimizer step", prefix, grad_norm)
    # freed once applied: kept until the next update, a gradient shard of the model's size would sit through every
    # other stage (measured: 0.18 GiB a rank for a ~95M model on 2 ranks, in gen, log-probs and the reference)
    optimizer.zero_grad(set_to_none=True)
    metrics[f"{prefix}/grad_norm"] = grad_norm
    metrics[f"{prefix}/optimizer_steps"] = 1.0
    metrics[f"{prefix}/skipped_steps"] = float(not math.isfinite(grad_norm))
    metrics[f"{prefix}/lr"] = optimizer.param_groups[0]["lr"]
    return dict(metrics)


def _on_cpu(model: nn.Module) -> bool:
    return next(model.parameters()).device.type == "cpu"


@contextmanager
def gradient_sync(model: nn.Module, *, last: bool) -> Iterator[None]:
    """Reduce gradients across ranks only in the backward of a mini-batch's ``last`` micro-batch.

    FSDP2 otherwise reduce-scatters every backward; the earlier micro-batches
    accumulate their gradients unsharded on each rank (one full gradient of
    the model per rank, for one all-reduce-sized exchange per optimizer step
    instead of one per micro-batch). A model without FSDP is left alone.
    """
    if not isinstance(model, FSDPModule):
        yield
        return
    model.set_requires_gradient_sync(last)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def mean_metrics(steps: list[dict[str, float]]) -> dict[str, float]:
    """Average per-step metric dicts key by key (the counts ``optimizer_steps`` and ``skipped_steps`` are summed)."""
    keys = {k for step in steps for k in step}
    out = {}
    for key in keys:
        values = [step[key] for step in steps if key in step]
        out[key] = sum(values) if key.endswith(("optimizer_steps", "skipped_steps")) else sum(values) / len(values)
    return out
