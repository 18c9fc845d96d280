"""The reward-model worker group (real gloo ranks, FSDP2) against transformers' sequence classifier run by hand.

Two local reward models: one that shares the policy's tokenizer (the built-in character tokenizer: the rollout's
tokens are scored as they are) and one with a BPE tokenizer and a chat template of its own (each response is
decoded, re-rendered with the prompt's messages and re-tokenized). Every score must equal
``AutoModelForSequenceClassification.from_pretrained(path)(ids).logits[0, 0]`` computed here, one text at a time, on
the tokens the rule of ``workers/rm_inputs.py`` gives (half the responses end without EOS, one holds a template token:
the response's special tokens go, one EOS closes it), within 1e-5: on 2 ranks and on 1, with parameter offload on
and off, with fixed-row and token-budget micro-batches.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from support import bpe_chat_tokenizer, local_reward_model
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from hybridflow.configs.schema import PPOConfig
from hybridflow.core import ColocatedWorkerGroup, DataProto, ResourcePool, RoleSpec
from hybridflow.core.chat import render_prompt
from hybridflow.core.keys import (
    ATTENTION_MASK,
    INPUT_IDS,
    METRICS,
    POSITION_IDS,
    RAW_PROMPT,
    RESPONSE_MASK,
    RESPONSES,
    RM_SCORES,
)
from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.core.rollout_batch import left_pad
from hybridflow.trainer.launch import group_options
from hybridflow.workers.models import build_char_tokenizer
from hybridflow.workers.reward_model import RewardModelWorker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROMPTS = ["max(3,8,1,5)=", "max(1,2,0,0)=", "max(9,4,4,7)=", "max(2,6,5,1)=", "max(0,0,3,2)="]
RESPONSES_TEXT = ["8", "2 because", "x", "6,6,6", "", "3<|assistant|>)", "99", "max"]


def policy_batch() -> DataProto:
    """8 rows: chat prompts rendered by the policy's template, responses of 0 to 5 tokens (some ending in EOS)."""
    tok = build_char_tokenizer()
    messages = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(len(RESPONSES_TEXT))]
    prompt_ids = [tok(render_prompt(m, tok), add_special_tokens=False)["input_ids"] for m in messages]
    prompts, prompt_mask, _ = left_pad(prompt_ids, tok.pad_token_id)
    response_ids = [
        tok(t, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if i % 2 else [])
        for i, t in enumerate(RESPONSES_TEXT)
    ]
    width = max(len(r) for r in response_ids)
    responses = torch.full((len(response_ids), width), tok.pad_token_id)
    response_mask = torch.zeros_like(responses)
    for i, r in enumerate(response_ids):
        responses[i, : len(r)], response_mask[i, : len(r)] = torch.tensor(r, dtype=torch.long), 1
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    return DataProto.from_dict(
        {
            INPUT_IDS: torch.cat([prompts, responses], dim=1),
            ATTENTION_MASK: attention,
            POSITION_IDS: (attention.cumsum(-1) - 1).clamp(min=0),
            RESPONSES: responses,
            RESPONSE_MASK: response_mask,
        },
        {RAW_PROMPT: messages},
    )


def tokens(text: str) -> list[int]:
    return build_char_tokenizer()(text, add_special_tokens=False)["input_ids"]


def by_hand(path: str, batch: DataProto, retokenize: bool) -> torch.Tensor:
    """Each row's score from transformers' own model, one unpadded text at a time."""
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    rm_tok, policy_tok = AutoTokenizer.from_pretrained(path), build_char_tokenizer()
    scores = []
    for i in range(len(batch)):
        if retokenize:
            valid = batch.batch[RESPONSES][i][batch.batch[RESPONSE_MASK][i].bool()].tolist()
            chat = [
                *batch.non_tensor_batch[RAW_PROMPT][i],
                {"role": "assistant", "content": policy_tok.decode(valid, skip_special_tokens=True)},
            ]
            ids = rm_tok(rm_tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"]
        else:
            width = batch.batch[RESPONSES].shape[1]
            ids = batch.batch[INPUT_IDS][i][:-width][batch.batch[ATTENTION_MASK][i][:-width].bool()].tolist()
            response = batch.batch[RESPONSES][i][batch.batch[RESPONSE_MASK][i].bool()].tolist()
            # the response's text as a finished turn: its special tokens dropped, one EOS at the end
            ids += [t for t in tokens(policy_tok.decode(response, skip_special_tokens=True))] + [rm_tok.eos_token_id]
        with torch.no_grad():
            scores.append(model(input_ids=torch.tensor([ids])).logits[0, 0])
    return torch.stack(scores)


def config(path: str, ranks: int, **overrides) -> PPOConfig:
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {
        "reward_model.enable": True,
        "reward_model.model.path": path,
        "reward_model.micro_batch_size_per_gpu": 3,
        "trainer.n_gpus_per_node": ranks,
        **overrides,
    }.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_object(cfg)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    return {
        "same": local_reward_model(root / "same", build_char_tokenizer(), seed=1),
        "other": local_reward_model(root / "other", bpe_chat_tokenizer(), seed=2),
    }


def scores(ranks: int, roles: dict[str, PPOConfig], batch: DataProto) -> dict[str, torch.Tensor]:
    """Each role's ``rm_scores`` of ``batch`` from one group of ``ranks`` ranks holding them all."""
    specs = {
        name: RoleSpec(RewardModelWorker, kwargs={"config": cfg, "dims": ParallelDims.from_config(cfg)})
        for name, cfg in roles.items()
    }
    pool = ResourcePool([ranks])
    try:
        with ColocatedWorkerGroup(pool, specs, group_options(next(iter(roles.values())))) as group:
            out = {}
            for name in roles:
                group[name].init_model()
                result = group[name].compute_rm_score(batch)
                assert METRICS in result.meta_info  # its stage's peak memory rides along, as every stage's
                out[name] = result.batch[RM_SCORES]
            return out
    finally:
        pool.release()


@pytest.fixture(scope="module")
def two_ranks(ray_session, models):
    return scores(
        2,
        {
            "same": config(models["same"], 2),
            "offload": config(models["same"], 2, **{"reward_model.model.fsdp_config.param_offload": True}),
            "tokens": config(
                models["same"],
                2,
                **{"reward_model.use_dynamic_bsz": True, "reward_model.forward_max_token_len_per_gpu": 40},
            ),
            "other": config(models["other"], 2),
        },
        policy_batch(),
    )


def test_scores_are_the_sequence_classifier_run_by_hand_on_the_rollout_tokens(models, two_ranks):
    expected = by_hand(models["same"], policy_batch(), retokenize=False)
    assert expected.std() > 0.05  # the texts score differently, so a row mix-up would show
    torch.testing.assert_close(two_ranks["same"], expected, atol=1e-5, rtol=0)


def test_a_reward_model_with_its_own_tokenizer_scores_the_re_rendered_chat(models, two_ranks):
    expected = by_hand(models["other"], policy_batch(), retokenize=True)
    torch.testing.assert_close(two_ranks["other"], expected, atol=1e-5, rtol=0)
    wrong = by_hand(models["other"], policy_batch(), retokenize=False)  # the policy's ids read in its vocabulary
    assert (wrong - expected).abs().max() > 1e-3


def test_offload_and_token_budget_micro_batches_give_the_same_scores(two_ranks):
    torch.testing.assert_close(two_ranks["offload"], two_ranks["same"], atol=1e-6, rtol=0)
    torch.testing.assert_close(two_ranks["tokens"], two_ranks["same"], atol=1e-5, rtol=0)


def test_one_rank_gives_the_two_ranks_scores(ray_session, models, two_ranks):
    one = scores(1, {"same": config(models["same"], 1)}, policy_batch())
    torch.testing.assert_close(one["same"], two_ranks["same"], atol=1e-5, rtol=0)
