"""Rollout throughput: the built-in engine against HF ``generate`` on an RL-shaped batch.

    python bench/bench_rollout.py [--model builtin:small-qwen2] [--prompts 16] [--n 8]
                                  [--max-new-tokens 64] [--repeats 5] [--threads 1] [--device cpu]

Both engines get the same model, the same 16 prompts (the synthetic task's
``max(...)=`` questions, 2 to 6 digits, so prompt lengths differ and prompts
are left-padded) and sample ``n`` responses per prompt at temperature 1 with
no top-k / top-p, up to ``--max-new-tokens`` tokens, stopping at EOS.

Varying response lengths: the built-in model has random weights (0.02-std
init), so its next-token distribution is close to uniform over the 32-token
vocabulary and EOS comes with probability ~1/32 at every step. Response
lengths are then roughly geometric (mean ~25, about 1 in 8 reaching the
64-token cap): RL-shaped, without biasing any logit. Same for both engines.

Tokens/s counts the generated tokens of each engine's own responses (up to
and including EOS) over its wall time; each repeat runs both engines back to
back (HF first, then the engine, alternating), and the table reports the
median over repeats. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import logging
import platform
import random
import statistics
import time

import torch

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, RESPONSE_MASK
from hybridflow.workers.models import load_model_and_tokenizer
from hybridflow.workers.rollout import BuiltinEngine, SamplingParams


def build_prompts(tokenizer, count: int, seed: int = 0) -> DataProto:
    """``count`` chat-formatted, left-padded ``max(...)=`` prompts of 2 to 6 digits."""
    rng = random.Random(seed)
    texts = ["max(" + ",".join(str(rng.randint(0, 9)) for _ in range(rng.randint(2, 6))) + ")=" for _ in range(count)]
    chats = [[{"role": "user", "content": t}] for t in texts]
    enc = tokenizer.apply_chat_template(
        chats, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    return DataProto.from_dict({INPUT_IDS: enc["input_ids"], ATTENTION_MASK: enc["attention_mask"]})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_hf(model, tokenizer, prompts: DataProto, n: int, max_new_tokens: int, seed: int) -> tuple[int, float]:
    """HF ``generate`` with ``num_return_sequences=n``; returns (generated tokens, seconds)."""
    ids, mask = prompts.batch[INPUT_IDS].to(model.device), prompts.batch[ATTENTION_MASK].to(model.device)
    torch.manual_seed(seed)
    _sync(model.device)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            num_return_sequences=n,
            max_new_tokens=max_new_tokens,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    _sync(model.device)
    elapsed = time.perf_counter() - start
    responses = out[:, ids.shape[1] :]
    is_eos = responses == tokenizer.eos_token_id
    lengths = torch.where(is_eos.any(-1), is_eos.int().argmax(-1) + 1, responses.shape[1])
    return int(lengths.sum()), elapsed


def run_engine(engine: BuiltinEngine, prompts: DataProto, n: int, max_new_tokens: int, seed: int) -> tuple[int, float]:
    """The built-in engine; returns (generated tokens, seconds)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    _sync(engine.device)
    start = time.perf_counter()
    out = engine.generate(prompts, n=n, sampling=params, seed=seed)  # results come back to the CPU
    elapsed = time.perf_counter() - start
    return int(out.batch[RESPONSE_MASK].sum()), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin:small-qwen2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)

    model, tokenizer = load_model_and_tokenizer(args.model, seed=0)
    model.to(args.device)
    prompts = build_prompts(tokenizer, args.prompts)
    engine = BuiltinEngine(model, tokenizer)
    run_engine(engine, prompts, args.n, 8, seed=0)  # warm-up both paths once
    run_hf(model, tokenizer, prompts, args.n, 8, seed=0)

    results: dict[str, list[tuple[int, float]]] = {"HF generate": [], "built-in engine": []}
    for rep in range(args.repeats):
        order = ["HF generate", "built-in engine"] if rep % 2 == 0 else ["built-in engine", "HF generate"]
        for name in order:
            if name == "HF generate":
                results[name].append(run_hf(model, tokenizer, prompts, args.n, args.max_new_tokens, seed=rep))
            else:
                results[name].append(run_engine(engine, prompts, args.n, args.max_new_tokens, seed=rep))

    rates = {name: statistics.median(tok / sec for tok, sec in runs) for name, runs in results.items()}
    print(
        f"{args.model} ({model.num_parameters() / 1e6:.1f}M params), {args.prompts} prompts x n={args.n}, "
        f"up to {args.max_new_tokens} new tokens, temperature 1; torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s); {platform.machine()}, device {args.device}, {args.repeats} repeats\n"
    )
    print("| engine | generated tokens (mean) | seconds (median) | tokens/s (median) | vs HF |")
    print("|---|---:|---:|---:|---:|")
    for name, runs in results.items():
        tokens = statistics.mean(t for t, _ in runs)
        seconds = statistics.median(s for _, s in runs)
        ratio = rates[name] / rates["HF generate"]
        print(f"| {name} | {tokens:.0f} | {seconds:.3f} | {rates[name]:.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
