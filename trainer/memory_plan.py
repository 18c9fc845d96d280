"""Each stage's peak memory per rank, predicted from the config and the model's shape before anything starts.

The same stages the run measures afterwards (``memory/<stage>/peak_gb``: ``gen``, ``old_log_prob``, ``ref``,
``values``, ``rm``, ``update``), on the ranks that run them: the training ranks, and with
``trainer.placement=split`` the rollout's own ranks for ``gen``. No weights are read: the model is built on the
meta device from its config, so a 7B-shaped model plans in seconds. ``hybridflow plan`` prints the plan;
``hybridflow-train`` checks it before Ray starts (``trainer.memory_check``). ``docs/memory.md`` writes the model
out and compares it with measured runs.

A stage's peak is what the rank holds throughout (resident) plus what the stage allocates while it runs
(transient). W training ranks shard every trained or frozen model (FSDP2); q is the rollout's tensor-parallel
degree; ``m``, ``c`` the bytes of the master and the compute dtype::

    resident  = runtime + actor weights (P m / W; LoRA: P c / W + A m / W) + AdamW moments (2 T m / W)
              + reference (P c / W) + critic (as the actor) + reward model (P c / W)
              + the colocated rollout's copy of the policy (P c / q; none with rollout.offload_weights but in gen)
    gen       + KV cache (rows x (prompt + response) x layers x 2 x kv heads / q x head dim x c) + prefill
    old_log_prob, ref, values, rm
              + a forward's activations: one layer's temporaries and the response tokens' fp32 logits
    update    + gradients (T m / W; with several micro-batches a step and fsdp_config.accumulate_unsharded_grads,
                T r (1 + 1 / layers): their sum, whole on every rank in r, the reduce dtype, which the last backward
                reduce-scatters and frees layer by layer, and the layer in flight) + the micro-batch's
                saved activations (every layer, or with activation checkpointing each layer's input and one
                layer's) + fp32 logits and their gradient + the layers FSDP2 gathers (two; all of them without
                reshard_after_forward)

where T is what trains (P, or the adapters' A). ``runtime`` is the process before any model: on a CPU the resident
set of an idle rank (Python, torch, transformers, Ray's worker), on a GPU the CUDA context, which the measured
figure (the allocator's peak) leaves out. Offload to host memory on a GPU keeps a role's state off the device
outside its stages; on a CPU it moves nothing out of the process (a stage's state comes back, and its host copy is
freed, before its activations exist). On a CPU the resident set is planned with ``trainer.cpu_mmap_threshold_mb``
set (the default): without it glibc's heap keeps what a stage frees, and a rank's resident set runs ahead of what
it holds. Every micro-batch is taken at its largest (every response at full length): the plan is an upper bound of
the typical step, not of a pathological one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from hybridflow.configs.roles import (
    RolloutPlacement,
    needs_critic,
    needs_reference,
    reference_in_actor,
    rollout_placement,
)

GIB = 2**30
STAGES = ("gen", "old_log_prob", "ref", "values", "rm", "update")
"""The stages of ``memory/<stage>/peak_gb``, in the order a step runs them."""

CPU_RUNTIME_GB = 0.53
"""A CPU rank's resident set before any model (Python, torch, transformers, Ray's worker, the role's code):
the ~0.1M-parameter default model's stages measured 0.533-0.539 GiB (``bench/bench_memory_plan.py``, config
``tiny``, whatever ``trainer.cpu_mmap_threshold_mb``), of which its parts are under 0.01; in a venv as a fresh
``make install`` leaves it. This checkout's older venv measured 0.64 (not traced: a package it loaded that a fresh
install does not have, torchvision the likeliest)."""
CUDA_CONTEXT_GB = 1.0
"""The CUDA context and the allocator's slack on a GPU (not measured here: no GPU; a typical figure)."""
VLLM_CPU_RUNTIME_GB = 0.6
"""What vLLM's CPU build adds to a rank before its weights and KV cache (its imports and engine): an estimate, not
measured (no vLLM configuration is in ``bench/bench_memory_plan.py`` yet)."""


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model, read from its config on the meta device."""

    params: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    layer_params: int
    """Parameters of the largest decoder layer (what FSDP2 gathers at once)."""
    linears: tuple[tuple[str, int, int], ...] = field(repr=False, default=())
    """Every linear layer: (module name, in features, out features), for the LoRA adapters' size."""

    @classmethod
    def of(cls, hf_config: Any) -> ModelShape:
        """Build the model of ``hf_config`` on the meta device (no memory, no weights) and read its shape."""
        import torch  # noqa: PLC0415
        from transformers import AutoModelForCausalLM  # noqa: PLC0415

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
        layers = model.model.layers
        heads = hf_config.num_attention_heads
        return cls(
            params=sum(p.numel() for p in model.parameters()),
            hidden=hf_config.hidden_size,
            layers=len(layers),
            heads=heads,
            kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
            intermediate=hf_config.intermediate_size,
            vocab=hf_config.vocab_size,
            layer_params=max(sum(p.numel() for p in layer.parameters()) for layer in layers),
            linears=tuple(
                (name, module.in_features, module.out_features)
                for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear)
            ),
        )

    def adapted_params(self, targets: Any, excluded: Any = None) -> int:
        """Weights of the linear layers LoRA adapts (what a merged view of the model copies)."""
        return sum(n_in * n_out for name, n_in, n_out in self.linears if _targeted(name, targets, excluded))

    def lora_params(self, rank: int, targets: Any, excluded: Any = None) -> int:
        """Parameters of rank-``rank`` adapters (A: r x in, B: out x r) on the targeted linear layers, as peft
        matches ``target_modules`` / ``exclude_modules`` (``all-linear``: every one but the output projection)."""
        return sum(rank * (n_in + n_out) for name, n_in, n_out in self.linears if _targeted(name, targets, excluded))


def _matches(name: str, pattern: Any) -> bool:
    if pattern is None:
        return False
    if isinstance(pattern, str):
        return re.fullmatch(pattern, name) is not None
    return any(name == p or name.endswith("." + p) for p in pattern)


def _targeted(name: str, targets: Any, excluded: Any) -> bool:
    if targets == "all-linear":
        hit = not name.endswith("lm_head")
    else:
        hit = _matches(name, targets)
    return hit and not _matches(name, excluded)


@dataclass
class StagePlan:
    """One stage's predicted peak on one kind of rank, by part (bytes)."""

    stage: str
    ranks: str
    """``training`` or ``rollout`` (the split rollout's own ranks)."""
    parts: dict[str, float]

    @property
    def peak_gb(self) -> float:
        return sum(self.parts.values()) / GIB


@dataclass
class MemoryPlan:
    """The plan of a run: each stage it runs, the memory a rank may use, the verdict."""

    device: str
    stages: dict[str, StagePlan]
    limit_gb: float | None
    """A rank's memory (``trainer.memory_limit_gb``, else the device's; None: unknown here)."""
    limit_source: str

    @property
    def fits(self) -> bool | None:
        """Whether every stage's peak is within the limit (None: no limit known)."""
        return None if self.limit_gb is None else all(s.peak_gb <= self.limit_gb for s in self.stages.values())

    def largest(self) -> StagePlan:
        return max(self.stages.values(), key=lambda s: s.peak_gb)

    def as_json(self) -> dict[str, Any]:
        """``{"stages": {"<stage>": {"peak_gb", "ranks", "parts_gb"}}, "limit_gb", "fits", "device"}``."""
        stages = {
            name: {
                "peak_gb": round(s.peak_gb, 4),
                "ranks": s.ranks,
                "parts_gb": {k: round(v / GIB, 4) for k, v in s.parts.items() if v},
            }
            for name, s in self.stages.items()
        }
        return {"stages": stages, "limit_gb": self.limit_gb, "fits": self.fits, "device": self.device}


# ------------------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class _Role:
    """A model one kind of rank holds: its shape, dtypes, what trains, how it is sharded and offloaded."""

    name: str
    shape: ModelShape
    compute_bytes: int
    master_bytes: int
    trainable: int  # parameters in the optimizer (0: frozen)
    shards: int
    param_offload: bool = False
    optimizer_offload: bool = False
    reshard_after_forward: bool = True
    summed_grad_bytes: int = 4  # a gradient summed unsharded over micro-batches: reduce_dtype under mixed precision

    def weights(self) -> float:
        """Trained in full: master weights. Frozen (reference, reward model, LoRA's base): the compute dtype, and
        LoRA's adapters in the master dtype beside it."""
        if self.trainable == self.shape.params:
            return self.shape.params * self.master_bytes / self.shards
        return (self.shape.params * self.compute_bytes + self.trainable * self.master_bytes) / self.shards

    def optimizer(self) -> float:
        return 2 * self.trainable * self.master_bytes / self.shards

    def gradients(self, summed_unsharded: bool = False) -> float:
        """The shard the optimizer steps (T m / W). Summed unsharded over a step's micro-batches: the sum, whole on
        every rank, which the last backward reduce-scatters layer by layer (freeing it as the shards form), and the
        gradient of the layer in flight (FSDP2's ``unsharded_accumulated_grad``)."""
        if summed_unsharded:
            return self.trainable * self.summed_grad_bytes * (1 + 1 / self.shape.layers)
        return self.trainable * self.master_bytes / self.shards

    def gathered_layers(self) -> float:
        """FSDP2 gathers a layer to compute it, prefetching the next: two layers' weights in the compute dtype;
        without ``reshard_after_forward`` every layer stays gathered through the pass."""
        if self.shards == 1:
            return 0.0
        layers = self.shape.layers if not self.reshard_after_forward else 2
        return layers * self.shape.layer_params * self.compute_bytes


def _tokens(rows: int, seq: int, dynamic: bool, budget: int, micro_rows: int) -> int:
    """Tokens of the largest micro-batch of a pass over ``rows`` rows of ``seq`` tokens on one rank."""
    if dynamic:
        return min(rows * seq, max(budget, seq))
    return min(rows, micro_rows) * seq


def _forward(shape: ModelShape, tokens: int, response_tokens: int, c: int, tp: int = 1) -> float:
    """A no-grad forward's transient: one layer's temporaries (attention and MLP), the hidden states in and out,
    and the response tokens' fp32 logits with their log-softmax."""
    layer = tokens * (4 * shape.hidden + 3 * shape.intermediate / tp) * c
    return layer + 2 * tokens * shape.hidden * c + 2 * response_tokens * shape.vocab * 4


def _saved_per_token_layer(shape: ModelShape, tp: int = 1) -> float:
    """Elements a decoder layer keeps for its backward, per token: the two norms' inputs and outputs, q, k and v
    (k and v repeated to every query head), the attention's output, the MLP's gate, up, activation and product."""
    return 11 * shape.hidden + 4 * shape.intermediate / tp


def _training(shape: ModelShape, tokens: int, response_tokens: int, c: int, checkpointing: bool, tp: int) -> float:
    """A micro-batch's forward and backward: the saved activations, and fp32 logits, log-softmax and gradient."""
    per_layer = _saved_per_token_layer(shape, tp) * tokens * c
    saved = tokens * shape.hidden * c * shape.layers + per_layer if checkpointing else per_layer * shape.layers
    return saved + 2 * tokens * shape.hidden * c + 3 * response_tokens * shape.vocab * 4


@dataclass
class _Job:
    """The quantities of a run the plan is made of (from the config)."""

    config: Any
    actor: _Role
    policy: ModelShape
    ref: _Role | None
    critic: _Role | None
    rm: _Role | None
    placement: RolloutPlacement
    world: int
    on_gpu: bool
    limit_gb: float | None
    """A rank's memory (:func:`memory_limit`), read once."""

    @property
    def seq(self) -> int:
        return self.config.data.max_prompt_length + self.config.actor_rollout_ref.rollout.response_length


def plan_memory(config: Any) -> MemoryPlan:
    """The memory plan of a checked config (``trainer.device`` settled)."""
    limit, source = memory_limit(config)
    job = _job(config, limit)
    training = {stage: _training_stage(job, stage) for stage in STAGES}
    stages = {s: StagePlan(s, "training", parts) for s, parts in training.items() if parts is not None}
    if job.placement is not RolloutPlacement.COLOCATED:
        stages["gen"] = StagePlan("gen", "rollout", _rollout_rank_gen(job))
    return MemoryPlan(config.trainer.device, stages, limit, source)


@lru_cache(maxsize=16)
def model_shape(path: str) -> ModelShape:
    """The shape of the model at ``path`` (a directory or ``builtin:<name>``; a reward model's sequence classifier
    has its causal LM's shape but the head), built once per process: a refusal plans the config again per remedy."""
    from hybridflow.workers.models import load_model_config  # noqa: PLC0415

    return ModelShape.of(load_model_config(path))


def _bytes(dtype: str) -> int:
    from hybridflow.workers.models import torch_dtype  # noqa: PLC0415

    return torch_dtype(dtype).itemsize


def _summed_grad_bytes(fsdp: Any, compute: int) -> int:
    """The dtype of a gradient FSDP2 sums unsharded: the reduce dtype under mixed precision (held in another
    dtype than it computes in, or a ``param_dtype`` named), else the parameters' own (``workers.fsdp.shard_role``)."""
    mixed = _bytes(fsdp.master_dtype) != compute or fsdp.param_dtype
    return _bytes(fsdp.reduce_dtype) if mixed and fsdp.reduce_dtype else compute


def _job(config: Any, limit_gb: float | None) -> _Job:
    arr, trainer = config.actor_rollout_ref, config.trainer
    world = trainer.nnodes * trainer.n_gpus_per_node
    policy = model_shape(arr.model.path)
    c = _bytes(arr.actor.fsdp_config.compute_dtype(arr.model))
    lora = arr.model.lora_rank
    adapters = policy.lora_params(lora, arr.model.target_modules, arr.model.exclude_modules) if lora else 0
    actor = _Role(
        "actor",
        policy,
        c,
        _bytes(arr.actor.fsdp_config.master_dtype),
        adapters or policy.params,
        world,
        arr.actor.fsdp_config.param_offload,
        arr.actor.fsdp_config.optimizer_offload,
        arr.actor.fsdp_config.reshard_after_forward,
        _summed_grad_bytes(arr.actor.fsdp_config, c),
    )
    ref = None
    if needs_reference(config) and not reference_in_actor(config):
        ref_c = _bytes(arr.ref.fsdp_config.compute_dtype(arr.model))
        ref = _Role("ref", policy, ref_c, ref_c, 0, world, arr.ref.fsdp_config.param_offload)
    critic = None
    if needs_critic(config):
        cc = config.critic
        head = policy.hidden + 1
        critic_adapters = policy.lora_params(cc.lora_rank, cc.target_modules, cc.exclude_modules) if cc.lora_rank else 0
        critic = _Role(
            "critic",
            policy,
            _bytes(cc.fsdp_config.compute_dtype(arr.model)),
            _bytes(cc.fsdp_config.master_dtype),
            critic_adapters + head if cc.lora_rank else policy.params,
            world,
            cc.fsdp_config.param_offload,
            cc.fsdp_config.optimizer_offload,
            cc.fsdp_config.reshard_after_forward,
            _summed_grad_bytes(cc.fsdp_config, _bytes(cc.fsdp_config.compute_dtype(arr.model))),
        )
    rm = None
    if config.reward_model.enable:
        rmc = config.reward_model.model
        rm_c = _bytes(rmc.fsdp_config.compute_dtype(arr.model))
        rm = _Role("reward model", model_shape(rmc.path), rm_c, rm_c, 0, world, rmc.fsdp_config.param_offload)
    placement, on_gpu = rollout_placement(config), trainer.device == "cuda"
    return _Job(config, actor, policy, ref, critic, rm, placement, world, on_gpu, limit_gb)


def _resident(job: _Job, stage: str) -> dict[str, float]:
    """What a training rank holds through ``stage``: the process, every role's weights and optimizer state."""
    parts = {"runtime": (CUDA_CONTEXT_GB if job.on_gpu else CPU_RUNTIME_GB) * GIB}
    uses = {"actor": ("old_log_prob", "update") + (("ref",) if reference_in_actor(job.config) else ())}
    uses.update({"ref": ("ref",), "critic": ("values", "update"), "reward model": ("rm",)})
    for role in (job.actor, job.ref, job.critic, job.rm):
        if role is None:
            continue
        away = job.on_gpu and role.param_offload and stage not in uses[role.name]
        parts[f"{role.name} weights"] = 0.0 if away else role.weights()
        if role.trainable:
            away = job.on_gpu and role.optimizer_offload and stage != "update"
            parts[f"{role.name} optimizer"] = 0.0 if away else role.optimizer()
    model = job.config.actor_rollout_ref.model
    if model.lora_rank:  # the rollout gets W + s B A: a merged copy of every adapted shard, kept between syncs
        adapted = job.policy.adapted_params(model.target_modules, model.exclude_modules)
        parts["merged LoRA weights"] = adapted * job.actor.compute_bytes / job.world
    if job.placement is RolloutPlacement.COLOCATED:
        parts.update(_rollout_resident(job, stage))
    return parts


def _rollout_resident(job: _Job, stage: str) -> dict[str, float]:
    """The rollout engine's share of a rank that also trains (colocated)."""
    rollout = job.config.actor_rollout_ref.rollout
    q = rollout.tensor_model_parallel_size
    weights = job.policy.params * job.actor.compute_bytes / q
    if rollout.name == "vllm":
        if job.on_gpu:
            reserved = rollout.gpu_memory_utilization * (job.limit_gb or 0) * GIB
            return {"vLLM (weights, KV cache)": reserved if stage == "gen" or not rollout.enable_sleep_mode else 0.0}
        return {"vLLM runtime": VLLM_CPU_RUNTIME_GB * GIB, "rollout weights": weights, "KV cache": _kv_bytes(job)}
    if rollout.offload_weights and stage != "gen":
        return {}
    return {"rollout weights": weights}


def _rollout_rows(job: _Job) -> int:
    """Rows one rollout rank decodes at once: its share of the step's (or ``rollout.max_num_seqs``)."""
    rollout = job.config.actor_rollout_ref.rollout
    ranks = job.config.trainer.rollout_ranks if job.placement is not RolloutPlacement.COLOCATED else job.world
    dp = max(1, ranks // rollout.tensor_model_parallel_size)
    rows = -(-job.config.data.train_batch_size * rollout.n // dp)
    return min(rows, rollout.max_num_seqs) if rollout.max_num_seqs else rows


def _kv_bytes(job: _Job) -> float:
    shape, rollout = job.policy, job.config.actor_rollout_ref.rollout
    kv_heads = max(1, shape.kv_heads // rollout.tensor_model_parallel_size)
    return _rollout_rows(job) * job.seq * shape.layers * 2 * kv_heads * shape.head_dim * job.actor.compute_bytes


def _generation(job: _Job) -> dict[str, float]:
    """The transient of a built-in engine's generation: its KV cache (on a GPU at most ``gpu_memory_utilization``
    of the device) and the prefill of every row's prompt at once. vLLM's are inside its own reservation."""
    rollout = job.config.actor_rollout_ref.rollout
    if rollout.name == "vllm":
        return {}
    rows, prompt, q = _rollout_rows(job), job.config.data.max_prompt_length, rollout.tensor_model_parallel_size
    prefill = _forward(job.policy, rows * prompt, 0, job.actor.compute_bytes, q) + 2 * rows * job.policy.vocab * 4
    kv = _kv_bytes(job)
    if job.on_gpu and job.limit_gb is not None:
        kv = min(kv, rollout.gpu_memory_utilization * job.limit_gb * GIB)
    parts = {"prefill": prefill, "KV cache": kv}
    if job.placement is RolloutPlacement.COLOCATED:
        model_bytes = job.policy.params * job.actor.compute_bytes
        parts["reshard buckets"] = min(rollout.reshard_bucket_mb * 2**20, model_bytes)
    return parts


def _log_prob_tokens(job: _Job, rows: int) -> tuple[int, int]:
    """(tokens, response tokens) of the largest micro-batch of a no-grad pass over ``rows`` rows on a rank."""
    arr = job.config.actor_rollout_ref
    rollout, actor = arr.rollout, arr.actor
    dynamic = actor.use_dynamic_bsz if rollout.log_prob_use_dynamic_bsz is None else rollout.log_prob_use_dynamic_bsz
    budget = rollout.log_prob_max_token_len_per_gpu or actor.ppo_max_token_len_per_gpu
    micro = rollout.log_prob_micro_batch_size_per_gpu or actor.ppo_micro_batch_size_per_gpu
    tokens = _tokens(rows, job.seq, dynamic, budget, micro)
    return tokens, tokens * rollout.response_length // job.seq


def _training_stage(job: _Job, stage: str) -> dict[str, float] | None:
    """The parts of ``stage`` on a training rank; None when the run has no such stage there."""
    config, arr = job.config, job.config.actor_rollout_ref
    rows = -(-config.data.train_batch_size * arr.rollout.n // job.world)  # a rank's rows of the step
    parts = _resident(job, stage)
    if stage == "gen":
        if job.placement is not RolloutPlacement.COLOCATED:
            return None
        parts.update(_generation(job))
    elif stage in ("old_log_prob", "ref", "values", "rm"):
        role = {"old_log_prob": job.actor, "ref": job.ref or job.actor, "values": job.critic, "rm": job.rm}[stage]
        if role is None or (stage == "ref" and not needs_reference(config)):
            return None
        if stage == "old_log_prob" and not _recomputes_old_log_probs(config):
            return None
        tokens, response = _log_prob_tokens(job, rows)
        if stage in ("values", "rm"):
            response = 0  # a value head, a score: no vocabulary logits
        parts["activations"] = _forward(role.shape, tokens, response, role.compute_bytes)
        parts["gathered layers"] = role.gathered_layers()
    else:
        parts.update(_update(job))
    return parts


def _recomputes_old_log_probs(config: Any) -> bool:
    """Whether step 2 runs a pass of its own (``trainer/estimator_inputs.py`` decides)."""
    from hybridflow.plugins import get_estimator  # noqa: PLC0415
    from hybridflow.trainer.estimator_inputs import InputPlan  # noqa: PLC0415

    return InputPlan.for_estimator(get_estimator(config.algorithm.adv_estimator), config).recompute_old_log_prob


def _update(job: _Job) -> dict[str, float]:
    """The larger of the actor's and the critic's update: gradients, saved activations, gathered layers."""
    config, arr = job.config, job.config.actor_rollout_ref
    checkpointing = arr.model.enable_gradient_checkpointing
    candidates = []
    for role, section in ((job.actor, arr.actor), (job.critic, config.critic)):
        if role is None:
            continue
        dp = job.world // getattr(section, "tensor_model_parallel_size", 1)
        mini_rows = -(-arr.actor.ppo_mini_batch_size * arr.rollout.n // dp)
        tp = getattr(section, "tensor_model_parallel_size", 1)
        tokens = _tokens(
            mini_rows,
            job.seq,
            section.use_dynamic_bsz,
            section.ppo_max_token_len_per_gpu,
            section.ppo_micro_batch_size_per_gpu,
        )
        response = 0 if role is job.critic else tokens * arr.rollout.response_length // job.seq
        accumulates = mini_rows * job.seq > tokens and section.fsdp_config.accumulate_unsharded_grads
        candidates.append(
            {
                f"{role.name} gradients": role.gradients(summed_unsharded=accumulates),
                "activations": _training(role.shape, tokens, response, role.compute_bytes, checkpointing, tp),
                "gathered layers": role.gathered_layers(),
            }
        )
    return max(candidates, key=lambda parts: sum(parts.values()))


def _rollout_rank_gen(job: _Job) -> dict[str, float]:
    """``gen`` on a rollout rank of its own (split placement, or the server process): the process, the policy's
    copy and the generation."""
    rollout = job.config.actor_rollout_ref.rollout
    parts = {"runtime": (CUDA_CONTEXT_GB if job.on_gpu else CPU_RUNTIME_GB) * GIB}
    if rollout.name == "vllm" and job.on_gpu:
        parts["vLLM (weights, KV cache)"] = rollout.gpu_memory_utilization * (job.limit_gb or 0) * GIB
        return parts
    parts["rollout weights"] = job.policy.params * job.actor.compute_bytes / rollout.tensor_model_parallel_size
    if rollout.name == "vllm":
        parts.update({"vLLM runtime": VLLM_CPU_RUNTIME_GB * GIB, "KV cache": _kv_bytes(job)})
    parts.update(_generation(job))
    return parts


# ------------------------------------------------------------------------------------------------ the limit


def memory_limit(config: Any) -> tuple[float | None, str]:
    """A rank's memory in GiB and where the figure comes from: ``trainer.memory_limit_gb``; on a GPU the local
    device's memory (None where this machine has no GPU); on a CPU the machine's available memory shared by the
    ranks that run on it."""
    trainer = config.trainer
    if trainer.memory_limit_gb is not None:
        return float(trainer.memory_limit_gb), "trainer.memory_limit_gb"
    if trainer.device == "cuda":
        import torch  # noqa: PLC0415

        if not torch.cuda.is_available():
            return None, "no GPU on this machine: set trainer.memory_limit_gb"
        return torch.cuda.get_device_properties(0).total_memory / GIB, "the GPU's memory"
    ranks = trainer.n_gpus_per_node + (trainer.rollout_ranks if trainer.placement == "split" else 0)
    return available_gb() / ranks, f"available memory / {ranks} ranks on this machine"


def available_gb() -> float:
    """The machine's available memory (``MemAvailable`` of ``/proc/meminfo``) in GiB."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    raise OSError("no MemAvailable in /proc/meminfo")
