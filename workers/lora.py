"""LoRA adapters on the policy, through peft: only the adapters train, the rollout gets merged weights.

``actor_rollout_ref.model.lora_rank > 0`` puts peft's LoRA layers into the
HF model in place (``peft.inject_adapter_in_model``: the model keeps its
class, so FSDP2 wraps its decoder layers as it does without LoRA). Each
targeted linear layer ``W`` gets two small matrices, ``A`` (``r x in``) and
``B`` (``out x r``, zero at the start), and computes::

    y = W x + s * B (A x),      s = lora_alpha / r

Only ``A`` and ``B`` require grad, so the optimizer holds them alone; ``W``
and everything else stay as loaded, bit for bit. The names peft gives
(``...q_proj.base_layer.weight``, ``...q_proj.lora_A.default.weight``) are
mapped back to the model's own (``...q_proj.weight``) wherever weights leave
the actor (:mod:`hybridflow.workers.policy_weights`), and what leaves is the
merged weight ``W + s * B @ A``.

The reference policy is the same model with the adapters switched off
(:func:`adapters_disabled`): the initial policy, with no second copy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

ADAPTER = "default"
"""peft's name for the one adapter the policy has."""

ADAPTER_CONFIG = "adapter_config.json"
"""The file peft's ``LoraConfig.save_pretrained`` writes (and a checkpoint's ``actor/huggingface`` holds)."""

_PEFT_PARTS = (f".lora_A.{ADAPTER}.", f".lora_B.{ADAPTER}.")


def lora_config(model_cfg: Any, *, never: tuple[str, ...] = ()) -> Any:
    """peft's ``LoraConfig`` for ``model_cfg`` (an ``actor_rollout_ref.model`` or ``critic`` section with
    ``lora_rank > 0``); ``lora_adapter_path``'s own config when it names an adapter to start from. ``never``:
    module names that get no adapter whatever the targets say (the critic's value head); only with a list of
    ``exclude_modules`` or none (a regular expression is taken as given)."""
    from peft import LoraConfig  # noqa: PLC0415 - peft only when LoRA is on

    if getattr(model_cfg, "lora_adapter_path", None):
        return LoraConfig.from_pretrained(model_cfg.lora_adapter_path)
    targets = model_cfg.target_modules
    exclude = model_cfg.exclude_modules
    if not isinstance(exclude, str):
        exclude = [*(exclude or ()), *never] or None
    return LoraConfig(
        r=int(model_cfg.lora_rank),
        lora_alpha=float(model_cfg.lora_alpha),
        lora_dropout=0.0,
        bias="none",
        target_modules=targets if isinstance(targets, str) else list(targets),
        exclude_modules=exclude,
    )


def add_adapters(
    model: nn.Module,
    config: Any,
    *,
    seed: int | None = None,
    adapter_path: str | None = None,
    trainable: tuple[str, ...] = (),
    frozen_dtype: torch.dtype | None = None,
) -> nn.Module:
    """Put LoRA layers into ``model`` in place (``config``: :func:`lora_config`) and freeze everything else but
    the parameters under the top-level modules named in ``trainable`` (the critic's fresh value head).
    ``frozen_dtype``: the dtype the frozen parameters are then held in (the role's compute dtype: no optimizer
    updates them, so they need no fp32 master copy); the trainable ones keep the dtype they were read in.

    On a real model the adapters are initialised as peft does (``A`` random from ``seed``, ``B`` zero), or
    read from ``adapter_path`` (a peft adapter directory); on a meta-device skeleton they are only shaped.
    :returns: ``model``.
    :raises ValueError: when no module of the model matches ``target_modules`` (peft's message).
    """
    from peft import inject_adapter_in_model, set_peft_model_state_dict  # noqa: PLC0415

    with torch.random.fork_rng(devices=[]):  # the same A on every run of one seed, the caller's RNG untouched
        if seed is not None:
            torch.manual_seed(seed)
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_parameter(name) or name.split(".")[0] in trainable)
        if frozen_dtype is not None and not param.requires_grad and param.is_floating_point():
            param.data = param.data.to(frozen_dtype)  # in place: a tied weight stays one tensor
    if adapter_path is not None and next(model.parameters()).device.type != "meta":
        result = set_peft_model_state_dict(model, read_adapter_weights(adapter_path), adapter_name=ADAPTER)
        missing = [k for k in result.missing_keys if is_adapter_parameter(k)]
        if missing:
            raise ValueError(f"the adapter at {adapter_path} has no weights for {missing[:3]} (of {len(missing)})")
    return model


def read_adapter_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a peft adapter directory (``adapter_model.safetensors``, else ``adapter_model.bin``)."""
    directory = Path(directory)
    if (directory / "adapter_model.safetensors").exists():
        from safetensors.torch import load_file  # noqa: PLC0415

        return load_file(directory / "adapter_model.safetensors")
    return torch.load(directory / "adapter_model.bin", map_location="cpu", weights_only=True)


def is_adapter_parameter(name: str) -> bool:
    """Whether ``name`` (as ``named_parameters`` gives it) is a LoRA matrix."""
    return any(part in name for part in _PEFT_PARTS)


def model_name(name: str) -> str:
    """The model's own name for a base parameter peft moved (``q_proj.base_layer.weight`` -> ``q_proj.weight``)."""
    return name.replace(".base_layer.", ".")


def adapter_layers(model: nn.Module) -> dict[str, Any]:
    """``{module name: peft LoRA layer}`` of every layer holding the policy's adapter."""
    from peft.tuners.lora import LoraLayer  # noqa: PLC0415

    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A
    }


def has_adapters(model: nn.Module) -> bool:
    """Whether LoRA layers were put into ``model`` (peft is imported only if its name shows one)."""
    return any(is_adapter_parameter(name) for name, _ in model.named_parameters())


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Within the block ``model`` computes as its base weights alone (the reference policy)."""
    layers = list(adapter_layers(model).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def scaling(layer: Any) -> float:
    """``s`` of the module docstring for one LoRA layer (``lora_alpha / r``; ``/ sqrt(r)`` with rsLoRA)."""
    return float(layer.scaling[ADAPTER])


def merged(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, s: float) -> torch.Tensor:
    """``W + s * B @ A`` in ``W``'s dtype (the product in fp32 or better)."""
    dtype = torch.promote_types(weight.dtype, torch.float32)
    return (weight.to(dtype) + s * (lora_b.to(dtype) @ lora_a.to(dtype))).to(weight.dtype)


# ---------------------------------------------------------------- full state dicts (checkpoints, export)
def merge_state(state: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A full state dict of a model with adapters as the plain model's: every adapted weight merged, the
    adapters dropped, peft's names mapped back. ``config``: the adapter's ``adapter_config.json``."""
    s = adapter_scaling(config)
    out = {}
    for name, tensor in state.items():
        if is_adapter_parameter(name):
            continue
        prefix = name.removesuffix(".base_layer.weight")
        if prefix != name and f"{prefix}.lora_A.{ADAPTER}.weight" in state:
            tensor = merged(
                tensor, state[f"{prefix}.lora_A.{ADAPTER}.weight"], state[f"{prefix}.lora_B.{ADAPTER}.weight"], s
            )
        out[model_name(name)] = tensor
    return out


def adapter_scaling(config: Mapping[str, Any]) -> float:
    """``s`` from an ``adapter_config.json``'s ``r``, ``lora_alpha`` and ``use_rslora``."""
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    return alpha / (r**0.5 if config.get("use_rslora") else r)


def adapter_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a full state dict under the names a peft adapter directory uses
    (``base_model.model.<module>.lora_A.weight``), for ``PeftModel.from_pretrained``."""
    return {
        "base_model.model." + name.replace(f".{ADAPTER}.", "."): tensor
        for name, tensor in state.items()
        if is_adapter_parameter(name)
    }


def save_adapter(
    directory: str | Path, state: Mapping[str, torch.Tensor], config: Mapping[str, Any], base_model: str | None = None
) -> Path:
    """Write a peft adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) from a full
    state dict; ``base_model``: recorded as ``base_model_name_or_path``. Returns ``directory``."""
    from safetensors.torch import save_file  # noqa: PLC0415

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().cpu() for name, t in adapter_state(state).items()}
    save_file(tensors, directory / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {**config, "base_model_name_or_path": base_model}
    (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory


def config_dict(config: Any) -> dict[str, Any]:
    """A ``LoraConfig`` as the JSON ``save_pretrained`` writes (sets become sorted lists)."""
    out = config.to_dict()
    return {key: sorted(value) if isinstance(value, set) else value for key, value in out.items()}
