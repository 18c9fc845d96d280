"""The CPU decode kernel against SDPA: per call at the bench's shapes, and the built-in engine's whole generation.

    python bench/bench_attention.py [--response-length 32] [--prompts 16] [--n 8] [--threads 2] [--pairs 9]

1. One decode step's attention, ``(rows, 4 heads, 1, 64)`` queries against ``(rows, 2 kv heads, S, 64)``
   keys under a left-padding mask: ``F.scaled_dot_product_attention(..., enable_gqa=True)`` (what transformers'
   sdpa calls; on a CPU its flash kernel) against :func:`hybridflow.workers.decode_attention.decode_attention`,
   medians of 200 calls after 5 warm-ups.
2. The built-in engine generating ``bench/bench_vs_trl.py``'s job (``builtin:small-qwen2``, 16 prompts x 8
   samples at temperature 1) with the model's attention wrapped (``hybridflow+sdpa``: the decode kernel) and
   plain (``sdpa``), alternating in one process (``--pairs`` pairs after one warm-up pair), same seed: the
   medians, the ratio, and whether the two sampled the same tokens (and the largest log-prob gap).
3. bf16 on a CPU: the update's tree attention (16 rows, 4 heads, 128 queries over 20 + 128 keys, d 64,
   masked; forward and backward) and a decode step's (128 rows, 148 keys, left padding) in fp32, in bf16, and
   in bf16 computed in fp32 (what the wrapper does on a CPU for blocks of queries, and not for decode steps),
   medians of 20 calls (forward and backward) or 200 (decode steps).
"""

from __future__ import annotations

import platform
import statistics
import time

import torch
import torch.nn.functional as F
from bench_rollout import build_prompts
from bench_update_profile import job_parser

from hybridflow.workers import attention
from hybridflow.workers.decode_attention import decode_attention
from hybridflow.workers.models import load_model_and_tokenizer
from hybridflow.workers.rollout import BuiltinEngine, EngineConfig, SamplingParams


def per_call_ms(fn, reps: int = 200) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` calls after 5 warm-ups (in 10 timed groups)."""
    for _ in range(5):
        fn()
    groups = []
    for _ in range(10):
        start = time.perf_counter()
        for _ in range(reps // 10):
            fn()
        groups.append((time.perf_counter() - start) / (reps // 10) * 1e3)
    return statistics.median(groups)


def kernel_table(rows: int) -> None:
    print("| keys S | sdpa (flash) ms | decode kernel ms | ratio |\n|---:|---:|---:|---:|")
    gen = torch.Generator().manual_seed(0)
    for length in (20, 36, 52, 256):
        query = torch.randn(rows, 4, 1, 64, generator=gen)
        key, value = (torch.randn(rows, 2, length, 64, generator=gen) for _ in range(2))
        mask = (torch.arange(length)[None, :] >= (torch.arange(rows) % 8)[:, None])[:, None, None, :]
        sdpa = per_call_ms(lambda: F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True))
        ours = per_call_ms(lambda: decode_attention(query, key, value, mask, 64**-0.5))
        print(f"| {length} | {sdpa:.3f} | {ours:.3f} | {sdpa / ours:.2f}x |")


def half_precision_table() -> None:
    print(
        "\n| call | fp32 ms | bf16 ms | bf16 computed in fp32 ms | bf16 / computed in fp32 |\n|---|---:|---:|---:|---:|"
    )
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(16, 1, 128, 148, dtype=torch.bool).tril(20)  # every prompt key, causal among its own

    def tree(dtype: torch.dtype, upcast: bool):
        q = torch.randn(16, 4, 128, 64, generator=gen).to(dtype).requires_grad_()
        k, v = (torch.randn(16, 4, 148, 64, generator=gen).to(dtype).requires_grad_() for _ in range(2))

        def call():
            args = (q.float(), k.float(), v.float()) if upcast else (q, k, v)
            F.scaled_dot_product_attention(*args, attn_mask=mask).to(dtype).sum().backward()

        return per_call_ms(call, reps=20)

    def decode(dtype: torch.dtype, upcast: bool):
        q = torch.randn(128, 4, 1, 64, generator=gen).to(dtype)
        k, v = (torch.randn(128, 2, 148, 64, generator=gen).to(dtype) for _ in range(2))
        pads = (torch.arange(148)[None, :] >= (torch.arange(128) % 8)[:, None])[:, None, None, :]  # left padding
        return per_call_ms(lambda: decode_attention(*(t.float() if upcast else t for t in (q, k, v)), pads, 0.125))

    for name, fn in (("update's tree attention, forward and backward", tree), ("decode step", decode)):
        fp32, bf16, via = fn(torch.float32, False), fn(torch.bfloat16, False), fn(torch.bfloat16, True)
        print(f"| {name} | {fp32:.2f} | {bf16:.2f} | {via:.2f} | {bf16 / via:.2f}x |")


def generation_ab(args) -> None:
    model, tokenizer = load_model_and_tokenizer("builtin:small-qwen2", seed=0)
    engine = BuiltinEngine(model, tokenizer, EngineConfig())  # installs the wrapper
    prompts = build_prompts(tokenizer, args.prompts)
    sampling = SamplingParams(max_new_tokens=args.response_length)
    seconds, outputs = {"hybridflow+sdpa": [], "sdpa": []}, {}
    for _ in range(args.pairs + 1):  # the first pair warms up
        for name in seconds:
            (attention.install if name.startswith(attention.PREFIX) else attention.uninstall)(model)
            start = time.perf_counter()
            outputs[name] = engine.generate(prompts, n=args.n, seed=5, sampling=sampling)
            seconds[name].append(time.perf_counter() - start)
    wrapped, plain = (statistics.median(seconds[name][1:]) for name in seconds)
    a, b = outputs.values()
    same = torch.equal(a.batch["responses"], b.batch["responses"])
    gap = float((a.batch["rollout_log_probs"] - b.batch["rollout_log_probs"]).abs().max())
    tokens = int(a.batch["response_mask"].sum())
    print(
        f"\nGeneration, {args.prompts} prompts x {args.n} samples, {tokens} tokens, medians of {args.pairs} "
        f"alternating pairs: wrapped (decode kernel) {wrapped:.3f} s, plain sdpa {plain:.3f} s: "
        f"**{plain / wrapped:.2f}x**; same tokens: {same}; largest log-prob gap {gap:.1e}"
    )


def main() -> None:
    parser = job_parser(__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"Command: `python bench/bench_attention.py --response-length {args.response_length} --prompts "
        f"{args.prompts} --n {args.n} --threads {args.threads} --pairs {args.pairs}`"
    )
    print(f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads; torch {torch.__version__}\n")
    kernel_table(args.prompts * args.n)
    generation_ab(args)
    half_precision_table()


if __name__ == "__main__":
    main()
