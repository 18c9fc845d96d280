"""The hybrid engine end to end on 4 gloo ranks: train on FSDP(4), generate on rollout TP 2 and TP 1.

After each of three optimizer steps the weights move in place into both
rollout layouts; greedy decoding with TP 2 must equal TP 1 and HF ``generate``
on the gathered full weights token for token, and the responses must change
as the weights do (the rollout really follows the training).
"""

import pytest
import torch
import torch.multiprocessing as mp
from hybrid_engine_ranks import hybrid_engine_rank
from transformers import AutoModelForCausalLM

from hybridflow.core import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS
from hybridflow.core.worker import free_ports
from hybridflow.workers.models import load_model_and_tokenizer

pytestmark = pytest.mark.slow
WORLD, STEPS, UPDATES = 4, 8, 3
PROMPT_TEXTS = ["max(1,2)=", "7", "max(3,8,1,5)=", "(12+4)*3=", "99", "min(4,0)="]


def _hf_greedy(model, prompts: DataProto, eos: int, pad: int) -> torch.Tensor:
    ids = prompts.batch[INPUT_IDS]
    out = model.generate(
        ids,
        attention_mask=prompts.batch[ATTENTION_MASK],
        do_sample=False,
        max_new_tokens=STEPS,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    return torch.nn.functional.pad(out[:, ids.shape[1] :], (0, STEPS - (out.shape[1] - ids.shape[1])), value=pad)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("hybrid_engine")
    model, tokenizer = load_model_and_tokenizer("builtin:tiny-qwen2", seed=0)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # large weights: greedy outputs vary from token to token (default init repeats one)
        for name, p in model.named_parameters():
            p.copy_(
                1 + 0.2 * torch.randn(p.shape, generator=gen)
                if name.endswith("norm.weight")
                else 0.35 * torch.randn(p.shape, generator=gen)
            )
    batch = tokenizer(PROMPT_TEXTS, padding=True, return_tensors="pt")
    prompts = DataProto.from_dict({INPUT_IDS: batch["input_ids"], ATTENTION_MASK: batch["attention_mask"]})
    vocab = model.config.vocab_size
    data = {
        "model": model,
        "prompts": prompts,
        "eos": tokenizer.eos_token_id,
        "steps": STEPS,
        "updates": UPDATES,
        "lr": 0.05,
        "train_ids": torch.randint(3, vocab, (8, 10), generator=gen),
        "train_targets": torch.randint(3, vocab, (8, 10), generator=gen),
    }
    torch.save(data, out_dir / "data.pt")
    mp.start_processes(
        hybrid_engine_rank, args=(WORLD, free_ports(1)[0], str(out_dir)), nprocs=WORLD, start_method="spawn"
    )
    ranks = [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    return ranks, prompts, tokenizer, model.config


def test_tp2_equals_tp1_and_hf_generate_after_every_update(run):
    ranks, prompts, tokenizer, config = run
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    for record in ranks[0]:
        full = AutoModelForCausalLM.from_config(config)
        full.load_state_dict(record["full"], strict=False)  # a tied lm_head is the embedding
        full.eval()
        expected = _hf_greedy(full, prompts, eos, pad)
        for rank in ranks:
            mine = next(r for r in rank if r["version"] == record["version"])
            assert torch.equal(mine[2]["responses"], expected), f"version {record['version']}: TP 2 != HF generate"
            assert torch.equal(mine[1]["responses"], expected), f"version {record['version']}: TP 1 != HF generate"
            assert torch.allclose(mine[2]["rollout_log_probs"], mine[1]["rollout_log_probs"], atol=1e-5)


def test_the_rollout_follows_the_weights(run):
    ranks, *_ = run
    versions = ranks[0]
    assert [r["version"] for r in versions] == list(range(UPDATES + 1))
    weights = [r["full"]["model.layers.0.mlp.up_proj.weight"] for r in versions]
    assert all(not torch.equal(a, b) for a, b in zip(weights, weights[1:]))  # every update moved the weights
    responses = [r[2]["responses"] for r in versions]
    changed = sum(not torch.equal(a, b) for a, b in zip(responses, responses[1:]))
    assert changed >= 2, "greedy outputs should change as the policy is trained"
