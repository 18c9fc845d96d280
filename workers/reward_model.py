"""The reward-model worker: a sequence classifier's score of every response, sharded like the reference.

Built when ``reward_model.enable`` is set. It loads ``reward_model.model.path``
(an ``AutoModelForSequenceClassification`` with one label, decoder-only),
frozen, in its compute dtype, FSDP2-sharded over all ranks, offloadable
between stages like the reference. A row's score is the model's own pooled
logit for the row's (prompt, response) (transformers pools at the rightmost
token that is not ``config.pad_token_id``), so it equals the model run by
hand on the same tokens, one text at a time. Which tokens: the rollout's own
(the response's special tokens dropped and one EOS closing it), or re-rendered
in the reward model's chat template when its tokenizer differs from the
policy's (``workers/rm_inputs.py``). Micro-batches hold
``reward_model.micro_batch_size_per_gpu`` rows, or a token budget under
``use_dynamic_bsz``; each is right-padded with the pad id.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from hybridflow.configs.schema import PPOConfig
from hybridflow.core import DP_COMPUTE_PROTO, ONE_TO_ALL, DataProto, Worker, register
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, RAW_PROMPT, RESPONSE_MASK, RESPONSES, RM_INPUTS, RM_SCORES
from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.core.rollout_batch import right_pad
from hybridflow.workers.fsdp import shard_role
from hybridflow.workers.loading import load_sharded_model
from hybridflow.workers.micro_batches import MicroBatching, restore_order
from hybridflow.workers.models import load_tokenizer, torch_dtype
from hybridflow.workers.offload import StateOffloader
from hybridflow.workers.rm_inputs import chat_ids, same_tokenizer, special_ids, truncate_left

__all__ = ["RewardModelInputs", "RewardModelWorker", "finished", "read_reward_model"]


def read_reward_model(path: str, dtype: torch.dtype, seed: int | None = None) -> PreTrainedModel:
    """The sequence classifier at ``path`` in ``dtype``, eval mode; a clear error when it is not a one-label one."""
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
    if model.config.num_labels != 1:
        raise ValueError(
            f"reward_model.model.path={path!r} has num_labels={model.config.num_labels}; a reward model "
            "scores with one label (AutoModelForSequenceClassification, num_labels=1)"
        )
    return model.eval()


class RewardModelInputs:
    """Turns a batch's rows into the reward model's token ids (``workers/rm_inputs.py``'s rules)."""

    def __init__(self, policy_tokenizer: Any, rm_tokenizer: Any, max_length: int | None) -> None:
        self.policy, self.rm, self.max_length = policy_tokenizer, rm_tokenizer, max_length
        self.retokenize = not same_tokenizer(policy_tokenizer, rm_tokenizer)

    def rows(self, data: DataProto) -> list[list[int]]:
        """One id list per row: the row's prompt tokens and its response as a finished turn (:func:`finished`),
        or its messages re-rendered."""
        responses, response_mask = data.batch[RESPONSES], data.batch[RESPONSE_MASK].bool()
        if not self.retokenize:
            ids, mask, width = data.batch[INPUT_IDS], data.batch[ATTENTION_MASK].bool(), responses.shape[1]
            special = special_ids(self.policy)  # what the verifiers' decoding leaves out
            # the response region under the attention mask: a multi-turn trajectory's tool output included
            return [
                truncate_left(
                    finished(
                        row[:-width][m[:-width]].tolist(),
                        row[-width:][m[-width:]].tolist(),
                        special,
                        self.rm.eos_token_id,
                    ),
                    self.max_length,
                )
                for row, m in zip(ids, mask)
            ]
        texts = [self.policy.decode(r[m].tolist(), skip_special_tokens=True) for r, m in zip(responses, response_mask)]
        return [
            chat_ids(self.rm, prompt, text, self.max_length)
            for prompt, text in zip(data.non_tensor_batch[RAW_PROMPT], texts)
        ]

    def batch(self, data: DataProto, pad_id: int) -> DataProto:
        """The rows as a right-padded (``input_ids``, ``attention_mask``) DataProto."""
        ids, mask = right_pad(self.rows(data), pad_id)
        return DataProto.from_dict({INPUT_IDS: ids, ATTENTION_MASK: mask})


def finished(prompt: list[int], response: list[int], special: set[int], eos_id: int | None) -> list[int]:
    """The prompt's tokens, the response's without special tokens, then EOS: what the response says, as a
    finished turn. The re-rendered path sees the same (it decodes without special tokens, and a chat template
    closes the turn); the verifiers read the text without them too; and a reward model trained on texts
    (``preference_ids``) saw every one end on EOS and no special token inside a response, so its scores of
    either are untrained, and a policy finds them (a response cut at the budget, or a template token, scored
    high by the reward model while the task's accuracy stays 0: docs/reward-models.md)."""
    kept = [t for t in response if t not in special]
    return prompt + kept + ([] if eos_id is None else [eos_id])


def pad_token_id(model: nn.Module, tokenizer: Any) -> int:
    """The id the model pools around: its config's pad id, else (set into its config) the tokenizer's pad or EOS."""
    config = model.config.get_text_config()
    if config.pad_token_id is None:
        fallback = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if fallback is None:
            raise ValueError(
                "the reward model's config and tokenizer define neither a pad nor an EOS token: set "
                "pad_token_id in its config.json so that batches can be scored"
            )
        config.pad_token_id = model.config.pad_token_id = fallback
    return int(config.pad_token_id)


class RewardModelWorker(Worker):
    """``rm_scores`` of responses under the reward model."""

    def __init__(self, config: PPOConfig, dims: ParallelDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        self.init_device_mesh(*dims.reward_model.mesh)

    @register(dispatch=ONE_TO_ALL, reads=())
    def init_model(self) -> None:
        """Load the reward model, frozen, sharded over the ranks; its tokenizer and the policy's."""
        rm, policy = self.config.reward_model, self.config.actor_rollout_ref.model
        fsdp = rm.model.fsdp_config
        compute = fsdp.compute_dtype(policy)
        self.model = load_sharded_model(
            rm.model.path,
            dtype=torch_dtype(compute),
            seed=self.config.trainer.seed,
            mesh=self.device_mesh,
            device=self.device,
            read=read_reward_model,
            shard=lambda module, mesh: shard_role(
                module.eval().requires_grad_(False), mesh, fsdp, compute_dtype=compute
            ),
        )
        rm_tokenizer = load_tokenizer(rm.model.tokenizer_path or rm.model.path)
        self.inputs = RewardModelInputs(load_tokenizer(policy.path), rm_tokenizer, rm.max_length)
        self.pad_id = pad_token_id(self.model, rm_tokenizer)
        self.batching = MicroBatching(
            rm.micro_batch_size_per_gpu, rm.forward_max_token_len_per_gpu if rm.use_dynamic_bsz else None
        )
        self.offload = StateOffloader(self.model, None, params=fsdp.param_offload, optimizer_state=False)
        self.offload.offload()

    @register(dispatch=DP_COMPUTE_PROTO, reads=RM_INPUTS)
    @torch.no_grad()
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B,) float32: the reward model's pooled logit of each row's prompt + response."""
        inputs = self.inputs.batch(data, self.pad_id)
        micro_batches, order = self.batching.split(inputs, self.device_mesh.get_group())
        with self.offload.on_device(params=True):
            parts = [self._score(micro) for micro in micro_batches]
        return DataProto.from_dict({RM_SCORES: restore_order(torch.cat(parts), order)})

    def _score(self, micro: DataProto) -> torch.Tensor:
        mask = micro.batch[ATTENTION_MASK]
        width = int(mask.sum(-1).max())  # the rows' own longest: no column of padding alone
        ids = micro.batch[INPUT_IDS][:, :width].to(self.device)
        logits = self.model(input_ids=ids, attention_mask=mask[:, :width].to(self.device), use_cache=False).logits
        return logits[:, 0].float().cpu()
