"""Why LoRA does not learn the default task: the same GRPO update in one plain process, LoRA against training the
linear weights alone, with 1- or 4-token responses.

    python bench/probe_lora_learning.py --mode lora --rank 64 --alpha 128 --lr 1e-3 --response-length 4
    python bench/probe_lora_learning.py --mode linear --lr 5e-4 --response-length 4

No trainer, no Ray: ``builtin:tiny-qwen2`` (seed 0, the trainer's model and, with ``--mode lora``, the trainer's
adapters: ``workers/lora.py``), 16 prompts ``max(d1,d2,d3,d4)=`` x 8 samples a step, the arithmetic verifier on the
response up to EOS, GRPO's group-normalized advantages, a token-mean policy-gradient loss over the response, two
AdamW steps a step (grad clip 1). ``--mode linear`` trains every linear weight with embeddings, norms and biases
frozen: the parameters LoRA on all linear layers can reach at full rank (rank 64 is full rank for this 64-wide
model). Prints the batch reward and the greedy accuracy on 256 fresh prompts every 50 steps.
"""

from __future__ import annotations

import argparse
import random
import re
from types import SimpleNamespace

import torch

from hybridflow.rewards.arithmetic import leading_integer
from hybridflow.workers import lora
from hybridflow.workers.models import load_model_and_tokenizer


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["lora", "linear"], default="lora")
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=128.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--response-length", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    return parser.parse_args()


def prompts(tokenizer, count: int) -> tuple[torch.Tensor, list[int]]:
    ids, answers = [], []
    for _ in range(count):
        digits = [random.randint(0, 9) for _ in range(4)]
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"max({','.join(map(str, digits))})="}],
            add_generation_prompt=True,
            tokenize=False,
        )
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        answers.append(max(digits))
    return torch.tensor(ids), answers


def sample(model, ids: torch.Tensor, length: int, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled responses (rows, length) and their mask (tokens up to and with the first EOS)."""
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            max_new_tokens=length,
            top_k=0,
            top_p=1.0,
            pad_token_id=0,
            eos_token_id=eos,
        )[:, ids.shape[1] :]
    out = torch.cat([out, out.new_zeros(len(out), length - out.shape[1])], 1)
    after_eos = (out == eos).int().cumsum(1) - (out == eos).int()
    return out, (after_eos == 0).float()


def main() -> None:
    args = parse()
    model, tokenizer = load_model_and_tokenizer("builtin:tiny-qwen2", dtype=torch.float32, seed=0)
    torch.manual_seed(0)
    random.seed(0)
    if args.mode == "lora":
        lora.add_adapters(
            model,
            lora.lora_config(
                SimpleNamespace(
                    lora_rank=args.rank,
                    lora_alpha=args.alpha,
                    target_modules="all-linear",
                    exclude_modules=None,
                    lora_adapter_path=None,
                )
            ),
            seed=0,
        )
    else:
        for name, param in model.named_parameters():
            param.requires_grad_(not re.search("embed|norm|bias", name))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    eos = model.generation_config.eos_token_id
    digit_ids = torch.tensor(tokenizer.convert_tokens_to_ids([str(d) for d in range(10)]))
    for step in range(args.steps + 1):
        ids, answers = prompts(tokenizer, 16)
        ids, answers = ids.repeat_interleave(8, 0), [a for a in answers for _ in range(8)]
        responses, mask = sample(model, ids, args.response_length, eos)
        texts = [tokenizer.decode(r[m.bool()], skip_special_tokens=True) for r, m in zip(responses, mask)]
        reward = torch.tensor([float(leading_integer(t) == a) for t, a in zip(texts, answers)]).view(16, 8)
        advantages = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)).view(-1, 1)
        full, start = torch.cat([ids, responses], 1), ids.shape[1]
        for half in (slice(0, 64), slice(64, 128)):
            logits = model(full[half]).logits[:, start - 1 : -1]
            log_probs = torch.log_softmax(logits, -1).gather(2, responses[half, :, None])[..., 0]
            loss = -(advantages[half] * log_probs * mask[half]).sum() / mask[half].sum()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
        if step % 50 == 0:
            val_ids, val_answers = prompts(tokenizer, 256)
            with torch.no_grad():
                greedy = model(val_ids).logits[:, -1].argmax(-1)
            accuracy = (greedy == digit_ids[torch.tensor(val_answers)]).float().mean().item()
            print(f"step {step}: reward {reward.mean().item():.3f}, greedy accuracy {accuracy:.3f}", flush=True)
    print(f"{args.mode} rank={args.rank} alpha={args.alpha} lr={args.lr} response_length={args.response_length}")


if __name__ == "__main__":
    main()
