"""The tensor-parallel rollout model on 4 gloo ranks against the full HF model.

One spawn runs every case (tp_rollout_ranks.tp_rollout_rank): for q = 1, 2, 4
the ranks form a (4/q, q) mesh and each builds its shard of the model. Checked
here, in the test process, against the full model: each local parameter is the
plan's block of the full weight; greedy decoding equals HF ``generate`` and
q=1 token for token, with rollout log-probs equal to a teacher-forced pass;
seeded sampling is identical on the ranks of a tp group; weights written in
place afterwards are the ones decoded with.

Models: builtin tiny-qwen2 (4 heads, 2 KV heads: q=4 replicates KV heads;
tied embeddings; q/k/v biases), builtin tiny-llama, and tiny-llama with an
untied head, a 34-token vocab (uneven vocab blocks 9, 9, 9, 7 at q=4) and
biases on every projection (row-parallel biases are added once, after the sum).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.multiprocessing as mp
from tp_rollout_ranks import tp_rollout_rank
from transformers import AutoModelForCausalLM, GPT2Config

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS
from hybridflow.core.worker import free_ports
from hybridflow.workers.models import load_model_and_tokenizer
from hybridflow.workers.rollout.tensor_parallel import build_tp_rollout_model
from hybridflow.workers.rollout.tp_plan import check_tp_size, rollout_slice

WORLD = 4
TP_SIZES = (1, 2, 4)
STEPS = 8
PROMPT_TEXTS = ["max(1,2)=", "7", "max(3,8,1,5)=", "(12+4)*3=", "99"]


def _spiky(config, seed: int):
    """A model with large random weights (biases and norms too, so their handling shows), so greedy
    outputs vary from token to token."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.2 * noise if name.endswith("norm.weight") else 0.35 * noise)
    return model.eval()


def _hf_greedy(model, prompts: DataProto, eos: int, pad: int) -> torch.Tensor:
    ids = prompts.batch[INPUT_IDS]
    out = model.generate(
        ids, attention_mask=prompts.batch[ATTENTION_MASK], do_sample=False, max_new_tokens=STEPS,
        eos_token_id=eos, pad_token_id=pad,
    )  # fmt: skip
    return torch.nn.functional.pad(out[:, ids.shape[1] :], (0, STEPS - (out.shape[1] - ids.shape[1])), value=pad)


def _mid_tokens(responses: torch.Tensor, pad: int) -> list[int]:
    """Tokens greedy decoding emits in some rows but not all, never first, most frequent first:
    as EOS they end rows at different steps."""
    counts = {}
    for tok in torch.unique(responses).tolist():
        hit = (responses == tok).any(-1)
        if tok != pad and 0 < hit.sum() < len(responses) and not (responses[:, 0] == tok).any():
            counts[tok] = int(hit.sum())
    return sorted(counts, key=counts.get, reverse=True)


def _teacher_forced(model, prompts: DataProto, responses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Log-probs of ``responses`` under ``model`` from one forward over prompt + response."""
    p_mask = prompts.batch[ATTENTION_MASK]
    attention = torch.cat([p_mask, mask], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ids = torch.cat([prompts.batch[INPUT_IDS], responses], 1)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    logits = logits[:, p_mask.shape[1] - 1 : -1]
    return logits.log_softmax(-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1) * mask


def _configs():
    qwen, tokenizer = load_model_and_tokenizer("builtin:tiny-qwen2")
    llama, _ = load_model_and_tokenizer("builtin:tiny-llama")
    uneven = copy.deepcopy(llama.config)
    uneven.vocab_size, uneven.tie_word_embeddings = 34, False
    uneven.attention_bias = uneven.mlp_bias = True  # row-parallel o_proj/down_proj biases: added once
    return {"tiny-qwen2": qwen.config, "tiny-llama": llama.config, "llama-v34-untied": uneven}, tokenizer


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """Full models, prompts and expected outputs here; every rank's results from one 4-rank spawn."""
    out_dir = tmp_path_factory.mktemp("tp_rollout")
    configs, tokenizer = _configs()
    batch = tokenizer(PROMPT_TEXTS, padding=True, return_tensors="pt")
    prompts = DataProto.from_dict({INPUT_IDS: batch["input_ids"], ATTENTION_MASK: batch["attention_mask"]})
    pad = tokenizer.pad_token_id
    cases, expected = {}, {}
    for seed, (name, config) in enumerate(configs.items()):
        full, full_b = _spiky(config, seed=10 * seed), _spiky(config, seed=10 * seed + 1)
        ends = _mid_tokens(_hf_greedy(full, prompts, eos=tokenizer.eos_token_id, pad=pad), pad)
        eos = ends[0]
        cases[name] = {
            # sampling ends on any of three tokens, so its rows too end at different steps
            "config": config, "eos": eos, "sample_eos": tuple(ends[:3]), "steps": STEPS,
            "weights": full.state_dict(), "weights_b": full_b.state_dict(),
        }  # fmt: skip
        expected[name] = {
            "full": full, "full_b": full_b,
            "greedy": _hf_greedy(full, prompts, eos, pad), "greedy_b": _hf_greedy(full_b, prompts, eos, pad),
        }  # fmt: skip
    torch.save({"cases": cases, "prompts": prompts, "tp_sizes": TP_SIZES}, out_dir / "data.pt")
    mp.start_processes(
        tp_rollout_rank, args=(WORLD, free_ports(1)[0], str(out_dir)), nprocs=WORLD, start_method="spawn"
    )
    ranks = [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    return cases, expected, prompts, ranks


def _each(cases):
    for name in cases:
        for q in TP_SIZES:
            yield name, q


@pytest.mark.slow
def test_local_parameters_are_the_plan_blocks_of_the_full_weights(tp_run):
    cases, expected, _, ranks = tp_run
    for name, q in _each(cases):
        full = expected[name]["full"]
        config = cases[name]["config"]
        full_params = dict(full.named_parameters())
        for rank, results in enumerate(ranks):
            held = results[name, q]
            assert held["tp_rank"] == rank % q  # the tp dim of the mesh is consecutive ranks
            assert held["params"].keys() == full_params.keys()  # HF names; a tied head stays one parameter
            assert held["tied"] == config.tie_word_embeddings
            for pname, local in held["params"].items():
                whole = full_params[pname].detach()
                block = rollout_slice(pname, tuple(whole.shape), config, rank % q, q)
                assert local.shape == block.shape(tuple(whole.shape)), (name, q, rank, pname)
                assert torch.equal(local, block.take(whole)), (name, q, rank, pname)
            for bname, buffer in full.named_buffers():  # rotary inv_freq recomputed after building on meta
                assert torch.equal(held["buffers"][bname], buffer), (name, q, rank, bname)
        if q > 1:  # a rank really holds a fraction of the split weights
            held = ranks[0][name, q]["params"]
            up = "model.layers.0.mlp.up_proj.weight"
            assert held[up].numel() * q == full_params[up].numel()
            assert held["model.layers.0.self_attn.q_proj.weight"].shape[0] == 64 // q  # hidden 64 = 4 heads x 16


@pytest.mark.slow
def test_greedy_equals_hf_generate_and_q1_with_teacher_forced_log_probs(tp_run):
    cases, expected, prompts, ranks = tp_run
    for name, q in _each(cases):
        want = expected[name]["greedy"]
        single = ranks[0][name, 1]["greedy"]  # q=1: the plain HF model in the engine
        lengths = single["response_mask"].sum(-1)
        assert 1 <= lengths.min() < lengths.max() == STEPS, name  # rows ended at different steps (EOS, compaction)
        reference = _teacher_forced(expected[name]["full"], prompts, want, single["response_mask"])
        for rank, results in enumerate(ranks):
            got = results[name, q]["greedy"]
            assert torch.equal(got["responses"], want), (name, q, rank)
            assert torch.equal(got["response_mask"], single["response_mask"])
            close = dict(rtol=0, atol=1e-5)
            torch.testing.assert_close(got["rollout_log_probs"], single["rollout_log_probs"], **close)
            torch.testing.assert_close(got["rollout_log_probs"], reference, **close)


@pytest.mark.slow
def test_seeded_sampling_is_identical_across_a_tp_group(tp_run):
    cases, _, _, ranks = tp_run
    for name, q in _each(cases):
        for first in range(0, WORLD, q):
            lead = ranks[first][name, q]["sampled"]
            for rank in range(first + 1, first + q):
                for key, value in ranks[rank][name, q]["sampled"].items():
                    assert torch.equal(value, lead[key]), (name, q, rank, key)
            # real sampling: the 3 samples of a prompt differ somewhere, and rows end at different steps
            responses = lead["responses"].view(len(PROMPT_TEXTS), 3, STEPS)
            assert (responses != responses[:, :1]).any(), (name, q)
            lengths = lead["response_mask"].sum(-1)
            assert lengths.min() < lengths.max(), (name, q)


@pytest.mark.slow
def test_weights_written_in_place_are_decoded_with(tp_run):
    cases, expected, _, ranks = tp_run
    for name, q in _each(cases):
        assert not torch.equal(expected[name]["greedy_b"], expected[name]["greedy"]), name
        for rank, results in enumerate(ranks):
            assert results[name, q]["same_param_objects"], (name, q, rank)
            assert torch.equal(results[name, q]["greedy_b"]["responses"], expected[name]["greedy_b"]), (name, q, rank)


def test_tp_size_that_does_not_split_the_heads_is_refused():
    configs, _ = _configs()
    config = configs["tiny-qwen2"]  # 4 heads, 2 KV heads, intermediate 256
    message = (
        "rollout tensor parallelism cannot split this model: num_attention_heads=4 is not divisible by 3; "
        "num_key_value_heads=2 neither divides nor is divisible by 3; intermediate_size=256 is not divisible by 3"
    )
    with pytest.raises(ValueError) as check:
        check_tp_size(config, 3)
    assert str(check.value) == message
    with pytest.raises(ValueError) as build:  # refused before any process group is touched
        build_tp_rollout_model(config, None, 0, 3)
    assert str(build.value) == message
    check_tp_size(config, 4)  # KV heads replicated: allowed
    with pytest.raises(ValueError, match="tp_size=2 needs a tp process group"):
        build_tp_rollout_model(config, None, 0, 2)
    with pytest.raises(ValueError, match=r"supports model types \('qwen2', 'llama'\), got 'gpt2'"):
        build_tp_rollout_model(GPT2Config(n_layer=1), None, 0, 1)
