"""What the policy's weights look like from outside the actor: the rollout, the weight transfer, an export.

A plain model's are its parameters. A model with LoRA adapters
(``workers/lora.py``) shows the plain model's names and shapes, each adapted
weight merged (``W + s * B @ A``), the adapters themselves not at all: the
rollout engine, vLLM and a saved HF directory see an ordinary model.

:func:`policy_weights` picks the view; the actor asks it for

* ``sharded()``: ``(name, tensor)`` in the training layout, the sources of the
  in-memory reshard (``core/reshard.py``), which keeps them by reference. For
  LoRA these are merged shards held beside the parameters (one more copy of
  the adapted weights' shards), made on the first call and refreshed by every
  call (collective), so call it before each run of the plan;
* ``full()``: ``(name, full tensor)`` one at a time (collective: every rank
  iterates to the end), for vLLM, the split placement's broadcast and exports;
* ``named()``: ``(name, parameter)`` with the outside's names and full shapes
  (the weight transfer's manifest).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from hybridflow.core import dtensor
from hybridflow.workers import lora
from hybridflow.workers.fsdp import sharded_parameters
from hybridflow.workers.rollout.vllm_engine import iter_full_weights


class PlainWeights:
    """A model without adapters: its parameters as they are."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def sharded(self) -> list[tuple[str, torch.Tensor]]:
        """The sharded parameters (``workers/fsdp.py``); they are the live ones, so nothing to refresh."""
        return sharded_parameters(self.model)

    def refresh(self) -> None:
        """Nothing: :meth:`sharded` is the parameters themselves."""

    def full(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every parameter gathered, one at a time (collective)."""
        return iter_full_weights(self.model)

    def named(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``named_parameters``."""
        return self.model.named_parameters()


class MergedLoraWeights:
    """A model with LoRA adapters, seen as the plain model with every adapted weight merged."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.layers = {f"{name}.base_layer.weight": layer for name, layer in lora.adapter_layers(model).items()}
        self._merged: list[tuple[torch.Tensor, torch.Tensor, object]] = []  # (buffer, W, layer)
        self._shards: list[tuple[str, torch.Tensor]] | None = None

    def named(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The base parameters under the model's own names (the adapters left out)."""
        for name, param in self.model.named_parameters():
            if not lora.is_adapter_parameter(name):
                yield lora.model_name(name), param

    def sharded(self) -> list[tuple[str, torch.Tensor]]:
        """Base shards as they are, and for each adapted weight a merged shard of the same layout, refreshed (made
        on the first call; later calls refresh the same tensors, which a reshard plan made once reads)."""
        if self._shards is not None:
            self.refresh()
            return self._shards
        out = []
        for name, param in sharded_parameters(self.model):
            if lora.is_adapter_parameter(name):
                continue
            layer = self.layers.get(name)
            if layer is not None:
                _check_rows_align(name, param, layer.lora_B[lora.ADAPTER].weight)
                buffer = _empty_like(param)
                self._merged.append((buffer, param, layer))
                param = buffer
            out.append((lora.model_name(name), param))
        self._shards = out
        self.refresh()
        return out

    @torch.no_grad()
    def refresh(self) -> None:
        """Write ``W + s * B @ A`` into each merged shard (collective: ``A`` is gathered whole, it is small;
        each rank's rows of ``B`` and ``W`` are the same rows, both sharded along the output dim)."""
        for buffer, weight, layer in self._merged:
            lora_a = dtensor.full(layer.lora_A[lora.ADAPTER].weight)
            lora_b = dtensor.local(layer.lora_B[lora.ADAPTER].weight)
            dtensor.local(buffer).copy_(lora.merged(dtensor.local(weight), lora_a, lora_b, lora.scaling(layer)))

    def full(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight gathered, adapted ones merged, one at a time (collective, the same order on every rank)."""
        for name, param in self.model.named_parameters():
            if lora.is_adapter_parameter(name):
                continue
            with torch.no_grad():
                full = dtensor.full(param)
                layer = self.layers.get(name)
                if layer is not None:
                    full = lora.merged(
                        full,
                        dtensor.full(layer.lora_A[lora.ADAPTER].weight),
                        dtensor.full(layer.lora_B[lora.ADAPTER].weight),
                        lora.scaling(layer),
                    )
            yield lora.model_name(name), full
            del full


def policy_weights(model: nn.Module) -> PlainWeights | MergedLoraWeights:
    """The view of ``model``'s weights the outside gets (see the module docstring)."""
    return MergedLoraWeights(model) if lora.has_adapters(model) else PlainWeights(model)


def _empty_like(param: torch.Tensor) -> torch.Tensor:
    if not isinstance(param, DTensor):
        return torch.empty_like(param.detach())
    local = torch.empty_like(param.to_local())
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )


def _check_rows_align(name: str, weight: torch.Tensor, lora_b: torch.Tensor) -> None:
    """This rank's rows of ``W`` and of ``B`` must be the same output rows for the local merge."""
    if isinstance(weight, DTensor) != isinstance(lora_b, DTensor):
        raise ValueError(f"{name}: the weight and its LoRA B are not sharded alike")
    if not isinstance(weight, DTensor):
        return
    rows = [compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements) for t in (weight, lora_b)]
    if (rows[0][0][0], rows[0][1][0]) != (rows[1][0][0], rows[1][1][0]):
        raise ValueError(
            f"{name}: this rank holds rows {rows[0][1][0]}+{rows[0][0][0]} of the weight but "
            f"{rows[1][1][0]}+{rows[1][0][0]} of its LoRA B (LoRA needs both sharded by output rows, "
            "as FSDP2 does; training tensor parallelism is not supported with LoRA)"
        )
