"""The tokens a reward model scores for one (prompt, response): the rules, in one place.

Two layouts, and which one a run uses:

* **The rollout's own tokens** (the reward model shares the policy's tokenizer:
  same vocabulary, same chat template): the row's prompt and response tokens as
  the policy read and wrote them (``attention_mask`` picks them out of
  ``input_ids``), except that the response's special tokens are dropped and one
  EOS closes it (a response cut at the length budget has none): every text a
  reward model reads is what the response says, as a finished turn, as in
  training and as a re-rendered chat. Nothing is decoded.
  :func:`preference_ids` builds this layout from text (the prompt through the
  chat template with its generation prompt, then the response, then EOS), so a
  reward model trained on text (``hybridflow-train-rm``) sees what it will score.
* **Re-rendered** (a tokenizer of its own, veRL's rule): the response is decoded
  with the policy's tokenizer (special tokens dropped), appended to the prompt's
  messages as the assistant's turn and rendered with the reward model's chat
  template (:func:`chat_ids`); a tokenizer without a chat template gets
  :func:`preference_ids`'s layout in its own tokens.

Either way an input longer than ``max_length`` keeps its last ``max_length``
tokens: the end of the response, where a sequence classifier reads its score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hybridflow.core.chat import render_prompt

__all__ = ["chat_ids", "preference_ids", "same_tokenizer", "special_ids", "truncate_left"]


def truncate_left(ids: list[int], max_length: int | None) -> list[int]:
    """The last ``max_length`` tokens of ``ids`` (all of them for None)."""
    return ids if max_length is None or len(ids) <= max_length else ids[-max_length:]


def preference_ids(tokenizer: Any, prompt: Any, response: str, max_length: int | None = None) -> list[int]:
    """The rollout layout of (``prompt``, ``response``) in ``tokenizer``'s tokens: ``render_prompt(prompt)``
    (the chat template with its generation prompt; plain text as is), then the response, each tokenized
    without special tokens, then EOS (when the tokenizer has one); left-truncated to ``max_length``."""
    ids = tokenizer(render_prompt(prompt, tokenizer), add_special_tokens=False)["input_ids"]
    ids = ids + tokenizer(response, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return truncate_left(ids, max_length)


def chat_ids(tokenizer: Any, prompt: Any, response: str, max_length: int | None = None) -> list[int]:
    """The prompt's messages (a text prompt: one user message) with ``response`` as the assistant's turn,
    rendered by ``tokenizer``'s chat template and tokenized without special tokens (the template writes its
    own); without a template, :func:`preference_ids`. Left-truncated to ``max_length``."""
    if not getattr(tokenizer, "chat_template", None):
        return preference_ids(tokenizer, prompt, response, max_length)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    text = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": response}], tokenize=False)
    return truncate_left(tokenizer(text, add_special_tokens=False)["input_ids"], max_length)


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers turn text into the same tokens and chat into the same text: equal vocabularies,
    special tokens and chat templates."""

    def special(t: Any) -> Sequence[Any]:
        return (t.eos_token_id, t.bos_token_id, sorted(getattr(t, "all_special_tokens", [])))

    return (
        a.get_vocab() == b.get_vocab()
        and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)
        and special(a) == special(b)
    )


def special_ids(tokenizer: Any) -> set[int]:
    """The ids ``tokenizer.decode(..., skip_special_tokens=True)`` leaves out: its named special tokens and every
    added token marked special (a chat template's role markers)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_ids) | {i for i, token in added.items() if getattr(token, "special", False)}
