"""The text a prompt becomes for a tokenizer: one rule for the policy's prompts and a reward model's inputs."""

from __future__ import annotations

from typing import Any

__all__ = ["render_prompt"]


def render_prompt(prompt: Any, tokenizer: Any) -> str:
    """The text a prompt becomes: chat messages through the chat template (with the generation prompt: the
    assistant's turn starts next), plain text as is; without a template, the messages' contents, one per line."""
    if isinstance(prompt, str):
        return prompt
    messages = [dict(m) for m in prompt]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n".join(m["content"] for m in messages)
