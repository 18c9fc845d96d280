"""The vLLM rollout adapter (``rollout.name=vllm``): one vLLM engine per rank, same output as the built-in engine.

Targets vLLM 0.10.2 to 0.11.x (the V1 engine); GPU only, ``pip install 'hybridflow[vllm]'``.
vLLM is imported lazily, inside :meth:`VLLMRolloutEngine.create` and the calls
that need it, so this module imports (and its helpers are tested) without it.

How it fits the actor-rollout worker (see ``docs/vllm.md`` for the recipe)::

    every rank:   LLM(distributed_executor_backend="external_launcher", tensor_parallel_size=q)
                  (vLLM's SPMD mode: this process *is* one vLLM worker; consecutive
                  ranks [k*q, (k+1)*q) form one vLLM tensor-parallel group)
    after an actor update:
                  wake_up(["weights"]) -> update_weights(iter_full_weights(fsdp_model))
                  -> wake_up(["kv_cache"]) -> generate(...) -> sleep()

Weight sync pushes one full HF-named tensor at a time through the vLLM
model's own ``load_weights`` (it slices the tensor for its tp rank and fuses
q/k/v and gate/up), reached in-process at
``llm.llm_engine.model_executor.driver_worker.worker.model_runner.model``
(in-process because external_launcher runs vLLM with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

The pure helpers (:func:`vllm_weight_name`, :func:`iter_full_weights`,
:func:`vllm_engine_kwargs`, :func:`vllm_sampling_kwargs`,
:func:`unpad_prompts`, :func:`outputs_to_dataproto`) need neither vLLM nor a GPU.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hybridflow.configs.schema import RolloutConfig as RolloutSettings
from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import (
    ATTENTION_MASK,
    INPUT_IDS,
    METRICS,
    POSITION_IDS,
)
from hybridflow.workers.rollout.engine import assemble_rollout, positions_from_mask
from hybridflow.workers.rollout.sampling import SamplingParams

__all__ = [
    "INSTALL_HINT",
    "SLEEP_TAGS",
    "VLLMRolloutEngine",
    "iter_full_weights",
    "outputs_to_dataproto",
    "unpad_prompts",
    "vllm_engine_kwargs",
    "vllm_sampling_kwargs",
    "vllm_unavailable_reasons",
    "vllm_weight_name",
]

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'hybridflow[vllm]'"
SLEEP_TAGS = ("weights", "kv_cache")
"""What vLLM's sleep mode frees and ``wake_up(tags=...)`` restores, in the order the adapter wakes them."""

# Module names that wrappers insert into parameter paths: FSDP1, torch.compile, activation checkpointing.
_WRAPPER_COMPONENTS = frozenset({"_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"})
_MODEL_PATHS = (
    ("llm_engine", "model_executor", "driver_worker", "worker", "model_runner", "model"),
    ("llm_engine", "model_executor", "driver_worker", "model_runner", "model"),
)


# ------------------------------------------------------------------ availability
def vllm_unavailable_reasons(*, has_vllm: bool | None = None, has_cuda: bool | None = None) -> list[str]:
    """Why the vLLM rollout cannot run in this process; empty when it can.

    Called by the config check (before Ray starts) and by
    :meth:`VLLMRolloutEngine.create`. ``has_vllm`` / ``has_cuda`` default to
    probing this machine (vLLM is looked up, not imported).
    """
    if has_vllm is None:
        has_vllm = importlib.util.find_spec("vllm") is not None
    if has_cuda is None:
        has_cuda = torch.cuda.is_available()
    reasons = []
    if not has_vllm:
        reasons.append(f"vllm is not installed ({INSTALL_HINT}; vLLM ships CUDA-only wheels)")
    if not has_cuda:
        reasons.append("no CUDA device is visible; vLLM rollout needs a GPU (on CPU: rollout@actor_rollout_ref.rollout=builtin)")
    return reasons


# ------------------------------------------------------------------ weight names
def vllm_weight_name(hf_name: str, *, tie_word_embeddings: bool = False) -> str | None:
    """The name vLLM's Qwen2 / Llama ``load_weights`` expects for HF parameter ``hf_name``; None: do not send it.

    vLLM's loaders for these families take the HF checkpoint names themselves
    (``model.layers.0.self_attn.q_proj.weight``; they fuse q/k/v and gate/up
    internally), so the only work is undoing what training wrappers add:
    ``_fsdp_wrapped_module.`` (FSDP1), ``_orig_mod.`` (``torch.compile``) and
    ``_checkpoint_wrapped_module.`` (activation checkpointing) are removed
    wherever they appear. FSDP2 (``fully_shard``) adds nothing. Returns None
    for ``lm_head.weight`` when the embeddings are tied (vLLM shares the
    embedding and skips it) and for rotary ``inv_freq`` buffers (vLLM
    computes its own).
    """
    parts = [p for p in hf_name.split(".") if p not in _WRAPPER_COMPONENTS]
    if not parts or not all(parts):
        raise ValueError(f"parameter name {hf_name!r} has no module path once wrapper prefixes are removed")
    name = ".".join(parts)
    if tie_word_embeddings and name == "lm_head.weight":
        return None
    if name.endswith("rotary_emb.inv_freq"):
        return None
    return name


def iter_full_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for each parameter of a (possibly FSDP2-sharded) model, one at a time.

    Collective for a sharded model: every rank of its mesh must iterate to the
    end in the same order. A DTensor parameter is gathered with
    ``full_tensor()`` right before it is yielded and the generator drops its
    own reference before gathering the next, so beyond what the consumer keeps,
    at most one gathered parameter is alive at a time (peak extra memory: the
    largest parameter, not the model). Plain parameters are yielded detached,
    without a copy. Names are the model's own (``named_parameters``; tied
    parameters once); map them with :func:`vllm_weight_name`.
    """
    for name, param in model.named_parameters():
        # no_grad only around the gather: a grad-mode context held across a
        # ``yield`` would leak into the consumer's code.
        with torch.no_grad():
            full = param.full_tensor() if hasattr(param, "full_tensor") else param.detach()
        yield name, full
        del full  # before the next gather, so two gathered parameters never coexist here


# ------------------------------------------------------------------ config translation
def vllm_engine_kwargs(
    model_path: str,
    rollout: RolloutSettings,
    tp_size: int,
    seed: int,
    *,
    max_model_len: int,
    dtype: str = "bfloat16",
    load_format: str = "dummy",
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for one rank of the rollout.

    :param model_path: a local HF model directory (vLLM loads the config and
        tokenizer from it; ``builtin:`` models are not supported).
    :param rollout: ``actor_rollout_ref.rollout`` (``gpu_memory_utilization``,
        ``max_num_seqs``, ``enforce_eager``, ``enable_sleep_mode``).
    :param tp_size: vLLM tensor-parallel size; the ranks of one group must be
        consecutive (vLLM's external launcher groups ranks that way).
    :param seed: engine seed, equal on every rank of a tp group (they must
        sample identically); per-request seeds come from
        :func:`vllm_sampling_kwargs`.
    :param max_model_len: prompt plus response tokens (``data.max_prompt_length
        + rollout.response_length``).
    :param dtype: ``actor_rollout_ref.model.dtype``.
    :param load_format: ``dummy`` (random weights: the actor pushes the real
        ones before the first generate, saving a disk read) or ``auto``.
    :returns: the kwargs; ``logprobs_mode="processed_logprobs"`` makes the
        sampled-token log-probs use the temperature-scaled distribution.
    """
    if str(model_path).startswith("builtin:"):
        raise ValueError(
            f"vLLM loads a model from a local HF directory, got {model_path!r}; save the builtin model "
            "with save_pretrained and pass that directory, or use rollout@actor_rollout_ref.rollout=builtin"
        )
    if tp_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tp_size}")
    if not 0.0 < rollout.gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {rollout.gpu_memory_utilization}")
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2 (a prompt token and a response token), got {max_model_len}")
    return {
        "model": str(model_path),
        "tensor_parallel_size": tp_size,
        "distributed_executor_backend": "external_launcher",
        "dtype": dtype,
        "seed": seed,
        "max_model_len": max_model_len,
        "gpu_memory_utilization": rollout.gpu_memory_utilization,
        "enforce_eager": rollout.enforce_eager,
        "enable_sleep_mode": rollout.enable_sleep_mode,
        **({} if rollout.max_num_seqs is None else {"max_num_seqs": rollout.max_num_seqs}),
        "load_format": load_format,
        "logprobs_mode": "processed_logprobs",
        # A prompt's n samples share its prefill through the prefix cache.
        "enable_prefix_caching": True,
        # Custom all-reduce keeps IPC buffers that sleep mode does not manage.
        "disable_custom_all_reduce": True,
        "disable_log_stats": True,
    }


def vllm_sampling_kwargs(sampling: SamplingParams, n: int, greedy: bool, seed: int | None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one prompt.

    Greedy (validation) decodes once: ``n=1`` and temperature 0 (the caller
    repeats the one response ``n`` times, as the built-in engine does), with
    top-p / top-k off and no seed. ``top_k <= 0`` becomes -1, which every
    targeted vLLM reads as "off" (0.10 rejects 0; later versions take both).
    ``logprobs=0`` returns the log-prob of the sampled token only;
    ``detokenize=False`` because the trainer works on token ids. vLLM gives
    child ``j`` of a seeded request the seed ``seed + j``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    common = {"max_tokens": sampling.max_new_tokens, "logprobs": 0, "detokenize": False}
    if greedy:
        return {"n": 1, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "seed": None, **common}
    return {
        "n": n,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "seed": seed,
        **common,
    }


# ------------------------------------------------------------------ inputs and outputs
def unpad_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The real tokens of each row of a padded (B, P) batch, as the id lists vLLM takes."""
    if input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} differ")
    keep = attention_mask.bool().cpu()
    rows = input_ids.cpu()
    out = [rows[i][keep[i]].tolist() for i in range(rows.shape[0])]
    empty = [i for i, ids in enumerate(out) if not ids]
    if empty:
        raise ValueError(f"prompt rows {empty} have no real tokens (attention_mask all 0)")
    return out


def _completion_arrays(completion: Any, response_length: int, where: str) -> tuple[list[int], list[float]]:
    """Token ids and sampled-token log-probs of one vLLM ``CompletionOutput``, cut at ``response_length``."""
    tokens = [int(t) for t in completion.token_ids][:response_length]
    if completion.logprobs is None:
        raise ValueError(f"{where} has no logprobs; request them with SamplingParams(logprobs=0)")
    log_probs = []
    for t, token in enumerate(tokens):
        step = completion.logprobs[t]  # {token_id: Logprob}, holding at least the sampled token
        entry = step[token]
        log_probs.append(float(getattr(entry, "logprob", entry)))
    return tokens, log_probs


def outputs_to_dataproto(
    prompts: DataProto,
    request_outputs: Sequence[Any],
    n: int,
    pad_token_id: int,
    response_length: int,
) -> DataProto:
    """Build the rollout DataProto from vLLM results, with the built-in engine's columns and layout.

    :param prompts: the generate input: ``input_ids`` / ``attention_mask``
        (B, P) left-padded, optional ``position_ids``, other columns ride along.
    :param request_outputs: B results in prompt order, shaped like vLLM's
        ``RequestOutput``: ``.outputs`` holds ``n`` completions (or 1, which is
        repeated ``n`` times: greedy), each with ``.token_ids`` and
        ``.logprobs`` (per token a mapping from token id to an object with a
        ``.logprob``, as ``SamplingParams(logprobs=0)`` returns).
    :param response_length: T; responses are right-padded with ``pad_token_id``.
    :returns: B*n rows, row ``i*n + j`` is prompt ``i``'s sample ``j``:
        ``prompts`` (P), ``responses`` (T), ``response_mask`` (1 over the
        returned tokens, EOS included), ``rollout_log_probs`` (T, 0 past the
        end), ``input_ids`` / ``attention_mask`` / ``position_ids`` (P + T:
        prompt positions as given or ``cumsum(mask) - 1``, responses
        continuing after the prompt's last position), the other input columns
        repeated, and ``meta_info["metrics"]["rollout/generated_tokens"]``
        (tokens actually decoded: a greedy response counts once).
    """
    input_ids = prompts.batch[INPUT_IDS]
    attention_mask = prompts.batch[ATTENTION_MASK]
    batch_size = input_ids.shape[0]
    if len(request_outputs) != batch_size:
        raise ValueError(f"{len(request_outputs)} request outputs for {batch_size} prompts")
    if n < 1 or response_length < 1:
        raise ValueError(f"n and response_length must be >= 1, got n={n}, response_length={response_length}")
    positions = prompts.batch.get(POSITION_IDS)
    positions = positions_from_mask(attention_mask) if positions is None else positions
    responses = torch.full((batch_size * n, response_length), pad_token_id, dtype=torch.long)
    log_probs = torch.zeros((batch_size * n, response_length), dtype=torch.float32)
    lengths = torch.zeros(batch_size * n, dtype=torch.long)
    generated = 0
    for i, request in enumerate(request_outputs):
        completions = list(request.outputs)
        if len(completions) not in (1, n):
            raise ValueError(f"prompt {i} has {len(completions)} completions; expected {n} (or 1 when greedy)")
        decoded = [_completion_arrays(c, response_length, f"prompt {i} completion {j}") for j, c in enumerate(completions)]
        generated += sum(len(tokens) for tokens, _ in decoded)
        for j in range(n):
            tokens, token_log_probs = decoded[j if len(decoded) == n else 0]
            row, length = i * n + j, len(tokens)
            responses[row, :length] = torch.tensor(tokens, dtype=torch.long)
            log_probs[row, :length] = torch.tensor(token_log_probs, dtype=torch.float32)
            lengths[row] = length

    device = input_ids.device
    out = assemble_rollout(
        prompts, n, input_ids, attention_mask, positions.to(device),
        responses.to(device), log_probs.to(device), lengths.to(device),
    )  # fmt: skip
    metrics = dict(out.meta_info.get(METRICS, {}))
    metrics["rollout/generated_tokens"] = generated
    out.meta_info[METRICS] = metrics
    return out


# ------------------------------------------------------------------ the adapter
@contextmanager
def _launcher_environment() -> Iterator[None]:
    """Environment vLLM's external launcher reads while it builds its worker.

    vLLM puts its worker on ``cuda:$LOCAL_RANK``. A Ray worker sees only its
    own GPU (as ``cuda:0``) while LOCAL_RANK is its index on the node, so
    LOCAL_RANK is set to the current device for the duration of the build.
    RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT are the group's (already set).
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine: its model is reachable
    saved = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = str(torch.cuda.current_device())
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("LOCAL_RANK", None)
        else:
            os.environ["LOCAL_RANK"] = saved


class VLLMRolloutEngine:
    """The built-in engine's ``generate`` contract on top of a ``vllm.LLM`` of this rank.

    Build it with :meth:`create` (which builds the LLM); the constructor wraps
    an existing one. ``rollout_log_probs`` are vLLM's sampled-token log-probs
    under the temperature-scaled distribution (``processed_logprobs``); with
    top-k / top-p on they are renormalized over the kept tokens, unlike the
    built-in engine's (see :mod:`~hybridflow.workers.rollout.sampling`). They
    are diagnostics only: the actor recomputes the old log-probs under its
    training layout before every update.
    """

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        *,
        enable_sleep_mode: bool,
        tie_word_embeddings: bool,
        eos_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
        sleep_level: int = 1,
        weights_loaded: bool = True,
        sampling_params_cls: Callable[..., Any] | None = None,
        tokens_prompt_cls: Callable[..., Any] | None = None,
    ) -> None:
        """Wrap ``llm``; ``weights_loaded=False`` (dummy load format) makes generate wait for update_weights.

        ``sampling_params_cls`` / ``tokens_prompt_cls`` default to
        ``vllm.SamplingParams`` / ``vllm.inputs.TokensPrompt``.
        """
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 (offload weights to CPU) or 2 (discard them), got {sleep_level}")
        self.llm = llm
        self.tokenizer = tokenizer
        self.enable_sleep_mode = enable_sleep_mode
        self.tie_word_embeddings = tie_word_embeddings
        self.sleep_level = sleep_level
        ids = [tokenizer.eos_token_id, *(eos_token_ids or ())]
        self.eos_token_ids = tuple(dict.fromkeys(int(i) for i in ids if i is not None))
        if not self.eos_token_ids:
            raise ValueError("no EOS token id: the tokenizer has no eos_token and none was given")
        if pad_token_id is None:
            pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.pad_token_id = int(pad_token_id)
        self.weights_loaded = weights_loaded
        self.weight_version: int | None = None
        """The actor weight version last pushed (:meth:`update_weights`'s ``version``)."""
        self.last_sync_bytes = 0
        self._awake = set(SLEEP_TAGS)  # a new engine holds its weights and KV cache
        self._sampling_params_cls = sampling_params_cls
        self._tokens_prompt_cls = tokens_prompt_cls

    @classmethod
    def create(
        cls,
        model_path: str,
        tokenizer: Any,
        rollout: RolloutSettings,
        tp_size: int,
        *,
        max_model_len: int,
        dtype: str = "bfloat16",
        seed: int = 0,
        load_format: str = "dummy",
    ) -> VLLMRolloutEngine:
        """Build this rank's vLLM engine (collective: every rank of the torch.distributed group, together).

        Called once by the actor-rollout worker in ``init_model``, after
        ``torch.distributed`` is initialized (vLLM reuses that world and
        builds its tp groups from consecutive ranks). Raises ``RuntimeError``
        naming ``pip install 'hybridflow[vllm]'`` when vLLM is missing or no
        GPU is visible. Arguments: :func:`vllm_engine_kwargs`.
        """
        reasons = vllm_unavailable_reasons()
        if reasons:
            raise RuntimeError("rollout.name=vllm cannot run here: " + "; ".join(reasons))
        kwargs = vllm_engine_kwargs(
            model_path, rollout, tp_size, seed, max_model_len=max_model_len, dtype=dtype, load_format=load_format
        )
        with _launcher_environment():
            import vllm  # noqa: PLC0415 - optional dependency, imported only when used
            from vllm.inputs import TokensPrompt  # noqa: PLC0415

            llm = vllm.LLM(**kwargs)
        hf_config = llm.llm_engine.model_config.hf_config
        return cls(
            llm,
            tokenizer,
            enable_sleep_mode=rollout.enable_sleep_mode,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            eos_token_ids=_generation_eos_ids(model_path),
            weights_loaded=load_format != "dummy",
            sampling_params_cls=vllm.SamplingParams,
            tokens_prompt_cls=TokensPrompt,
        )

    # -------------------------------------------------------------- generate
    def generate(
        self,
        prompts: DataProto,
        *,
        n: int = 1,
        sampling: SamplingParams | None = None,
        greedy: bool = False,
        seed: int | None = None,
        stop_token_ids: tuple[int, ...] = (),
    ) -> DataProto:
        """Generate ``n`` responses per prompt; arguments and returned columns as ``RolloutEngine.generate``.

        Prompts go to vLLM un-padded (token id lists). Prompt ``i`` is seeded
        with ``seed + i*n`` (vLLM seeds its sample ``j`` with that plus
        ``j``), so every sample of the batch has its own seed and equal seeds
        give equal sampling noise; vLLM does not promise bitwise-equal logits
        across batch compositions. Every rank of a tp group must call this with
        the same prompts and seed. Needs the weights and KV cache awake.
        """
        missing = [tag for tag in SLEEP_TAGS if tag not in self._awake]
        if missing:
            raise RuntimeError(f"generate needs the engine awake, but {missing} are asleep; call wake_up() first")
        if not self.weights_loaded:
            raise RuntimeError(
                "the engine holds no real weights (dummy load format, or discarded by sleep level 2); "
                "call update_weights() before generate"
            )
        sampling = sampling or SamplingParams()
        token_lists = unpad_prompts(prompts.batch[INPUT_IDS], prompts.batch[ATTENTION_MASK])
        params_cls, prompt_cls = self._vllm_types()
        stops = {"stop_token_ids": [int(t) for t in stop_token_ids]} if stop_token_ids else {}
        params = [
            params_cls(**vllm_sampling_kwargs(sampling, n, greedy, None if seed is None else seed + i * n), **stops)
            for i in range(len(token_lists))
        ]
        requests = [prompt_cls(prompt_token_ids=ids) for ids in token_lists]
        start = time.perf_counter()
        results = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        out = outputs_to_dataproto(prompts, results, n, self.pad_token_id, sampling.max_new_tokens)
        out.meta_info[METRICS]["rollout/generate_s"] = elapsed
        return out

    def _vllm_types(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        if self._sampling_params_cls is None or self._tokens_prompt_cls is None:
            import vllm  # noqa: PLC0415
            from vllm.inputs import TokensPrompt  # noqa: PLC0415

            self._sampling_params_cls = self._sampling_params_cls or vllm.SamplingParams
            self._tokens_prompt_cls = self._tokens_prompt_cls or TokensPrompt
        return self._sampling_params_cls, self._tokens_prompt_cls

    # -------------------------------------------------------------- weights
    def vllm_model(self) -> nn.Module:
        """The vLLM model object of this rank (in-process engine), whose ``load_weights`` takes HF names."""
        for path in _MODEL_PATHS:
            obj = self.llm
            for attr in path:
                obj = getattr(obj, attr, None)
                if obj is None:
                    break
            if obj is not None and hasattr(obj, "load_weights"):
                return obj
        raise RuntimeError(
            "cannot reach the vLLM model in this process (llm.llm_engine.model_executor.driver_worker"
            ".worker.model_runner.model); the engine must run in-process: distributed_executor_backend="
            "'external_launcher' with VLLM_ENABLE_V1_MULTIPROCESSING=0 on vLLM 0.10.2 - 0.11"
        )

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> int:
        """Push new weights into vLLM, one tensor per ``load_weights`` call; returns how many tensors were pushed.

        Called by the actor after an update (collective when ``named_tensors``
        is :func:`iter_full_weights` of the FSDP model: every rank, together).
        Names go through :func:`vllm_weight_name` (wrapper prefixes stripped,
        tied ``lm_head`` skipped). Each full tensor is handed over and released
        before the next is drawn, so the iterator's gathered tensors never pile
        up. Resets vLLM's prefix cache, which holds KV computed with the old
        weights. Needs the weights awake (``wake_up(["weights"])``).
        """
        if "weights" not in self._awake:
            raise RuntimeError("update_weights needs the weights awake; call wake_up(['weights']) first")
        model = self.vllm_model()
        count = nbytes = 0
        for name, tensor in named_tensors:
            target = vllm_weight_name(name, tie_word_embeddings=self.tie_word_embeddings)
            if target is not None:
                model.load_weights([(target, tensor)])
                count += 1
                nbytes += tensor.numel() * tensor.element_size()
            del tensor  # the iterator may gather the next one now
        self.llm.reset_prefix_cache()
        self.weights_loaded = True
        self.weight_version = version
        self.last_sync_bytes = nbytes
        logger.debug("pushed %d tensors (%.1f MiB) into vLLM, weight version %s", count, nbytes / 2**20, version)
        return count

    # -------------------------------------------------------------- memory
    def sleep(self) -> None:
        """Free the KV cache and offload (level 1) or discard (level 2) the weights while the actor trains.

        Called after generate. No-op without ``enable_sleep_mode``.
        """
        if not self.enable_sleep_mode or not self._awake:
            return
        self.llm.sleep(level=self.sleep_level)
        self._awake.clear()
        if self.sleep_level == 2:
            self.weights_loaded = False  # discarded: generate waits for the next update_weights

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Restore ``tags`` (``"weights"``, ``"kv_cache"``; None: both) before a weight push or generate.

        Waking the weights first and the KV cache only after the push keeps
        the gathered tensors and the KV cache from sharing the GPU. No-op
        without ``enable_sleep_mode``.
        """
        tags = list(SLEEP_TAGS if tags is None else tags)
        unknown = [t for t in tags if t not in SLEEP_TAGS]
        if unknown:
            raise ValueError(f"unknown wake_up tags {unknown}; allowed: {', '.join(SLEEP_TAGS)}")
        todo = [t for t in tags if t not in self._awake]
        if not self.enable_sleep_mode or not todo:
            return
        if torch.cuda.is_available():
            # Blocks the actor freed stay in torch's caching allocator; vLLM maps its memory outside it.
            torch.cuda.empty_cache()
        self.llm.wake_up(tags=todo)
        self._awake.update(todo)

    @property
    def awake(self) -> frozenset[str]:
        """Which of ``weights`` / ``kv_cache`` are on the GPU now."""
        return frozenset(self._awake)


def _generation_eos_ids(model_path: str) -> list[int]:
    """EOS ids from the model directory's ``generation_config.json`` (vLLM stops on them too); [] if none."""
    from transformers import GenerationConfig  # noqa: PLC0415

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:
        return []
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
