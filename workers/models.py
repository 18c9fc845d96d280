"""Load a causal LM and its tokenizer: from a local directory, or a built-in tiny one.

``load_model_and_tokenizer("/path/to/Qwen2.5-0.5B")`` reads an HF checkpoint
(any ``AutoModelForCausalLM`` family: Qwen2, Llama, ...) from disk; nothing
is ever downloaded. ``load_model_and_tokenizer("builtin:tiny-qwen2")`` builds a
small model from a transformers config with random (seeded) weights and a
character-level tokenizer built in code, so tests, benchmarks and the CPU demo
run on a machine without a model hub.

The built-in tokenizer has one token per character of the synthetic task's
text (digits, ``+ - * % = ( ) ,``, space, ``?`` and the letters of
``max``/``min``), 32 tokens in all with the special tokens ``<pad>``,
``<bos>``, ``<eos>``, ``<unk>`` and the role markers ``<|system|>``,
``<|user|>``, ``<|assistant|>``. Its chat template renders
``<bos><|user|>CONTENT<|assistant|>``, and a ``tool`` message (an agent
loop's observation) under the ``<|system|>`` marker, which the tiny
vocabulary has; any other character maps to ``<unk>``.
Prompts are padded on the left, as the rollout engine expects.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tok_models
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

__all__ = [
    "BUILTIN_PREFIX",
    "BUILTIN_MODELS",
    "build_char_tokenizer",
    "load_model_and_tokenizer",
    "load_model_config",
    "load_tokenizer",
]

logger = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""The parameter dtypes ``actor_rollout_ref.model.dtype`` may name."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a config name; an unknown name lists the allowed ones."""
    if name not in DTYPES:
        raise ValueError(f"model dtype {name!r} is not supported; allowed: {', '.join(DTYPES)}")
    return DTYPES[name]


SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>")
CHARACTERS = tuple("0123456789+-*%=(), ?aimnx")  # 25 + 7 specials = 32
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}<|system|>{% else %}<|{{ message['role'] }}|>{% endif %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class BuiltinModel:
    """Shape of a built-in model; the vocabulary is the built-in tokenizer's unless ``vocab_size`` pads it
    (ids past the tokenizer decode to nothing: a shape for benchmarks, not for reading)."""

    family: str  # "qwen2" or "llama"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    description: str = ""
    vocab_size: int | None = None
    tie_word_embeddings: bool = True


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "tiny-qwen2": BuiltinModel(
        "qwen2", 64, 2, 4, 2, 256, description="~0.1M params: tests and the CPU demo (synthetic task)"
    ),
    "tiny-qwen2-h32": BuiltinModel(
        "qwen2",
        64,
        2,
        2,
        1,
        256,
        description=(
            "~0.1M params, tiny-qwen2 with 2 heads of 32: the smallest head vLLM's CPU build runs "
            "(the default task on vLLM)"
        ),
    ),
    "tiny-llama": BuiltinModel("llama", 64, 2, 4, 2, 256, description="~0.1M params: the Llama code path in tests"),
    "small-qwen2": BuiltinModel(
        "qwen2", 256, 4, 4, 2, 768, max_position_embeddings=1024, description="~3M params: rollout benchmarks"
    ),
    "qwen2-25m-shape": BuiltinModel(
        "qwen2",
        512,
        8,
        8,
        2,
        1536,
        max_position_embeddings=1024,
        description="~25M params, Qwen2-shaped with random weights: the scaling grid (bench/bench_scaling.py)",
    ),
    "qwen2-100m-shape": BuiltinModel(
        "qwen2",
        768,
        13,
        12,
        2,
        2560,
        max_position_embeddings=1024,
        description=(
            "~95M params, Qwen2-shaped with random weights: LoRA against full fine-tuning (bench/bench_lora.py)"
        ),
    ),
    "qwen2.5-0.5b-shape": BuiltinModel(
        "qwen2",
        896,
        24,
        14,
        2,
        4864,
        max_position_embeddings=2048,
        vocab_size=151_936,
        description="~494M params, Qwen2.5-0.5B's shape with random weights: GPU benchmarks (bench/gpu_check.sh)",
    ),
    "qwen2.5-7b-shape": BuiltinModel(
        "qwen2",
        3584,
        28,
        28,
        4,
        18944,
        max_position_embeddings=32768,
        vocab_size=152_064,
        tie_word_embeddings=False,
        description="~7.6B params, Qwen2.5-7B's shape: for the memory plan (hybridflow plan), not for a CPU run",
    ),
    "qwen2.5-32b-shape": BuiltinModel(
        "qwen2",
        5120,
        64,
        40,
        8,
        27648,
        max_position_embeddings=32768,
        vocab_size=152_064,
        tie_word_embeddings=False,
        description="~32.8B params, Qwen2.5-32B's shape: for the memory plan (hybridflow plan), not for a CPU run",
    ),
}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The built-in character-level tokenizer (see the module docstring)."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(tok_models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # One pre-token per character (newlines included); WordLevel maps each to its id.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join characters back without separators
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _builtin_config(spec: BuiltinModel, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    common = dict(
        vocab_size=spec.vocab_size or len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if spec.family == "qwen2":
        return Qwen2Config(**common)
    if spec.family == "llama":
        return LlamaConfig(**common)
    raise ValueError(f"unknown built-in model family {spec.family!r}")


def _load_builtin(name: str, dtype: torch.dtype, seed: int | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = build_char_tokenizer()
    config = _builtin_config(BUILTIN_MODELS[name], tokenizer)
    # Weights are drawn from torch's global generator: fork it so seeding here
    # leaves the caller's random stream untouched.
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    logger.info("built %s%s: %d parameters, seed %s", BUILTIN_PREFIX, name, model.num_parameters(), seed)
    return model, tokenizer


def _known_builtins() -> str:
    return ", ".join(BUILTIN_PREFIX + k for k in BUILTIN_MODELS)


def _check_path(path: str) -> str | None:
    """The built-in name of ``path`` (None for a directory); raises for unknown names and missing dirs."""
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_MODELS:
            raise ValueError(f"unknown built-in model {path!r}; known built-in models: {_known_builtins()}")
        return name
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"model directory {path!r} does not exist (models load from local paths only; "
            f"built-in models: {_known_builtins()})"
        )
    return None


def _load_tokenizer_dir(path: str) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model_config(path: str) -> PretrainedConfig:
    """Only the model config of ``path`` (no weights; same rules and errors as :func:`load_model_and_tokenizer`).

    Used before any worker starts, e.g. to check that tensor-parallel sizes split the model.
    """
    name = _check_path(path)
    if name is not None:
        return _builtin_config(BUILTIN_MODELS[name], build_char_tokenizer())
    return AutoConfig.from_pretrained(path)


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """Only the tokenizer of ``path`` (same rules and errors as :func:`load_model_and_tokenizer`)."""
    return build_char_tokenizer() if _check_path(path) is not None else _load_tokenizer_dir(path)


def load_model_and_tokenizer(
    path: str, *, dtype: torch.dtype = torch.float32, seed: int | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` from a local HF directory or ``builtin:<name>``.

    :param path: a local directory holding a causal LM checkpoint and its
        tokenizer, or ``builtin:<name>`` (one of :data:`BUILTIN_MODELS`).
    :param dtype: parameter dtype of the model.
    :param seed: seeds the random weights of a built-in model (ignored for a
        checkpoint); ``None`` draws from torch's global generator.
    :returns: the model in eval mode and its tokenizer (left padding; the pad
        token falls back to EOS when the checkpoint has none).
    :raises ValueError: for an unknown built-in name (the message lists the
        known ones).
    :raises FileNotFoundError: when ``path`` is neither built-in nor an
        existing directory (the model hub is never contacted).
    """
    name = _check_path(path)
    if name is not None:
        model, tokenizer = _load_builtin(name, dtype, seed)
    else:
        tokenizer = _load_tokenizer_dir(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.eval(), tokenizer
