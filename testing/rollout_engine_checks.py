"""The rollout-engine contract: what the workers rely on from any engine ``rollout.name`` can name.

:func:`check_rollout_engine` builds the engine on one rank of this process (a one-rank gloo world is started
if none is), over a tiny built-in Qwen2 with large random weights (so greedy outputs vary from token to
token), loads weights into it the way the rollout's own ranks do (each weight whole, in HF names) and checks:

- **tokenizer facts**: an integer pad id; EOS ids, the tokenizer's first;
- **n samples per prompt**: ``B * n`` rows, a prompt's samples adjacent, each row the prompt then its response;
  responses at most ``max_new_tokens`` long, the mask ones then zeros, log-probs finite and at most 0 where
  the mask is 1;
- **greedy is deterministic**: two greedy calls agree, and a prompt's ``n`` greedy samples are one response;
- **seeded sampling repeats**: two sampled calls with one seed agree token for token;
- **stop tokens end a response**: with a token greedy decoding emits mid-response as ``stop_token_ids``, every
  response ends at its first occurrence (kept, as an EOS is);
- **weights load in place**: after loading other weights (a new version) the greedy responses change to
  those of the new weights, and ``weight_version`` says which version the engine holds;
- **log-probs of what it generated**: ``rollout_log_probs`` equal the loaded model's own temperature-scaled
  log-probs of the sampled tokens, within ``log_prob_atol`` (an engine whose kernels differ declares a
  looser bound).

Every property is checked; one ``AssertionError`` lists each that broke, with the numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    PROMPTS,
    RESPONSE_MASK,
    RESPONSES,
    ROLLOUT_LOG_PROBS,
)
from hybridflow.core.rollout_batch import positions_from_mask
from hybridflow.core.sampling import SamplingParams
from hybridflow.plugins import RolloutEngineEntry, get_rollout_engine
from hybridflow.testing.contract import ContractReport, call, resolve, run_properties

MODEL = "builtin:tiny-qwen2-h32"  # 2 heads of 32: the smallest head vLLM's CPU build runs
PROMPT_TEXTS = ["max(1,2)=", "7", "max(3,8,1,5)=", "(12+4)*3="]
STEPS = 8
SAMPLES = 3
TEMPERATURE = 0.7


class ModelWeights:
    """A whole model's weights as a :class:`~hybridflow.workers.rollout.base.WeightSource` (the rollout group's
    way: each weight whole, in the HF model's names)."""

    def __init__(self, model: torch.nn.Module, version: int) -> None:
        self.model, self.version = model, version

    def full(self) -> Iterator[tuple[str, torch.Tensor]]:
        return ((name, p.detach()) for name, p in self.model.named_parameters())

    def sharded(self) -> None:
        return None


def contract_model(seed: int) -> torch.nn.Module:
    """The contract's policy: the tiny built-in model with weights of std 0.35 drawn from ``seed``."""
    from hybridflow.workers.models import load_model_and_tokenizer

    model = load_model_and_tokenizer(MODEL, seed=seed)[0]
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.35)
    return model.eval()


def contract_context(tokenizer: Any, config_overrides: dict[str, Any] | None = None, device: str = "cpu") -> Any:
    """The :class:`~hybridflow.workers.rollout.base.EngineContext` of one rank with tensor parallelism 1."""
    from omegaconf import OmegaConf

    from hybridflow.configs.schema import PPOConfig
    from hybridflow.core.parallel_dims import ParallelDims
    from hybridflow.workers.rollout.base import EngineContext

    cfg = OmegaConf.structured(PPOConfig)
    settings = {
        "actor_rollout_ref.model.path": MODEL,
        "actor_rollout_ref.model.dtype": "float32",
        "data.train_batch_size": len(PROMPT_TEXTS),
        "data.max_prompt_length": 16,
        "actor_rollout_ref.actor.ppo_mini_batch_size": len(PROMPT_TEXTS),
        "actor_rollout_ref.rollout.n": SAMPLES,
        "actor_rollout_ref.rollout.response_length": STEPS,
        "trainer.n_gpus_per_node": 1,
        "trainer.device": device,
        **(config_overrides or {}),
    }
    for key, value in settings.items():
        OmegaConf.update(cfg, key, value)
    config = OmegaConf.to_object(cfg)
    dims = ParallelDims.from_config(config)
    return EngineContext(config, dims, tokenizer, torch.device(device), None, 0)


def _one_rank_world() -> None:
    if dist.is_initialized():
        return
    from hybridflow.core.worker import free_ports

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")  # as a worker's
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_ports(1)[0]))
    dist.init_process_group("gloo", rank=0, world_size=1)


def _prompts(tokenizer: Any) -> DataProto:
    batch = tokenizer(PROMPT_TEXTS, padding=True, return_tensors="pt")
    mask = batch["attention_mask"]
    return DataProto.from_dict(
        {INPUT_IDS: batch["input_ids"], ATTENTION_MASK: mask, POSITION_IDS: positions_from_mask(mask)}
    )


def check_rollout_engine(
    engine: RolloutEngineEntry | str,
    *,
    config_overrides: dict[str, Any] | None = None,
    log_prob_atol: float = 1e-4,
    device: str = "cpu",
) -> ContractReport:
    """Check the rollout-engine contract (module docstring) on ``engine``, a record or a registered name.

    ``config_overrides`` are dotted config keys for the engine's own settings
    (``{"actor_rollout_ref.rollout.max_num_seqs": 4}``). Raises one ``AssertionError`` listing every broken
    property with its input and numbers; returns a :class:`~hybridflow.testing.contract.ContractReport`.
    """
    from hybridflow.workers.models import load_tokenizer

    entry = resolve(engine, RolloutEngineEntry, get_rollout_engine)
    _one_rank_world()
    tokenizer = load_tokenizer(MODEL)
    built = call("building it", entry.fn, contract_context(tokenizer, config_overrides, device))
    first, second = contract_model(seed=1), contract_model(seed=2)
    prompts = _prompts(tokenizer)

    def load(model: torch.nn.Module, version: int) -> None:
        built.wake_up(["weights"])
        call(f"loading weights version {version}", built.load_weights, ModelWeights(model, version))
        built.wake_up(["kv_cache"])

    def generate(label: str, *, n: int = 1, greedy: bool = True, seed: int = 0, stops=()) -> DataProto:
        sampling = SamplingParams(temperature=TEMPERATURE, max_new_tokens=STEPS)
        return call(
            label, built.generate, prompts, n=n, sampling=sampling, greedy=greedy, seed=seed, stop_token_ids=stops
        )

    load(first, 1)
    properties: list[tuple[str, Callable[[], None]]] = [
        ("tokenizer facts", lambda: _tokenizer_facts(built, tokenizer)),
        ("n samples per prompt", lambda: _shapes(generate("a sampled call, n=3", n=SAMPLES, greedy=False), prompts)),
        ("greedy is deterministic", lambda: _greedy_deterministic(generate)),
        ("seeded sampling repeats", lambda: _seeded(generate)),
        ("stop tokens end a response", lambda: _stops(generate, built.eos_token_ids)),
        ("log-probs of what it generated", lambda: _log_probs(generate, first, log_prob_atol)),
        ("weights load in place", lambda: _reload(generate, load, built, second)),  # last: it swaps the weights
    ]
    return run_properties(f"rollout engine {entry.name!r}", properties, {})


def _tokenizer_facts(engine: Any, tokenizer: Any) -> None:
    assert isinstance(engine.pad_token_id, int), f"pad_token_id is {engine.pad_token_id!r}, not an int"
    eos = tuple(engine.eos_token_ids)
    assert eos and all(isinstance(t, int) for t in eos), f"eos_token_ids {eos!r}: not a non-empty tuple of ints"
    assert eos[0] == tokenizer.eos_token_id, (
        f"eos_token_ids {eos} do not start with the tokenizer's {tokenizer.eos_token_id}"
    )


def _shapes(out: DataProto, prompts: DataProto) -> None:
    rows, width = prompts.batch[INPUT_IDS].shape
    assert len(out) == rows * SAMPLES, f"{len(out)} rows for {rows} prompts x n={SAMPLES}"
    responses, mask = out.batch[RESPONSES], out.batch[RESPONSE_MASK]
    assert responses.shape[1] <= STEPS, f"responses {tuple(responses.shape)} are longer than {STEPS} tokens"
    repeated = prompts.batch[INPUT_IDS].repeat_interleave(SAMPLES, 0)
    assert torch.equal(out.batch[PROMPTS], repeated), "the rows' prompts are not each prompt n times, adjacent"
    assert torch.equal(out.batch[INPUT_IDS], torch.cat([repeated, responses], 1)), "input_ids != prompt + response"
    ones_then_zeros = (mask[:, 1:] <= mask[:, :-1]).all() and set(mask.unique().tolist()) <= {0, 1}
    assert ones_then_zeros, f"response_mask is not ones then zeros:\n{mask}"
    log_probs = out.batch[ROLLOUT_LOG_PROBS][mask.bool()]
    assert torch.isfinite(log_probs).all() and (log_probs <= 1e-6).all(), f"log-probs {log_probs.tolist()}"


def _greedy_deterministic(generate: Callable[..., DataProto]) -> None:
    once, again = generate("a greedy call", n=SAMPLES), generate("the same greedy call", n=SAMPLES)
    assert torch.equal(once.batch[RESPONSES], again.batch[RESPONSES]), (
        f"two greedy calls differ:\n{once.batch[RESPONSES]}\n{again.batch[RESPONSES]}"
    )
    grouped = once.batch[RESPONSES].view(-1, SAMPLES, once.batch[RESPONSES].shape[1])
    assert (grouped == grouped[:, :1]).all(), f"a prompt's greedy samples differ:\n{once.batch[RESPONSES]}"


def _seeded(generate: Callable[..., DataProto]) -> None:
    once = generate("a sampled call, seed 7", n=SAMPLES, greedy=False, seed=7)
    again = generate("the same call, seed 7", n=SAMPLES, greedy=False, seed=7)
    assert torch.equal(once.batch[RESPONSES], again.batch[RESPONSES]), (
        f"one seed, two samples:\n{once.batch[RESPONSES]}\n{again.batch[RESPONSES]}"
    )


def _stops(generate: Callable[..., DataProto], eos: tuple[int, ...]) -> None:
    plain = generate("a greedy call")
    responses, mask = plain.batch[RESPONSES], plain.batch[RESPONSE_MASK]
    inside = responses[:, 1:][mask[:, 1:].bool()].tolist()  # tokens after the first: a stop ends a row early
    candidates = [t for t in dict.fromkeys(inside) if t not in eos]
    assert candidates, f"greedy responses too short to test a stop token:\n{responses}"
    stop = candidates[0]
    stopped = generate(f"a greedy call with stop_token_ids=({stop},)", stops=(stop,))
    for row, (full, cut) in enumerate(zip(plain.batch[RESPONSES], stopped.batch[RESPONSES])):
        length = int(plain.batch[RESPONSE_MASK][row].sum())
        hits = (full[:length] == stop).nonzero()
        want = int(hits[0]) + 1 if len(hits) else length
        got = int(stopped.batch[RESPONSE_MASK][row].sum())
        assert got == want and torch.equal(cut[:got], full[:got]), (
            f"row {row}: with stop token {stop} the response is {cut[:got].tolist()}, expected {full[:want].tolist()}"
        )


def _log_probs(generate: Callable[..., DataProto], model: torch.nn.Module, atol: float) -> None:
    out = generate("a sampled call, seed 3", n=SAMPLES, greedy=False, seed=3)
    picked = (_teacher_forced(model, out) / TEMPERATURE).log_softmax(-1)
    expected = picked.gather(-1, out.batch[RESPONSES].unsqueeze(-1)).squeeze(-1)
    mask = out.batch[RESPONSE_MASK].bool()
    gap = (out.batch[ROLLOUT_LOG_PROBS] - expected).abs()[mask].max().item()
    assert gap <= atol, f"rollout_log_probs differ from the model's own by up to {gap:.3g} (bound {atol:g})"


def _reload(generate: Callable[..., DataProto], load: Callable[..., None], engine: Any, other: Any) -> None:
    before = generate("a greedy call, version 1")
    load(other, 2)
    after = generate("the greedy call, version 2")
    assert engine.weight_version == 2, f"weight_version is {engine.weight_version} after loading version 2"
    assert not torch.equal(before.batch[RESPONSES], after.batch[RESPONSES]), "the greedy responses did not change"
    mask = after.batch[RESPONSE_MASK].bool()
    argmax = _teacher_forced(other, after).argmax(-1)
    wrong = (argmax != after.batch[RESPONSES])[mask]
    assert not wrong.any(), (
        f"{int(wrong.sum())} of {int(mask.sum())} greedy tokens after the load are not the new weights' argmax"
    )


def _teacher_forced(model: torch.nn.Module, out: DataProto) -> torch.Tensor:
    """``model``'s logits for each response position of ``out`` (the prompt and the response fed whole)."""
    width = out.batch[PROMPTS].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=out.batch[INPUT_IDS],
            attention_mask=out.batch[ATTENTION_MASK],
            position_ids=out.batch[POSITION_IDS],
        ).logits
    return logits[:, width - 1 : -1].float()
