"""veRL's config keys and TRL's ``GRPOConfig`` arguments, and what does the same here.

Someone coming from veRL types ``data.max_response_length=512``; someone
coming from TRL types ``learning_rate=1e-6`` (or ``--learning_rate 1e-6``).
Neither is a key here, and difflib finds nothing close, so the override check
(``configs/overrides.py``) asks :func:`explain` first::

    data.max_response_length is veRL's name; here: actor_rollout_ref.rollout.response_length=512
    repetition_penalty is TRL's GRPOConfig name; no equivalent yet: sampling takes temperature, top_p ...

Each :class:`ForeignKey` holds the overrides that do the same thing here
(``{value}`` is the user's value), the value-dependent ones when the foreign
value picks the setting (TRL's ``loss_type``), or why nothing does yet. A name
ending in ``.*`` covers a whole foreign section; no such section is one of
ours, so a misspelt key of ours still gets difflib's suggestion. The names
were read from veRL's ``verl/trainer/config/_generated_ppo_trainer.yaml`` (and
its DAPO examples) and TRL's ``trl/trainer/grpo_config.py`` with the
``TrainingArguments`` fields GRPO users set; ``tests/trainer/test_foreign_keys.py``
composes every suggestion and runs the config check on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

VERL = "veRL's"
TRL = "TRL's GRPOConfig"


@dataclass(frozen=True)
class ForeignKey:
    name: str
    """The foreign name: a dotted veRL key, a bare TRL argument, or a veRL section ending in ``.*``."""
    origin: str
    """:data:`VERL` or :data:`TRL`."""
    here: tuple[str, ...] = ()
    """Overrides doing the same here; ``{value}`` becomes the user's value, ``{rest}`` the part of the key under
    a ``.*`` section. An item without ``=`` names the key to set, whose value is not the foreign one (``note``)."""
    by_value: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """When the foreign value picks the setting: lower-cased value -> overrides (``()``: nothing to set, and a veRL
    command line keeps going with a line saying so; the other overrides are applied when ``exact``)."""
    note: str = ""
    """How it differs, or how to get the value."""
    value_notes: Mapping[str, str] = field(default_factory=dict)
    """Lower-cased value -> the note for that value, in place of ``note``."""
    missing: str = ""
    """Why nothing here does it (for every value, or for the values ``by_value`` lacks)."""
    example: str = "1"
    """A foreign value the tests put in for ``{value}``."""
    checked_with: tuple[str, ...] = ()
    """Overrides the suggestion is checked under in the tests (``note`` says when it applies)."""
    exact: bool = False
    """The overrides do what the foreign key does, whatever the value: a veRL command line is rewritten to them,
    with one line at start, instead of refused (``configs/overrides.py`` :func:`translate`)."""
    ignored: str = ""
    """Why the key changes nothing here, whatever its value: a veRL command line keeps going, with this line."""
    same_as: str = ""
    """A key of ours this one changes nothing beside when it repeats its value (``critic.model.path`` set to
    the policy's path); any other value is refused with ``missing``."""


A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
LOSS = "+actor_rollout_ref.actor.policy_loss_options"

NO_SP = "no sequence parallelism: each sequence lives on one rank"
COMPILE = "models run eagerly here (no torch.compile): a speed setting, the numbers are the same"
UNCHUNKED = "entropy is computed from the full logits, unchunked and without recomputation"
NO_MOE = "no MoE router replay (the models here are dense)"
NO_PROFILER = "no profiler integration"
NO_FUSED = "no Liger or fused kernels"
WHOLE_CHECKPOINT = "a checkpoint always holds the sharded model, optimizer and data position (trainer.save_freq)"
REWARD_LOOP = "rewards come from reward.* (a verifier, custom_reward_function) and the reward model"
OVERLONG_CFG = ("reward_model.reward_kwargs.overlong_buffer_cfg", "reward.reward_kwargs.overlong_buffer_cfg")
"""Where veRL's DAPO scripts put the overlong buffer: veRL 0.8's spelling, then its newer one."""
ROLES = (A, "actor_rollout_ref.ref", R, "critic", "reward_model")
"""veRL's roles that each have a profiler section."""
NO_COSINE = "the schedule is a linear warm-up to lr (optim.warmup_steps), then constant; no decay"
NO_MULTI_TURN = (
    "multi-turn rollouts are agent-loop plugins (rollout.agent_loop=tool_calling, rollout.agent.tools, "
    "rollout.agent.options; docs/writing-an-agent.md); interactions and this setting have no counterpart"
)
RM_COLOCATED = (
    "the reward model is colocated with the other roles, FSDP2 over all training ranks (docs/reward-models.md)"
)
GEN_RM = (
    "a generative reward model is the llm_judge verifier here: it asks an OpenAI-compatible endpoint "
    "(reward.verifier_kwargs.llm_judge; docs/reward-models.md)"
)
NO_VLLM_ARG = (
    "vLLM's engine arguments other than gpu_memory_utilization, max_num_seqs, enforce_eager and "
    "enable_sleep_mode are "
    "fixed; its context is data.max_prompt_length + rollout.response_length"
)
NO_SERVER = (
    "vLLM runs inside the training workers, or, for multi-turn agent loops (rollout.mode=server), in a vllm "
    "serve the trainer starts (rollout.server.url: one you started); TRL's server keys have no counterpart"
)
ONE_BACKEND = "FSDP2 (with optional tensor parallelism) is the only training backend"
STEPS = "a step here is one batch of data.train_batch_size prompts, however many optimizer steps it takes"
PER_RANK = "veRL's global micro-batch (deprecated there); here per rank: divide by the data-parallel ranks"
LOSS_OPTION = "an option of the policy loss; unset ones keep the loss's defaults"
LONGER = f"{R}.response_length=16"  # the default job's 4 tokens leave no room for an overlong zone


def _v(name: str, *here: str, **kw) -> ForeignKey:
    return ForeignKey(name, VERL, here, **kw)


def _t(name: str, *here: str, **kw) -> ForeignKey:
    return ForeignKey(name, TRL, here, **kw)


def _optim(p: str) -> tuple[ForeignKey, ...]:
    """veRL's optimizer keys, the same under the actor's and the critic's ``optim``."""
    return (
        _v(
            f"{p}.lr_warmup_steps",
            p + ".warmup_steps={value}",
            by_value={"-1": ()},
            exact=True,
            example="10",
            note="optimizer steps in both; 0 disables it here",
            value_notes={
                "-1": "veRL's -1 defers to lr_warmup_steps_ratio; here no warm-up unless optim.warmup_steps is set"
            },
        ),
        _v(
            f"{p}.lr_warmup_steps_ratio",
            f"{p}.warmup_steps",
            note="a step count here: the ratio x the run's optimizer steps",
        ),
        _v(f"{p}.clip_grad", p + ".grad_clip={value}", exact=True),
        _v(f"{p}.warmup_style", by_value={"constant": ()}, note=NO_COSINE, missing=NO_COSINE),
        _v(f"{p}.lr_scheduler_type", by_value={"constant": ()}, note=NO_COSINE, missing=NO_COSINE),
        _v(f"{p}.min_lr_ratio", missing=NO_COSINE),
        _v(f"{p}.num_cycles", missing=NO_COSINE),
        _v(
            f"{p}.optimizer",
            by_value={"adamw": ()},
            note="AdamW is the optimizer",
            missing="AdamW is the only optimizer",
        ),
        _v(f"{p}.optimizer_impl", missing="torch.optim.AdamW, set by lr, betas, weight_decay of this section"),
        _v(
            f"{p}.override_optimizer_config",
            missing="torch.optim.AdamW, set by lr, betas, weight_decay of this section",
        ),
        _v(
            f"{p}.total_training_steps",
            "trainer.total_training_steps",
            note="filled in by veRL's trainer; here the run's length",
        ),
    )


DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32", "float32": "float32"}
FIXED_FSDP = "FSDP2 runs with fixed settings otherwise (offload: fsdp_config.param_offload, optimizer_offload)"


def _fsdp(theirs: str, ours: str) -> tuple[ForeignKey, ...]:
    """veRL's ``fsdp_config`` keys that ours lacks, and the shared ones where veRL's section sits elsewhere."""
    moved = (
        ()
        if theirs == ours
        else (
            *(
                _v(f"{theirs}.{k}", f"{ours}.{k}={{value}}", example="true", exact=True)
                for k in ("param_offload", "optimizer_offload")
            ),
            _v(f"{theirs}.*", missing=FIXED_FSDP),
        )
    )
    compute = {k: (f"{ours}.param_dtype={v}",) for k, v in DTYPES.items()}
    return (
        *moved,
        _v(f"{theirs}.dtype", by_value=compute, missing="the compute dtype (param_dtype) is bfloat16 or float32"),
        _v(
            f"{theirs}.mixed_precision.param_dtype",
            by_value=compute,
            missing="param_dtype is bfloat16 or float32",
            exact=True,
        ),
        _v(
            f"{theirs}.mixed_precision.reduce_dtype",
            by_value={k: (f"{ours}.reduce_dtype={v}",) for k, v in DTYPES.items()},
            missing="reduce_dtype is bfloat16 or float32",
            exact=True,
        ),
        _v(f"{theirs}.mixed_precision.buffer_dtype", missing="no separate buffer dtype"),
        _v(
            f"{theirs}.model_dtype",
            by_value={k: (f"{M}.dtype={v}",) for k, v in DTYPES.items()},
            note="the policy's dtype serves every role",
            missing="actor_rollout_ref.model.dtype is bfloat16 or float32",
        ),
        _v(
            f"{theirs}.fsdp_size",
            by_value={"-1": ()},
            note="veRL's -1 shards over all ranks, as FSDP2 does here",
            missing="FSDP2 shards over all data-parallel ranks (no hybrid sharding)",
            example="-1",
        ),
        _v(f"{theirs}.wrap_policy.*", missing="each decoder layer is its own FSDP2 unit"),
        *(_v(f"{theirs}.{k}", missing=FIXED_FSDP) for k in ("offload_policy", "forward_prefetch", "use_orig_params")),
        *_engine_keys(theirs),
        _v(f"{theirs}.seed", "trainer.seed={value}", note="one seed for initialization, data order and sampling"),
        _v(
            f"{theirs}.full_determinism",
            by_value={"false": ()},
            missing="runs are seeded, not bitwise deterministic (no torch.use_deterministic_algorithms)",
        ),
        _v(f"{theirs}.forward_only", ignored="the role decides: the reference runs forwards only, the actor trains"),
    )


def _engine_keys(p: str) -> tuple[ForeignKey, ...]:
    """veRL's engine settings of a role, one rule each wherever veRL has them: under the role's ``fsdp_config``
    (its current spelling) and, for the actor and the reference, under the role itself (the older one)."""
    return (
        _v(
            f"{p}.strategy",
            by_value={"fsdp": (), "fsdp2": ()},
            note=ONE_BACKEND,
            missing=ONE_BACKEND + " (no Megatron)",
        ),
        _v(f"{p}.use_torch_compile", ignored=COMPILE),
        _v(f"{p}.ulysses_sequence_parallel_size", by_value={"1": ()}, missing=NO_SP),
        _v(f"{p}.entropy_from_logits_with_chunking", by_value={"false": ()}, missing=UNCHUNKED),
        _v(f"{p}.entropy_checkpointing", by_value={"false": ()}, missing=UNCHUNKED),
    )


VERL_KEYS: tuple[ForeignKey, ...] = (
    *_optim(f"{A}.optim"),
    *_optim("critic.optim"),
    *_fsdp(f"{A}.fsdp_config", f"{A}.fsdp_config"),
    *_fsdp("actor_rollout_ref.ref.fsdp_config", "actor_rollout_ref.ref.fsdp_config"),
    *_fsdp("critic.model.fsdp_config", "critic.fsdp_config"),
    *_fsdp("reward_model.model.fsdp_config", "reward_model.model.fsdp_config"),
    # actor
    _v(f"{A}.ppo_micro_batch_size", f"{A}.ppo_micro_batch_size_per_gpu", note=PER_RANK),
    _v(
        f"{A}.clip_ratio",
        LOSS + ".clip_ratio_low={value}",
        LOSS + ".clip_ratio_high={value}",
        note=LOSS_OPTION,
        example="0.2",
        exact=True,
    ),
    _v(f"{A}.clip_ratio_low", LOSS + ".clip_ratio_low={value}", note=LOSS_OPTION, example="0.2", exact=True),
    _v(f"{A}.clip_ratio_high", LOSS + ".clip_ratio_high={value}", note=LOSS_OPTION, example="0.28", exact=True),
    _v(
        f"{A}.clip_ratio_c",
        LOSS + ".clip_ratio_c={value}",
        note=LOSS_OPTION + " (dual clip)",
        example="3.0",
        exact=True,
    ),
    _v(
        f"{A}.tau_pos",
        LOSS + ".tau_pos={value}",
        note="an option of the sapo loss",
        checked_with=(f"{A}.policy_loss=sapo",),
        exact=True,
    ),
    _v(
        f"{A}.tau_neg",
        LOSS + ".tau_neg={value}",
        note="an option of the sapo loss",
        example="1.05",
        checked_with=(f"{A}.policy_loss=sapo",),
        exact=True,
    ),
    _v(f"{A}.policy_loss.loss_mode", f"{A}.policy_loss={{value}}", example="gspo", exact=True),
    *(
        _v(
            f"{A}.policy_loss.{k}",
            LOSS + f".{k}={{value}}",
            note="an option of the clip_cov loss",
            example=x,
            checked_with=(f"{A}.policy_loss=clip_cov",),
            exact=True,
        )
        for k, x in (("clip_cov_ratio", "0.0002"), ("clip_cov_lb", "1.0"), ("clip_cov_ub", "5.0"))
    ),
    *(
        _v(
            f"{A}.policy_loss.{k}",
            LOSS + f".{k}={{value}}",
            note="an option of the kl_cov loss",
            example=x,
            checked_with=(f"{A}.policy_loss=kl_cov",),
            exact=True,
        )
        for k, x in (("kl_cov_ratio", "0.0002"), ("ppo_kl_coef", "0.1"))
    ),
    *_engine_keys(A),
    _v(
        f"{A}.checkpoint.save_contents",
        "trainer.save_hf_on_end",
        note="a checkpoint holds the sharded model, optimizer and data position; 'hf_model' is "
        "trainer.save_hf_on_end=true, or hybridflow export of a checkpoint",
    ),
    *(_v(f"{role}.checkpoint.*", missing=WHOLE_CHECKPOINT) for role in (A, "critic")),
    _v(f"{A}.grad_clip", A + ".optim.grad_clip={value}", exact=True),
    _v(f"{A}.data_loader_seed", "trainer.seed={value}", note="one seed for initialization, data order and sampling"),
    # reference
    _v("actor_rollout_ref.ref.log_prob_micro_batch_size", f"{R}.log_prob_micro_batch_size_per_gpu", note=PER_RANK),
    *(
        _v(
            f"actor_rollout_ref.ref.{k}",
            f"{R}.{k}={{value}}",
            example=x,
            exact=True,
            note="the reference's forward passes are micro-batched as the actor's old-log-prob pass",
        )
        for k, x in (
            ("log_prob_use_dynamic_bsz", "true"),
            ("log_prob_max_token_len_per_gpu", "32768"),
            ("log_prob_micro_batch_size_per_gpu", "16"),
        )
    ),
    *_engine_keys("actor_rollout_ref.ref"),
    # rollout
    _v(f"{R}.log_prob_micro_batch_size", f"{R}.log_prob_micro_batch_size_per_gpu", note=PER_RANK),
    _v(f"{R}.prompt_length", "data.max_prompt_length={value}", example="32", exact=True),
    _v(f"{R}.dtype", f"{M}.dtype", note="the rollout runs in the policy's dtype"),
    _v(
        f"{R}.free_cache_engine",
        R + ".enable_sleep_mode={value}",
        example="true",
        exact=True,
        note="vLLM's sleep mode, as veRL's: frees the KV cache and offloads the weights while the actor trains",
    ),
    _v(f"{R}.do_sample", by_value={"true": ()}, missing="training rollouts always sample (temperature, top_p, top_k)"),
    _v(
        f"{R}.val_kwargs.do_sample",
        by_value={"true": (f"{R}.val_greedy=false",), "false": (f"{R}.val_greedy=true",)},
        exact=True,
    ),
    *(
        _v(
            f"{R}.val_kwargs.{k}",
            missing="sampled validation (rollout.val_greedy=false) uses the training temperature, top_p and top_k",
        )
        for k in ("temperature", "top_p", "top_k")
    ),
    _v(f"{R}.val_kwargs.n", by_value={"1": ()}, missing="validation draws one response per prompt"),
    _v(
        f"{R}.multi_turn.enable",
        by_value={"true": (f"{R}.agent_loop=tool_calling",), "false": (f"{R}.agent_loop=single_turn",)},
    ),
    _v(
        f"{R}.multi_turn.max_assistant_turns",
        f"+{R}.agent.options={{max_turns:{{value}}}}",
        example="4",
        checked_with=(f"{R}.agent_loop=tool_calling",),
    ),
    _v(
        f"{R}.multi_turn.tool_config_path",
        f"{R}.agent.tools",
        note="tools are plugins, listed by name (built-ins: calculator, python, reveal; docs/writing-an-agent.md)",
    ),
    _v(f"{R}.multi_turn.*", missing=NO_MULTI_TURN),
    # veRL's agent-loop workers: here the loops are coroutines on the driver, resolved by name
    _v(f"{R}.agent.num_workers", missing="agent loops run as coroutines on the driver, not in agent-loop workers"),
    _v(
        f"{R}.agent.agent_loop_config_path",
        f"{R}.agent_loop",
        note="agent loops are plugins named by rollout.agent_loop",
    ),
    *(_v(f"{R}.{k}", missing=NO_VLLM_ARG) for k in ("engine_kwargs", "engine_kwargs.*")),
    _v(f"{R}.max_num_batched_tokens", ignored="how many tokens vLLM schedules at once, not what it samples"),
    _v(f"{R}.enable_prefix_caching", ignored="vLLM reusing a shared prefix's cache: the same tokens, sooner"),
    _v(f"{R}.max_model_len", ignored="vLLM's context here is data.max_prompt_length + rollout.response_length"),
    _v(
        f"{R}.data_parallel_size",
        f"{R}.tensor_model_parallel_size",
        note="the rollout's data-parallel size is the ranks / rollout.tensor_model_parallel_size",
    ),
    _v(
        f"{R}.enable_chunked_prefill",
        ignored="how vLLM schedules long prompts, not what it samples; its own default (on) is kept",
    ),
    _v(f"{R}.pipeline_model_parallel_size", missing="the rollout splits the model by tensor parallelism only"),
    _v(f"{R}.expert_parallel_size", missing="the rollout splits the model by tensor parallelism only"),
    _v(
        f"{R}.checkpoint_engine.update_weights_bucket_megabytes",
        R + ".reshard_bucket_mb={value}",
        example="64",
        exact=True,
    ),
    _v(f"{R}.update_weights_bucket_megabytes", R + ".reshard_bucket_mb={value}", example="64", exact=True),
    _v(
        f"{R}.load_format",
        ignored="the rollout receives the actor's weights in memory before it first generates; "
        "nothing is loaded in a format of its own",
    ),
    _v(
        f"{R}.layered_summon",
        ignored="weights move to the rollout in buckets of rollout.reshard_bucket_mb, never gathered whole",
    ),
    _v(
        "actor_rollout_ref.nccl_timeout",
        "trainer.timeouts.collective_s={value}",
        example="600",
        exact=True,
        note="seconds in both; it bounds gloo's collectives too",
    ),
    # model
    # lora_rank, lora_alpha, target_modules, exclude_modules, lora_adapter_path: keys of ours, same names
    _v(f"{M}.trust_remote_code", by_value={"false": ()}, missing="models and tokenizers load without remote code"),
    _v(f"{M}.tokenizer_path", missing="the tokenizer is loaded from actor_rollout_ref.model.path"),
    _v(f"{M}.override_config", missing="the model's config is used as saved"),
    _v(f"{M}.override_config.*", missing="the model's config is used as saved"),
    _v(f"{M}.external_lib", missing="no library is imported before the model loads"),
    _v(f"{M}.custom_chat_template", missing="prompts use the tokenizer's own chat template"),
    *(
        _v(key, by_value={"false": ()}, missing=NO_FUSED)
        for key in (f"{M}.use_liger", f"{M}.use_fused_kernels", f"{A}.use_fused_kernels")
    ),
    _v(f"{M}.fused_kernel_options.*", missing="no Liger or fused kernels"),
    _v(
        f"{M}.torch_dtype",
        by_value={k: (f"{M}.dtype={v}",) for k, v in DTYPES.items()},
        exact=True,
        note="the dtype the policy computes and generates in",
        missing="actor_rollout_ref.model.dtype is bfloat16 or float32",
        example="bfloat16",
    ),
    _v(f"{M}.use_shm", ignored="the model loads from its directory (no copy to shared memory first)"),
    _v(f"{M}.enable_activation_offload", missing="no activation offload"),
    _v(
        "actor_rollout_ref.hybrid_engine",
        by_value={"true": ()},
        note="the actor and the rollout always share ranks",
        missing="the actor and the rollout always share ranks; no separate rollout pool",
    ),
    # data
    _v("data.max_response_length", R + ".response_length={value}", example="16", exact=True),
    _v("data.prompt_key", by_value={"prompt": ()}, missing="the prompt column is always 'prompt' (data/loading.py)"),
    _v("data.reward_fn_key", by_value={"data_source": ()}, missing="routing always reads data_source (reward.route)"),
    _v(
        "data.filter_overlong_prompts",
        by_value={"true": ()},
        note="prompts over data.max_prompt_length are always dropped (and counted)",
        missing="prompts over data.max_prompt_length are always dropped (and counted)",
    ),
    _v("data.filter_overlong_prompts_workers", missing="prompts are tokenized once, in the driver"),
    _v(
        "data.truncation",
        by_value={"error": ()},
        note="prompts over data.max_prompt_length are dropped (and counted) before any could be truncated, as with "
        "veRL's filter_overlong_prompts",
        missing="prompts are never truncated: over-long ones are dropped (data.max_prompt_length)",
    ),
    _v(
        "data.return_raw_chat",
        ignored="the driver renders each prompt's messages with the chat template; agent loops "
        "and the server receive the messages themselves",
    ),
    _v("data.trust_remote_code", by_value={"false": ()}, missing="tokenizers load without remote code"),
    _v("data.seed", "trainer.seed={value}", note="one seed for initialization, data order and sampling"),
    _v("data.train_max_samples", missing="every row of the files is used; write a smaller file to use fewer"),
    _v("data.val_max_samples", missing="every row of the files is used; write a smaller file to use fewer"),
    _v("data.dataloader_num_workers", ignored="prompts are loaded and tokenized once, in the driver"),
    *(
        _v(
            f"data.{k}.*",
            missing="datasets are parquet files in veRL's schema (data/loading.py); no custom dataset, "
            "sampler or generator classes",
        )
        for k in ("custom_cls", "sampler", "datagen")
    ),
    _v("data.tokenizer", missing="the tokenizer is the model's (actor_rollout_ref.model.path)"),
    *(
        _v(f"data.{k}", missing="text only: no images or video")
        for k in ("image_key", "video_key", "return_multi_modal_inputs")
    ),
    _v("data.apply_chat_template_kwargs", missing="the chat template is applied without extra arguments"),
    _v("data.apply_chat_template_kwargs.*", missing="the chat template is applied without extra arguments"),
    _v("data.gen_batch_size", missing="no separate generation batch: each roll-out is data.train_batch_size prompts"),
    # reward
    _v("reward_model.strategy", by_value={"fsdp": (), "fsdp2": ()}, note=ONE_BACKEND, missing=ONE_BACKEND),
    _v("reward_model.micro_batch_size", "reward_model.micro_batch_size_per_gpu", note=PER_RANK),
    _v(
        "reward_model.model.input_tokenizer",
        ignored="the policy's tokenizer is actor_rollout_ref.model.path's; "
        "the reward model's is compared with it, and responses are re-rendered when they differ",
    ),
    _v(
        "reward_model.model.use_remove_padding",
        ignored="reward-model micro-batches are right-padded to their longest row",
    ),
    *(
        _v(f"reward_model.model.{k}", ignored="nothing to set: the reward model loads with transformers' defaults")
        for k in ("use_shm", "use_fused_kernels")
    ),
    _v(
        "reward_model.model.trust_remote_code",
        by_value={"false": ()},
        missing="reward models load with transformers' own classes (no remote code)",
    ),
    _v("reward_model.model.external_lib", missing="reward models load with transformers' own classes"),
    _v("reward_model.ulysses_sequence_parallel_size", by_value={"1": ()}, missing=NO_SP),
    _v(
        "reward_model.launch_reward_fn_async",
        by_value={"false": ()},
        missing="the reward runs in the step, the verifiers in their process pool (reward.num_workers)",
    ),
    *(_v(f"reward_model.{k}", missing=RM_COLOCATED) for k in ("enable_resource_pool", "n_gpus_per_node", "nnodes")),
    *(_v(f"reward_model.{k}", missing=GEN_RM) for k in ("rollout.*", "num_workers")),
    _v("reward_model.use_reward_loop", by_value={"false": ()}, missing=GEN_RM),
    *(
        _v(
            f"{section}",
            by_value={"naive": (), "prime": ("reward.num_workers",), "dapo": ("reward.overlong_buffer.enable=true",)},
            note="one reward manager here: reward.num_workers processes, a hard timeout per sample, "
            "reward.overlong_buffer for DAPO's length penalty",
            missing="verifiers score one response at a time; no batch reward manager",
            checked_with=(LONGER,),
        )
        for section in ("reward_model.reward_manager", "reward_manager.name", "reward.reward_manager.name")
    ),
    _v(
        "reward_manager.*",
        missing="a custom reward manager is a verifier plugin here "
        "(hybridflow_register_reward_verifiers; docs/writing-a-reward.md)",
    ),
    *(
        _v(f"{p}.{k}", f"reward.overlong_buffer.{k}={{value}}", example=x, checked_with=(LONGER,), exact=True)
        for p in (*OVERLONG_CFG, "reward_model.overlong_buffer")
        for k, x in (("enable", "true"), ("len", "4"), ("penalty_factor", "1.0"))
    ),
    *(
        _v(
            f"{p}.log",
            ignored="the overlong penalty is always logged (reward/overlong_penalty/mean, reward/overlong/frac)",
        )
        for p in OVERLONG_CFG
    ),
    *(
        _v(f"{p}.max_resp_len", f"{R}.response_length", note="the overlong zone ends at rollout.response_length")
        for p in ("reward_model.reward_kwargs", "reward.reward_kwargs")
    ),
    _v(
        "reward_model.sandbox_fusion.*",
        missing="code runs in the code verifier's local sandbox (docs/reliability.md); no SandboxFusion service",
    ),
    _v("custom_reward_function.path", "reward.custom_reward_function.path={value}", example="my_score.py", exact=True),
    _v(
        "custom_reward_function.name", "reward.custom_reward_function.name={value}", example="compute_score", exact=True
    ),
    _v(
        "custom_reward_function.reward_kwargs",
        "+reward.custom_reward_function.kwargs={value}",
        example="{a:1}",
        exact=True,
    ),
    _v("custom_reward_function.reward_kwargs.*", "+reward.custom_reward_function.kwargs.{rest}={value}", exact=True),
    # algorithm
    _v(
        "algorithm.gamma",
        "+algorithm.estimator_options.gamma={value}",
        example="0.99",
        note="an option of the estimators that discount (gae, reinforce_plus_plus)",
        checked_with=("algorithm.adv_estimator=gae",),
        exact=True,
    ),
    _v(
        "algorithm.lam",
        "+algorithm.estimator_options.lam={value}",
        note="an option of gae",
        example="0.95",
        checked_with=("algorithm.adv_estimator=gae",),
        exact=True,
    ),
    _v(
        "algorithm.norm_adv_by_std_in_grpo",
        by_value={"true": (), "false": ("+algorithm.estimator_options.norm_by_std=false",)},
        note="an option of grpo; algorithm.adv_estimator=dr_grpo also drops the std and aggregates the loss as Dr.GRPO",
        exact=True,
    ),
    _v("algorithm.use_pf_ppo", by_value={"false": ()}, missing="no reweighted resampling of the batch"),
    _v("algorithm.pf_ppo.*", missing="no reweighted resampling of the batch"),
    _v(
        "algorithm.filter_groups.enable",
        by_value={"true": ("'algorithm.batch_hooks=[dynamic_sampling]'",), "false": ()},
        note="DAPO's dynamic sampling is the dynamic_sampling batch hook",
        exact=True,
    ),
    _v(
        "algorithm.filter_groups.metric",
        by_value={
            "score": ("+algorithm.batch_hook_options.dynamic_sampling.metric=score",),
            "seq_reward": ("+algorithm.batch_hook_options.dynamic_sampling.metric=reward",),
            "seq_final_reward": ("+algorithm.batch_hook_options.dynamic_sampling.metric=reward",),
        },
        missing="dynamic_sampling compares the verifiers' score or the reward after the KL penalty",
        checked_with=("algorithm.batch_hooks=[dynamic_sampling]",),
        exact=True,
    ),
    _v(
        "algorithm.filter_groups.max_num_gen_batches",
        "algorithm.max_rollout_batches={value}",
        example="4",
        note="at least 1 here (veRL's 0 is no limit); at the cap the batch is topped up with dropped groups",
    ),
    _v(
        "algorithm.rollout_correction.rollout_rs",
        "algorithm.rollout_correction.rollout_is_mode",
        note="dropping tokens or sequences outside the bounds is rollout_is_mode=mask here",
    ),
    _v(
        "algorithm.rollout_correction.rollout_rs_threshold",
        "algorithm.rollout_correction.rollout_is_threshold",
        note="one upper bound (and rollout_is_threshold_lower) for truncation and masking",
    ),
    # critic
    _v("critic.ppo_mini_batch_size", f"{A}.ppo_mini_batch_size", note="the critic steps on the actor's mini-batches"),
    _v("critic.ppo_epochs", f"{A}.ppo_epochs", note="the critic takes the actor's epochs"),
    _v("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu", note=PER_RANK),
    _v(
        "critic.forward_micro_batch_size_per_gpu",
        "critic.ppo_micro_batch_size_per_gpu",
        note="one micro-batch size for the critic's forward passes and its update",
    ),
    _v("critic.forward_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu", note=PER_RANK),
    _v("critic.grad_clip", "critic.optim.grad_clip={value}", exact=True),
    _v(
        "critic.model.enable_gradient_checkpointing",
        M + ".enable_gradient_checkpointing={value}",
        example="true",
        note="one switch for the actor and the critic",
        exact=True,
    ),
    _v(
        "critic.model.use_remove_padding",
        M + ".use_remove_padding={value}",
        example="false",
        note="one switch for the actor, the reference and the critic",
        exact=True,
    ),
    *(
        _v(
            f"critic.model.{k}",
            f"critic.{k}={{value}}",
            exact=True,
            example=example,
            note="the critic's LoRA keys sit in critic. (its model is the policy's)",
        )
        for k, example in (
            ("lora_rank", "8"),
            ("lora_alpha", "16"),
            ("target_modules", "all-linear"),
            ("exclude_modules", "[o_proj]"),
        )
    ),
    _v(
        "critic.model.path",
        same_as=f"{M}.path",
        example="/models/policy",
        missing="the critic is a copy of the policy with a one-output value head: its path is "
        "actor_rollout_ref.model.path (a separate critic checkpoint is not supported)",
    ),
    _v(
        "critic.model.*",
        missing="the critic is a copy of the policy (actor_rollout_ref.model.path, its dtype) "
        "with a one-output value head; it has no model settings of its own",
    ),
    _v(
        "critic.loss_scale_factor",
        f"{A}.loss_scale_factor={{value}}",
        example="16",
        note="one constant for the actor's and the critic's seq-mean-token-sum-norm (veRL's critic takes the "
        "actor's unless set)",
    ),
    _v("critic.strategy", by_value={"fsdp": (), "fsdp2": ()}, note=ONE_BACKEND, missing=ONE_BACKEND + " (no Megatron)"),
    _v("critic.ulysses_sequence_parallel_size", by_value={"1": ()}, missing=NO_SP),
    # trainer
    _v("trainer.val_only", missing="no validation-only run"),
    _v(
        "trainer.resume_from_path",
        "trainer.resume_mode",
        note="give the checkpoint directory as trainer.resume_mode=<dir>",
    ),
    _v(
        "trainer.max_actor_ckpt_to_keep",
        "trainer.max_ckpt_to_keep={value}",
        note="one limit for every role",
        example="2",
        exact=True,
    ),
    _v(
        "trainer.max_critic_ckpt_to_keep",
        "trainer.max_ckpt_to_keep={value}",
        note="one limit for every role",
        example="2",
    ),
    _v(
        "trainer.critic_warmup", by_value={"0": ()}, missing="the actor updates from the first step (no critic warm-up)"
    ),
    _v(
        "trainer.balance_batch",
        ignored="rows are not reordered to even out the ranks' tokens (veRL's throughput knob): each rank updates "
        "on the rows it is dealt, with the losses normalized over all ranks",
    ),
    _v("trainer.rollout_data_dir", missing="training generations are not written to files"),
    _v(
        "trainer.validation_data_dir",
        "trainer.log_val_generations",
        note="the first N validation rows go to val_generations.jsonl in the run directory (and the other sinks)",
    ),
    _v("trainer.default_hdfs_dir", missing="checkpoints go to local disk (trainer.default_local_dir)"),
    _v("trainer.use_legacy_worker_impl", ignored="one worker implementation"),
    # veRL 0.8's keys (tests/trainer/data/verl_0.8.0.dev_ppo_trainer_keys.txt lists them all)
    *(
        _v(f"{role}.profiler.{k}", by_value={"false": ()}, missing=NO_PROFILER, example="false")
        for role in ROLES
        for k in ("enable", "all_ranks")
    ),
    *(
        _v(f"{role}.profiler.*", ignored="a profiler setting acts only with profiler.enable=true: " + NO_PROFILER)
        for role in ROLES
    ),
    *(
        _v(f"{role}.router_replay.*", by_value={"disabled": (), "null": (), "none": ()}, missing=NO_MOE, example="null")
        for role in (A, "actor_rollout_ref.ref")
    ),
    _v(f"{R}.enable_rollout_routing_replay", by_value={"false": ()}, missing=NO_MOE),
    *(
        _v(f"{role}.rollout_n", f"{R}.n", note="veRL fills it in from rollout.n; here rollout.n alone")
        for role in (A, "actor_rollout_ref.ref", "critic")
    ),
    _v(f"{A}.freeze_vision_tower", by_value={"false": ()}, missing="text-only models: no vision tower"),
    _v(
        f"{A}.calculate_entropy",
        ignored="the entropy is computed where the loss needs it (entropy_coeff) and reported as actor/entropy",
    ),
    _v(
        f"{A}.use_prefix_grouper",
        by_value={"true": (f"{M}.share_prompts=true",), "false": ()},
        exact=True,
        note="a prompt shared by its group's responses is computed once; the numbers are the same",
    ),
    _v(f"{A}.use_remove_padding", M + ".use_remove_padding={value}", example="true", exact=True),
    _v(
        f"{A}.calculate_sum_pi_squared",
        ignored="computed when the advantage estimator declares the sum_pi_squared input (plugins/entries.py)",
    ),
    _v(f"{A}.sum_pi_squared_checkpointing", by_value={"false": ()}, missing=UNCHUNKED),
    _v(f"{R}.cudagraph_capture_sizes", ignored="vLLM's CUDA-graph sizes: a speed setting, left to vLLM"),
    _v(
        f"{R}.logprobs_mode",
        by_value={"processed_logprobs": ()},
        missing="the rollout's log-probs are the processed ones (after temperature)",
        example="processed_logprobs",
    ),
    _v(f"{R}.scheduling_policy", by_value={"fcfs": ()}, missing="vLLM schedules first come, first served"),
    _v(f"{R}.disable_log_stats", ignored="vLLM's own stats lines; its engine's numbers are logged as rollout/*"),
    _v(f"{R}.over_sample_rate", by_value={"0": ()}, missing="each step generates its batch, no over-sampling"),
    _v(f"{R}.multi_stage_wake_up", ignored="vLLM wakes its weights first, then its KV cache, always"),
    _v(f"{R}.calculate_log_probs", ignored="the rollout's log-probs are always returned (rollout_log_probs)"),
    _v(
        f"{R}.agent.default_agent_loop",
        by_value={"single_turn_agent": ()},
        missing=NO_MULTI_TURN,
        example="single_turn_agent",
    ),
    _v(f"{R}.agent.custom_async_server.*", by_value={"null": (), "none": ()}, missing=NO_SERVER, example="null"),
    _v(
        f"{R}.checkpoint_engine.*",
        by_value={"naive": (), "{}": ()},
        missing="weights move to the rollout in memory (the reshard; the transfer with trainer.placement=split)",
        example="naive",
    ),
    _v(
        f"{R}.trace.*",
        by_value={"null": (), "none": (), "false": ()},
        missing="no rollout tracing; trainer.log_val_generations writes samples",
        example="null",
    ),
    _v(f"{R}.skip_rollout", by_value={"false": ()}, missing="every step generates its rollouts"),
    _v(f"{R}.skip_dump_dir", ignored="acts only with skip_rollout=true, which is refused here"),
    _v(f"{R}.skip_tokenizer_init", ignored="the rollout takes and returns token ids either way"),
    _v(f"{R}.prometheus.enable", by_value={"false": ()}, missing="no Prometheus export; metrics go to trainer.logger"),
    _v(f"{R}.prometheus.*", ignored="acts only with prometheus.enable=true, which is refused here"),
    *(
        _v(f"{R}.{k}", by_value={"null": (), "none": ()}, missing="no quantized rollout", example="null")
        for k in ("quantization", "quantization_config_file")
    ),
    _v(f"{R}.mtp", by_value={"null": (), "none": ()}, missing="no multi-token prediction", example="null"),
    _v(f"{M}.mtp.*", by_value={"false": ()}, missing="no multi-token prediction", example="false"),
    _v(f"{M}.hf_config_path", by_value={"null": (), "none": ()}, missing="the config is read from model.path"),
    _v(f"{M}.tiled_mlp.enabled", by_value={"false": ()}, missing="no tiled MLP"),
    _v(f"{M}.tiled_mlp.*", ignored="acts only with tiled_mlp.enabled=true, which is refused here"),
    _v("data.use_shm", ignored="data files are read from disk (no copy to shared memory first)"),
    _v("data.tool_config_path", by_value={"null": (), "none": ()}, missing=NO_MULTI_TURN, example="null"),
    _v(
        "data.return_raw_input_ids",
        ignored="a reward model whose tokenizer differs gets the responses re-rendered from their text",
    ),
    _v("data.return_full_prompt", ignored="each prompt's messages travel with the batch"),
    _v("data.image_patch_size", ignored="text-only data: no images to cut into patches"),
    _v("data.validation_shuffle", by_value={"false": ()}, missing="validation prompts run in file order"),
    _v("critic.shuffle", f"{A}.shuffle", note="the critic's mini-batches are drawn in the actor's order"),
    _v("critic.data_loader_seed", "trainer.seed={value}", note="one seed for initialization, data order and sampling"),
    _v("reward_model.model.override_config.*", missing="the model's config is used as saved"),
    _v("reward_model.model.override_config", by_value={"{}": ()}, missing="the model's config is used as saved"),
    _v(
        "reward_model.reward_loop_source",
        by_value={"register": ()},
        missing=REWARD_LOOP,
        example="register",
    ),
    *(
        _v(
            f"reward_model.{k}",
            by_value={"null": (), "none": ()},
            missing=REWARD_LOOP,
            example="null",
        )
        for k in ("reward_loop_module_path", "reward_loop_class_name")
    ),
    _v("trainer.esi_redundant_time", ignored="veRL's margin before an expiring instance; checkpoints follow save_freq"),
    _v(
        "trainer.del_local_ckpt_after_load",
        by_value={"false": ()},
        missing="checkpoints are kept; trainer.max_ckpt_to_keep prunes the oldest",
    ),
    _v(
        "trainer.ray_wait_register_center_timeout",
        ignored="the ranks' process groups start within trainer.timeouts.collective_s",
    ),
    _v("transfer_queue.enable", by_value={"false": ()}, missing="batches travel through Ray's object store"),
    _v(
        "ray_kwargs.ray_init.runtime_env.py_executable",
        by_value={"null": (), "none": ()},
        missing="Ray's workers run this Python (the runtime environment is not configurable here)",
        example="null",
    ),
    _v("ray_kwargs.*", missing="Ray starts with its defaults (a fresh local instance, or trainer.ray_address)"),
    _v("global_profiler.*", missing="no profiler integration"),
)

TRL_NAMES: tuple[ForeignKey, ...] = (
    _t("learning_rate", A + ".optim.lr={value}", example="1e-6"),
    _t("num_generations", R + ".n={value}", example="8"),
    _t(
        "num_generations_eval",
        missing="validation draws one response per prompt (greedy unless rollout.val_greedy=false)",
    ),
    _t("max_completion_length", R + ".response_length={value}", example="16"),
    _t(
        "max_prompt_length",
        "data.max_prompt_length={value}",
        example="32",
        note="longer prompts are dropped and counted, not truncated; recent TRL has no such argument",
    ),
    _t(
        "beta",
        A + ".use_kl_loss=true",
        A + ".kl_loss_coef={value}",
        by_value={"0": (), "0.0": ()},
        example="0.04",
        note="the k3 estimator, as TRL's (actor.kl_loss_type=low_var_kl, the default)",
        value_notes={
            "0": "no KL term and no reference is the default here",
            "0.0": "no KL term and no reference is the default here",
        },
    ),
    _t(
        "epsilon",
        LOSS + ".clip_ratio_low={value}",
        LOSS + ".clip_ratio_high={value}",
        example="0.2",
        note="TRL's epsilon is both bounds unless epsilon_high is set",
    ),
    _t(
        "epsilon_high",
        LOSS + ".clip_ratio_high={value}",
        example="0.28",
        note="with loss_type=cispo TRL's epsilon_high caps the ratio itself: clip_ratio_high = epsilon_high - 1",
    ),
    _t(
        "delta",
        LOSS + ".clip_ratio_c={value}",
        example="4.0",
        note="the vanilla loss's dual clip caps the ratio of negative-advantage tokens at clip_ratio_c, as delta does",
    ),
    _t(
        "loss_type",
        by_value={
            "dapo": (f"{A}.loss_agg_mode=token-mean",),
            "bnpo": (f"{A}.loss_agg_mode=token-mean-local",),
            "grpo": (f"{A}.loss_agg_mode=seq-mean-token-mean",),
            "dr_grpo": (f"{A}.loss_agg_mode=seq-mean-token-sum-norm",),
            "cispo": (f"{A}.policy_loss=cispo", f"{A}.loss_agg_mode=token-mean", LOSS + ".clip_ratio_low=1.0"),
            "sapo": (f"{A}.policy_loss=sapo", f"{A}.loss_agg_mode=seq-mean-token-mean"),
        },
        note="a TRL loss type is a policy loss and an aggregation mode here (losses/aggregation.py)",
        value_notes={
            "dr_grpo": "the constant is rollout.response_length, TRL's max_completion_length",
            "grpo": "fully masked rows do not count here; TRL counts them",
            "cispo": "TRL clamps the weight from above only (clip_ratio_low=1.0: no lower bound); its "
            "epsilon_high is 1 + clip_ratio_high",
        },
        missing="the loss types here are dapo, bnpo, grpo, dr_grpo, cispo and sapo (no luspo or vespo)",
    ),
    _t(
        "scale_rewards",
        by_value={
            "group": ("algorithm.adv_estimator=grpo",),
            "true": ("algorithm.adv_estimator=grpo",),
            "none": ("+algorithm.estimator_options.norm_by_std=false",),
            "false": ("+algorithm.estimator_options.norm_by_std=false",),
            "batch": ("algorithm.adv_estimator=reinforce_plus_plus_baseline",),
        },
        value_notes={
            "batch": "the closest match: REINFORCE++-baseline whitens the group-centred rewards over the "
            "batch's tokens, TRL divides them by the std of the batch's rewards"
        },
        missing="scale_rewards is group, batch or none",
    ),
    _t(
        "per_device_train_batch_size",
        A + ".ppo_micro_batch_size_per_gpu={value}",
        example="16",
        note="completions per forward/backward pass on one rank in both",
    ),
    _t(
        "gradient_accumulation_steps",
        f"{A}.ppo_mini_batch_size",
        note="prompts per optimizer step = per_device_train_batch_size x ranks x gradient_accumulation_steps "
        "/ num_generations",
    ),
    _t(
        "generation_batch_size",
        "data.train_batch_size",
        note="prompts per step: generation_batch_size / num_generations",
    ),
    _t(
        "steps_per_generation",
        f"{A}.ppo_mini_batch_size",
        note="optimizer steps per generation = data.train_batch_size / actor.ppo_mini_batch_size",
    ),
    _t("num_iterations", A + ".ppo_epochs={value}"),
    _t("temperature", R + ".temperature={value}", example="1.0"),
    _t("top_p", R + ".top_p={value}", example="1.0"),
    _t("top_k", R + ".top_k={value}", example="0", note="0 disables it in both"),
    *(
        _t(k, missing="sampling takes temperature, top_p and top_k only")
        for k in ("min_p", "repetition_penalty", "generation_kwargs")
    ),
    _t("seed", "trainer.seed={value}", note="one seed for initialization, data order and sampling"),
    _t("logging_steps", by_value={"1": ()}, missing="every step's metrics are logged; no logging interval"),
    _t("save_steps", "trainer.save_freq={value}", note=STEPS, example="50"),
    _t("save_total_limit", "trainer.max_ckpt_to_keep={value}", example="2"),
    _t(
        "save_strategy",
        by_value={"no": ("trainer.save_freq=0",), "steps": ("trainer.save_freq",)},
        missing="checkpoints are written every trainer.save_freq steps; no per-epoch schedule",
    ),
    _t("eval_steps", "trainer.test_freq={value}", note=STEPS, example="10"),
    _t(
        "eval_strategy",
        by_value={"no": ("trainer.test_freq=0",), "steps": ("trainer.test_freq",)},
        missing="validation runs every trainer.test_freq steps; no per-epoch schedule",
    ),
    _t(
        "eval_on_start",
        "trainer.val_before_train={value}",
        example="false",
        note="validation before the first step, when trainer.test_freq > 0 (true by default here)",
    ),
    _t(
        "report_to",
        by_value={
            "none": ("'trainer.logger=[console,jsonl]'",),
            "wandb": ("'trainer.logger=[console,jsonl,wandb]'",),
            "tensorboard": ("'trainer.logger=[console,jsonl,tensorboard]'",),
            "all": ("'trainer.logger=[console,jsonl,wandb,tensorboard]'",),
        },
        missing="trainer.logger takes console, jsonl, wandb and tensorboard",
    ),
    _t("run_name", "trainer.run_name={value}", example="grpo-run"),
    _t(
        "output_dir",
        "hydra.run.dir={value}",
        example="outputs/grpo-run",
        note="a run writes its metrics and checkpoints in its Hydra run directory",
    ),
    _t(
        "use_vllm",
        by_value={"true": ("rollout@actor_rollout_ref.rollout=vllm", "trainer=gpu"), "false": (f"{R}.name=builtin",)},
        value_notes={
            "true": "colocated on the training GPUs (on CPUs: trainer=cpu with vLLM's CPU build, docs/vllm.md)"
        },
        checked_with=(f"{M}.path=/models/Qwen2.5-0.5B-Instruct",),
    ),
    _t("vllm_mode", by_value={"colocate": ()}, note="vLLM shares the training ranks", missing=NO_SERVER),
    _t("vllm_gpu_memory_utilization", R + ".gpu_memory_utilization={value}", example="0.3"),
    _t(
        "vllm_tensor_parallel_size",
        R + ".tensor_model_parallel_size={value}",
        example="2",
        note="the same size for both rollout engines",
    ),
    _t("vllm_enable_sleep_mode", R + ".enable_sleep_mode={value}", example="true"),
    _t("vllm_max_model_length", missing=NO_VLLM_ARG),
    *(
        _t(k, missing=NO_SERVER)
        for k in (
            "vllm_server_base_url",
            "vllm_server_host",
            "vllm_server_port",
            "vllm_server_timeout",
            "vllm_group_port",
        )
    ),
    _t(
        "vllm_importance_sampling_correction",
        "algorithm.rollout_correction.rollout_is",
        by_value={"false": ("algorithm.rollout_correction.rollout_is=null",)},
        note="choose the level and mode as vllm_importance_sampling_mode does; off by default here",
    ),
    _t(
        "vllm_importance_sampling_mode",
        by_value={
            f"{level}_{mode}": (
                f"algorithm.rollout_correction.rollout_is={level}",
                f"algorithm.rollout_correction.rollout_is_mode={mode}",
            )
            for level in ("token", "sequence")
            for mode in ("truncate", "mask")
        },
    ),
    *(
        _t(k, "algorithm.rollout_correction.rollout_is_threshold={value}", example="3.0")
        for k in ("vllm_importance_sampling_clip_max", "vllm_importance_sampling_cap")
    ),
    _t(
        "vllm_importance_sampling_clip_min",
        "algorithm.rollout_correction.rollout_is_threshold_lower={value}",
        example="0.5",
        note="the lower bound of rollout_is_mode=mask",
    ),
    _t(
        "mask_truncated_completions",
        by_value={"false": ()},
        missing="truncated responses stay in the loss (reward.overlong_buffer penalizes long ones instead)",
    ),
    _t(
        "importance_sampling_level",
        by_value={"token": (), "sequence": (f"{A}.policy_loss=gspo",)},
        note="a sequence-level ratio is the gspo loss, whose clip range is tiny (policy_loss_options)",
    ),
    _t(
        "reward_weights",
        "reward.route",
        note="a weighted route mixes verifiers: '+reward.route={my_data:{format:0.1,math:0.9}}'",
    ),
    _t(
        "multi_objective_aggregation",
        by_value={
            "sum_then_normalize": (),
            "normalize_then_sum": ("algorithm.adv_estimator=gdpo", "reward.component_keys"),
        },
        value_notes={
            "sum_then_normalize": "a weighted route sums its verifiers' scores before the estimator",
            "normalize_then_sum": "gdpo normalizes each field of reward.component_keys within the group, then sums",
        },
        checked_with=("reward.component_keys=[score]",),
    ),
    _t("top_entropy_quantile", by_value={"1.0": (), "1": ()}, missing="no entropy-based token mask"),
    _t(
        "entropy_coef",
        A + ".entropy_coeff={value}",
        example="0.0",
        note="TRL's entropy bonus is a per-token mean; here actor.loss_agg_mode aggregates it, as the loss",
    ),
    *(
        _t(k, missing="the entropy coefficient is fixed (actor.entropy_coeff)")
        for k in (
            "use_adaptive_entropy",
            "entropy_coef_min",
            "entropy_coef_max",
            "entropy_coef_delta",
            "entropy_target",
        )
    ),
    *(
        _t(k, missing="the reference stays the initial policy")
        for k in ("sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps")
    ),
    _t("sapo_temperature_pos", LOSS + ".tau_pos={value}", checked_with=(f"{A}.policy_loss=sapo",)),
    _t("sapo_temperature_neg", LOSS + ".tau_neg={value}", example="1.05", checked_with=(f"{A}.policy_loss=sapo",)),
    _t(
        "log_completions",
        "trainer.log_val_generations",
        note="validation prompts with their responses and scores; training completions are not logged",
    ),
    _t(
        "max_tool_calling_iterations",
        f"+{R}.agent.options={{max_turns:{{value}}}}",
        note="generations per trajectory, the last one answering",
        example="4",
        checked_with=(f"{R}.agent_loop=tool_calling",),
    ),
    _t("chat_template_kwargs", missing="the chat template is applied without extra arguments"),
    # TrainingArguments fields that GRPO runs set
    _t("num_train_epochs", "trainer.total_epochs={value}"),
    _t("max_steps", "trainer.total_training_steps={value}", note=STEPS, example="200"),
    _t("warmup_steps", A + ".optim.warmup_steps={value}", note="optimizer steps in both", example="10"),
    _t("warmup_ratio", f"{A}.optim.warmup_steps", note="a step count here: the ratio x the run's optimizer steps"),
    _t("lr_scheduler_type", by_value={"constant": (), "constant_with_warmup": ()}, note=NO_COSINE, missing=NO_COSINE),
    _t("weight_decay", A + ".optim.weight_decay={value}", example="0.0"),
    _t("adam_beta1", "'" + A + ".optim.betas=[{value},0.999]'", note="betas is one list", example="0.9"),
    _t("adam_beta2", "'" + A + ".optim.betas=[0.9,{value}]'", note="betas is one list", example="0.99"),
    _t("max_grad_norm", A + ".optim.grad_clip={value}", example="1.0"),
    _t(
        "gradient_checkpointing",
        M + ".enable_gradient_checkpointing={value}",
        example="true",
        note="one switch for the actor and the critic",
    ),
    _t(
        "bf16",
        by_value={"true": (f"{M}.dtype=bfloat16",), "false": (f"{M}.dtype=float32",)},
        note="FSDP2 mixed precision, like TRL's autocast: bfloat16 compute over float32 master weights "
        "(fsdp_config.master_dtype)",
    ),
    _t("per_device_eval_batch_size", "data.val_batch_size", note="prompts per validation generation call, all ranks"),
    _t("shuffle_dataset", "data.shuffle={value}", example="true"),
    _t(
        "resume_from_checkpoint",
        "trainer.resume_mode",
        by_value={"true": ("trainer.resume_mode=auto",)},
        note="a checkpoint directory is trainer.resume_mode=<dir>",
    ),
    _t("use_cpu", by_value={"true": ("trainer=cpu",), "false": ("trainer=gpu",)}),
    _t("model_init_kwargs", missing="only the dtype is set (actor_rollout_ref.model.dtype)"),
    _t("trust_remote_code", by_value={"false": ()}, missing="models and tokenizers load without remote code"),
    _t("use_liger_kernel", by_value={"false": ()}, missing="no Liger or fused kernels"),
    _t("deepspeed", missing=ONE_BACKEND),
    _t(
        "push_to_hub",
        by_value={"false": ()},
        missing="nothing is uploaded; trainer.save_hf_on_end=true writes a transformers directory to push",
    ),
)

TABLE: dict[str, ForeignKey] = {k.name: k for k in VERL_KEYS + TRL_NAMES}

# Keys of ours whose veRL value means something else here: ``by_value`` gives our value (always ``exact``).
VERL_VALUES: tuple[ForeignKey, ...] = (
    *(
        _v(f"trainer.{k}", by_value={"-1": (f"trainer.{k}=0",)}, exact=True, note="veRL's -1 is off; 0 here")
        for k in ("save_freq", "test_freq")
    ),
    _v(f"{R}.top_k", by_value={"-1": (f"{R}.top_k=0",)}, exact=True, note="veRL's -1 is off; 0 here"),
    _v(
        f"{R}.mode",
        by_value={"async": (f"{R}.mode=direct",), "sync": (f"{R}.mode=direct",)},
        exact=True,
        note="veRL's rollout modes are how its engine is served; here the engine is called in-process (direct), "
        "rollout.mode=server puts multi-turn agent loops behind an OpenAI-compatible server, and "
        "trainer.rollout_mode (with trainer.placement=split) overlaps generation with training",
    ),
)
VALUES: dict[str, ForeignKey] = {k.name: k for k in VERL_VALUES}


TARGET = _v(
    "*._target_",
    ignored="veRL's class for its config section (its structured configs); the sections here have fixed types",
)
"""Every ``..._target_`` key of veRL's config (one in most sections)."""


def lookup(name: str) -> tuple[ForeignKey, str] | None:
    """The entry for ``name`` (exact, else the nearest ``.*`` section above it) and the part of the key under it;
    any ``._target_`` key has :data:`TARGET`."""
    if name in TABLE:
        return TABLE[name], ""
    if name.endswith("._target_") or name == "_target_":
        return TARGET, ""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        entry = TABLE.get(".".join(parts[:i]) + ".*")
        if entry is not None:
            return entry, ".".join(parts[i:])
    return None


def _choice(value: str) -> str:
    """The form of a value ``by_value`` and ``value_notes`` are keyed by: unquoted, lower case
    (``True`` -> ``true``)."""
    return value.strip("'\"").lower()


def note_for(entry: ForeignKey, value: str) -> str:
    """How ``entry`` differs here for the foreign ``value``: its note for that value, else its general one."""
    return entry.value_notes.get(_choice(value), entry.note)


def suggestion(entry: ForeignKey, value: str, rest: str = "") -> tuple[str, ...] | None:
    """The overrides ``entry`` suggests for the foreign ``value``; None when nothing here does it."""
    chosen = entry.by_value.get(_choice(value))
    if chosen is None:
        if not entry.here:
            return None
        chosen = entry.here
    return tuple(item.replace("{value}", value).replace("{rest}", rest) for item in chosen)


def explain(name: str, value: str) -> str | None:
    """One line for the foreign key ``name`` set to ``value`` (its text on the command line); None if unknown."""
    found = lookup(name)
    if found is None:
        return None
    entry, rest = found
    head = f"{name} is {entry.origin} name"
    if entry.ignored:
        return f"{head}; it has no effect here ({entry.ignored}): leave it out"
    overrides = suggestion(entry, value, rest)
    if overrides is None:
        if entry.missing:
            return f"{head}; no equivalent yet: {entry.missing}"
        return f"{head}; here the value decides ({', '.join(entry.by_value)}), and {value} is none of those"
    note = note_for(entry, value)
    return f"{head}; here: {' '.join(overrides) or 'nothing to set'}" + (f"; {note}" if note else "")


def argv_problems(args: list[str]) -> list[str]:
    """The foreign names among raw arguments, explained: TRL-style ``--name value`` / ``--name=value`` /
    ``--name`` (true), and ``name=value`` overrides; for a command line whose Hydra flags keep it from being parsed."""
    problems = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if not eq:
                following = args[i + 1] if i + 1 < len(args) else ""
                value = following if following and not following.startswith("-") and "=" not in following else "true"
        elif "=" in arg and not arg.startswith("-"):
            name, _, value = arg.partition("=")
            name = name.lstrip("+~")
        else:
            continue
        message = explain(name, value)
        if message is not None:
            problems.append(message)
    return problems
