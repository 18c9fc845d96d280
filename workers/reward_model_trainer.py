"""The reward-model trainer's worker: a one-output sequence classifier trained on preference pairs.

The reward model is the backbone's architecture as
``AutoModelForSequenceClassification`` with ``num_labels=1``: its decoder
copied from the causal LM at ``model.path``, its ``score`` head fresh (seeded).
The score of a text is the model's own pooled logit, ``model(input_ids,
attention_mask).logits[:, 0]``: HF reads the head at the rightmost token that
is not ``config.pad_token_id``, here the EOS that ends every text. Training
calls exactly that forward, so the saved directory scores texts as it was
trained to.

A text's tokens are :func:`preference_ids`' (defined in ``workers/rm_inputs.py``
and re-exported here, one definition for both sides): the prompt rendered with
the tokenizer's chat template and its generation prompt, tokenized without
special tokens, then the response tokenized without special tokens, then EOS;
a policy rollout's prompt and response when the policy shares the tokenizer,
which is what the reward-model worker (``workers/reward_model.py``) scores.
The driver cuts each text to ``data.max_length`` from the left, keeping the
response and the EOS where the score is read.

Each rank holds ``data.batch_size / ranks`` pairs of a step, right-padded; a
micro-batch's chosen and rejected texts go through one forward together. The
loss of a micro-batch is its share of the step's mean Bradley-Terry loss
(``losses/bradley_terry.py``) and gradients accumulate over micro-batches
(``workers/train_step.py``), so the update is that of the whole batch whatever
the ranks and micro-batches; FSDP2 averages gradients over ranks, and the loss
is scaled by their number to make that average the sum.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoModelForSequenceClassification, PreTrainedModel
from transformers.utils import logging as hf_logging

from hybridflow.configs.rm_schema import RMConfig
from hybridflow.core import DP_COMPUTE_METRIC, DP_COMPUTE_PROTO, ONE_TO_ALL, DataProto, Worker, register
from hybridflow.core.rollout_batch import right_pad
from hybridflow.losses.bradley_terry import bradley_terry_loss, correct_pairs
from hybridflow.workers.fsdp import shard_role
from hybridflow.workers.loading import load_sharded_model
from hybridflow.workers.models import load_model_and_tokenizer, load_tokenizer, torch_dtype
from hybridflow.workers.optim import build_optimizer
from hybridflow.workers.rm_inputs import preference_ids  # the layout trained on is the one the RM worker scores
from hybridflow.workers.train_step import update_epochs

__all__ = [
    "CHOSEN_IDS",
    "CHOSEN_MASK",
    "CHOSEN_SCORES",
    "PAIR_INPUTS",
    "REJECTED_IDS",
    "REJECTED_MASK",
    "REJECTED_SCORES",
    "RewardModelTrainerWorker",
    "build_score_model",
    "pair_batch",
    "preference_ids",
    "sequence_scores",
]

logger = logging.getLogger(__name__)

CHOSEN_IDS, CHOSEN_MASK = "chosen_input_ids", "chosen_attention_mask"
REJECTED_IDS, REJECTED_MASK = "rejected_input_ids", "rejected_attention_mask"
PAIR_INPUTS = (CHOSEN_IDS, CHOSEN_MASK, REJECTED_IDS, REJECTED_MASK)
"""The columns of a batch of pairs (:func:`pair_batch`): each text right-padded, its attention mask."""
CHOSEN_SCORES, REJECTED_SCORES = "chosen_scores", "rejected_scores"
"""The columns :meth:`RewardModelTrainerWorker.compute_scores` returns, one score per pair each."""


def pair_batch(chosen: Sequence[Sequence[int]], rejected: Sequence[Sequence[int]], pad_id: int) -> DataProto:
    """Pairs of token ids (from :func:`preference_ids`) as a DataProto of :data:`PAIR_INPUTS`."""
    if len(chosen) != len(rejected) or not chosen:
        raise ValueError(
            f"pair_batch needs as many chosen as rejected texts, at least one; got {len(chosen)} and {len(rejected)}"
        )
    chosen_ids, chosen_mask = right_pad(chosen, pad_id)
    rejected_ids, rejected_mask = right_pad(rejected, pad_id)
    return DataProto.from_dict(
        {CHOSEN_IDS: chosen_ids, CHOSEN_MASK: chosen_mask, REJECTED_IDS: rejected_ids, REJECTED_MASK: rejected_mask}
    )


def build_score_model(path: str, dtype: torch.dtype, seed: int | None) -> PreTrainedModel:
    """A sequence classifier with one output, backbone copied from the causal LM at ``path``, head fresh.

    Its config gets ``num_labels=1`` and the tokenizer's ``pad_token_id`` (HF pools at the rightmost
    non-pad token, and refuses a batch without one). The head is seeded with ``seed`` on a forked generator,
    so the caller's random stream is left alone.
    """
    policy, tokenizer = load_model_and_tokenizer(path, dtype=dtype, seed=seed)
    config = policy.config
    config.num_labels = 1
    config.pad_token_id = tokenizer.pad_token_id
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config).to(dtype)
    prefix = model.base_model_prefix  # "model" for Qwen2 and Llama: the decoder both classes hold
    result = getattr(model, prefix).load_state_dict(getattr(policy, prefix).state_dict())
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(f"the reward model's backbone does not match the causal LM at {path!r}: {result}")
    return model.train()


def load_score_model(config: RMConfig, mesh: DeviceMesh, device: torch.device | str) -> nn.Module:
    """The reward model sharded over ``mesh`` with fp32 master weights (``fsdp_config.master_dtype``), computing
    in ``model.dtype``; collective (:func:`~hybridflow.workers.loading.load_sharded_model`: rank 0 builds it)."""
    model_cfg, fsdp = config.model, config.model.fsdp_config

    def shard(skeleton: nn.Module, mesh: DeviceMesh) -> nn.Module:
        return shard_role(
            skeleton,
            mesh,
            fsdp,
            compute_dtype=fsdp.compute_dtype(model_cfg),
            gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
        )

    return load_sharded_model(
        model_cfg.path,
        dtype=torch_dtype(fsdp.master_dtype),
        seed=config.trainer.seed,
        mesh=mesh,
        device=device,
        read=build_score_model,
        shard=shard,
    )


def sequence_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) fp32 scores: HF's pooled logit, ``model(input_ids, attention_mask).logits[:, 0]``."""
    return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, 0].float()


def pair_scores(model: nn.Module, micro: DataProto, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen, rejected)`` scores of a micro-batch of pairs, from one forward over both texts of each pair.

    Both sides are padded (with ``pad_id``, which HF's pooling looks for) or cut to the micro-batch's longest
    text: what is cut or added is right padding, which the causal attention and the pooling never read, so
    a text's score does not depend on what shares its micro-batch.
    """
    batch = micro.batch
    width = int(max(batch[CHOSEN_MASK].sum(-1).max(), batch[REJECTED_MASK].sum(-1).max()))

    def fit(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.nn.functional.pad(t[:, :width], (0, max(0, width - t.shape[1])), value=fill)

    ids = torch.cat([fit(batch[CHOSEN_IDS], pad_id), fit(batch[REJECTED_IDS], pad_id)])
    mask = torch.cat([fit(batch[CHOSEN_MASK], 0), fit(batch[REJECTED_MASK], 0)])
    scores = sequence_scores(model, ids, mask)
    return scores[: len(micro)], scores[len(micro) :]


class RewardModelTrainerWorker(Worker):
    """One data-parallel rank of the Bradley-Terry trainer: its shard of the reward model and of AdamW."""

    def __init__(self, config: RMConfig) -> None:
        super().__init__()
        self.config = config
        self.init_device_mesh((self.world_size,), ("dp",))

    @register(dispatch=ONE_TO_ALL, reads=())
    def init_model(self) -> None:
        """Build the reward model (rank 0 reads, every rank gets its shard) and its optimizer."""
        self.model = load_score_model(self.config, self.device_mesh, self.device)
        self.optimizer, self.scheduler = build_optimizer(self.model, self.config.optim)
        self.tokenizer = load_tokenizer(self.config.model.path)
        self.pad_id = self.model.config.pad_token_id
        self.dp_group = self.device_mesh.get_group()

    @register(dispatch=DP_COMPUTE_METRIC, reads=PAIR_INPUTS)
    def train_step(self, data: DataProto) -> dict[str, float]:
        """One optimizer step on the batch (this rank's pairs); ``train/*`` metrics of the whole batch, every
        rank's pairs counted (all-reduced), so each rank returns the same values."""
        total_pairs = len(data) * self.world_size  # every rank holds as many (the config check)
        margin = self.config.loss.margin
        sums = torch.zeros(3, dtype=torch.float64)  # loss, correct pairs, score gap, over this rank's pairs

        def micro_loss(micro: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
            chosen, rejected = pair_scores(self.model, micro, self.pad_id)
            losses = bradley_terry_loss(chosen, rejected, margin)
            with torch.no_grad():
                sums.add_(
                    torch.stack([losses.sum(), correct_pairs(chosen, rejected).sum(), (chosen - rejected).sum()])
                    .double()
                    .cpu()
                )
            return losses.sum() / total_pairs, {}

        step = update_epochs(  # the batch is one mini-batch: one optimizer step
            data,
            lambda index, mini: (micro_loss, {}),
            lambda mini: mini.split(self.config.data.micro_batch_size_per_gpu),
            self.model,
            self.optimizer,
            rows_per_mini_batch=len(data),
            grad_clip=self.config.optim.grad_clip,
            loss_scale=self.world_size,
            scheduler=self.scheduler,
            prefix="train",
        )
        loss, correct, gap = self._all_reduced(sums).tolist()
        return {
            **step,
            "train/loss": loss / total_pairs,
            "train/accuracy": correct / total_pairs,
            "train/score_gap": gap / total_pairs,
        }

    @register(dispatch=DP_COMPUTE_PROTO, reads=PAIR_INPUTS)
    def compute_scores(self, data: DataProto) -> DataProto:
        """:data:`CHOSEN_SCORES` and :data:`REJECTED_SCORES` of every pair (no gradient)."""
        self.model.eval()
        parts = []
        with torch.no_grad():
            for micro in data.split(self.config.data.micro_batch_size_per_gpu):
                parts.append(torch.stack(pair_scores(self.model, micro, self.pad_id), dim=1))
        scores = torch.cat(parts)
        return DataProto.from_dict(
            {CHOSEN_SCORES: scores[:, 0].contiguous(), REJECTED_SCORES: scores[:, 1].contiguous()}
        )

    @register(dispatch=ONE_TO_ALL, reads=())
    def save_hf_model(self, directory: str) -> None:
        """Gather the full weights (collective) and, on rank 0, write ``directory`` with ``save_pretrained``:
        the model (config with ``num_labels=1`` and ``pad_token_id``) and the tokenizer, set to pad on the
        right (see :func:`save_reward_model`)."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)  # only rank 0 keeps the full tensors
        if self.rank == 0:
            save_reward_model(directory, self.model.config, state, self.tokenizer)
        dist.barrier(group=self.dp_group)  # the directory is complete when any rank returns

    def _all_reduced(self, sums: torch.Tensor) -> torch.Tensor:
        """``sums`` summed over the data-parallel ranks (on the device: an NCCL group reduces CUDA tensors)."""
        total = sums.to(self.device)
        if self.world_size > 1:
            dist.all_reduce(total, group=self.dp_group)
        return total.cpu()


def save_reward_model(directory: str | Path, config: Any, state: dict[str, torch.Tensor], tokenizer: Any) -> Path:
    """Write an HF reward-model directory from full weights: ``AutoModelForSequenceClassification.from_pretrained``
    and ``AutoTokenizer.from_pretrained`` load it.

    The tokenizer is saved padding on the right, the layout the model was trained on: a padded batch then
    scores each text as it scores alone. (Left padding shifts every position of a text by the same amount,
    which rotary models such as Qwen2 and Llama do not see, but a model with absolute positions would.)
    """
    hf_logging.disable_progress_bar()  # "Writing model shards" would come through Ray as a worker's stray line
    model = AutoModelForSequenceClassification.from_config(config, dtype=next(iter(state.values())).dtype)
    result = model.load_state_dict(state, strict=True)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(f"the gathered weights do not match the reward model: {result}")
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(target)
    tokenizer.padding_side = "right"
    tokenizer.save_pretrained(target)
    return target
