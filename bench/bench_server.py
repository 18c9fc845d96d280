"""Server-mode generation against direct generation: what HTTP and JSON cost an agent rollout.

    python bench/bench_server.py [--model builtin:small-qwen2] [--requests 64] [--max-tokens 48]
                                 [--repeats 5] [--threads 1] [--max-wait-s 0.005 0.02 0.05]

Both modes send the same ``--requests`` concurrent requests (chat-formatted
``max(...)=`` prompts of 2 to 6 digits, as ``bench_rollout.py``) to the same
engine, sampled at temperature 1 up to ``--max-tokens`` tokens or EOS:

- direct: one :class:`GenerationBatcher` straight to the engine (``rollout.mode=direct``);
- server: a :class:`PolicyServer` in front of the same engine and one
  :class:`CompletionsClient` per rollout, every request a POST of token ids
  (``rollout.mode=server``), one server for each ``--max-wait-s`` (how long
  a batch waits for a gap in arrivals; 0.05 is the trainer's default); server
  start-up is not timed.

Each repeat gives every mode the same fresh seed, so when a server's
requests batch as the direct ones do (all in one call) it samples the same
tokens; the table says how many calls each mode made and in how many
repeats its tokens were the direct ones. Tokens/s counts generated tokens
(EOS included) over the wall time of the whole gather; the table reports
the median over repeats, the order of the modes rotating. Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import platform
import random
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from hybridflow.agents.batcher import GenerationBatcher
from hybridflow.agents.client import Completion, PolicyClient
from hybridflow.agents.http_client import CompletionsClient
from hybridflow.agents.server import PolicyServer, engine_generate_fn
from hybridflow.core.data_proto import DataProto
from hybridflow.workers.models import load_model_and_tokenizer
from hybridflow.workers.rollout import BuiltinEngine


def chat_prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` chat-formatted ``max(...)=`` prompts as token-id lists (lengths differ)."""
    rng = random.Random(seed)
    texts = ["max(" + ",".join(str(rng.randint(0, 9)) for _ in range(rng.randint(2, 6))) + ")=" for _ in range(count)]
    return [
        tokenizer(
            tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )["input_ids"]
        for t in texts
    ]


@dataclass
class Run:
    """One mode's rollout of the prompts."""

    token_ids: list[list[int]]
    seconds: float
    calls: int

    @property
    def tokens(self) -> int:
        return sum(map(len, self.token_ids))


async def rollout(client: PolicyClient, prompts: list[list[int]], max_tokens: int) -> tuple[list[Completion], float]:
    """Every prompt's completion, requested concurrently, and the wall time of the whole gather."""
    start = time.perf_counter()
    try:
        completions = await asyncio.gather(*(client.generate(p, max_tokens=max_tokens) for p in prompts))
    finally:
        await client.close()
    return list(completions), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin:small-qwen2")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--max-wait-s",
        type=float,
        nargs="+",
        default=[0.005, 0.02, 0.05],
        help="the server's batching wait, one server each (0.05: rollout.server.max_wait_s's default)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model, seed=0)
    engine = BuiltinEngine(model, tokenizer)
    calls: list[int] = []
    generate = engine_generate_fn(engine)

    def counted(prompts: DataProto) -> DataProto:
        calls.append(len(prompts))
        return generate(prompts)

    prompts = chat_prompts(tokenizer, args.requests)
    with ExitStack() as stack:
        urls = {
            f"server, max_wait_s={wait:g}": stack.enter_context(
                PolicyServer(counted, tokenizer, eos_token_ids=engine.eos_token_ids, max_wait_s=wait)
            ).url
            for wait in args.max_wait_s
        }
        for url in urls.values():  # warm-up, untimed
            asyncio.run(rollout(CompletionsClient(url, seed=-1), prompts[:4], 4))
        modes = ["direct", *urls]
        runs: dict[str, list[Run]] = {mode: [] for mode in modes}
        for repeat in range(args.repeats):
            seed = 1000 + repeat
            for mode in modes[repeat % len(modes) :] + modes[: repeat % len(modes)]:  # rotate who goes first
                if mode == "direct":
                    client = GenerationBatcher(counted, engine.pad_token_id, engine.eos_token_ids, seed=seed)
                    client.expect(len(prompts))
                else:
                    client = CompletionsClient(urls[mode], seed=seed)
                before = len(calls)
                completions, seconds = asyncio.run(rollout(client, prompts, args.max_tokens))
                runs[mode].append(Run([c.token_ids for c in completions], seconds, len(calls) - before))

    print(
        f"{args.model}, {args.requests} concurrent requests, up to {args.max_tokens} new tokens, "
        f"{args.repeats} repeats, {args.threads} torch thread(s), {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}\n"
    )
    print(
        "| mode | generate calls (mean) | generated tokens (mean) | seconds (median) | tokens/s (median) | vs direct "
        "| same tokens as direct |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    rates = {mode: statistics.median(run.tokens / run.seconds for run in results) for mode, results in runs.items()}
    for mode, results in runs.items():
        same = sum(run.token_ids == direct.token_ids for run, direct in zip(results, runs["direct"]))
        calls_mean, tokens = statistics.mean(r.calls for r in results), statistics.mean(r.tokens for r in results)
        seconds = statistics.median(r.seconds for r in results)
        print(
            f"| {mode} | {calls_mean:.1f} | {tokens:.0f} | {seconds:.3f} | {rates[mode]:.0f} "
            f"| {rates[mode] / rates['direct']:.2f}x | {same}/{len(results)} |"
        )


if __name__ == "__main__":
    main()
