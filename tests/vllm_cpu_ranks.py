"""The spawned ranks of tests/workers/test_vllm_cpu.py: a real vLLM (its CPU build) in each rank's process.

Each rank joins a gloo world, builds :class:`VLLMRolloutEngine` with dummy weights (vLLM's external
launcher, in this process), pushes an HF model's weights into it and generates; rank 0 writes what
it saw to ``result.json`` (tokens, log-prob gaps, sync counts) with an independent reference computed
here from the HF model itself: greedy decoding as an argmax loop over full forwards, and
teacher-forced log-softmax of the sampled tokens.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

MAX_NEW = 12
QUESTIONS = [
    "Natalia sold clips",
    "How many clips did",
    "Weng earns 12 dollars an hour",
    "Let's think step by step.",
    "0123",
    "The answer is #### 72",
    "Yesterday she did 50 minutes of babysitting. How many",
    "?",
]


def spiky(model, seed):
    """Large random weights (std 0.3): logits far from uniform, so greedy tokens do not hinge on rounding."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return model


def prompts(tokenizer):
    """The questions as a left-padded batch (``input_ids``, ``attention_mask``) and their id lists."""
    from hybridflow.core import DataProto

    ids = [tokenizer(q)["input_ids"] for q in QUESTIONS]
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in ids])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids])
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask}), ids


@torch.no_grad()
def hf_greedy(model, ids, eos):
    """Greedy decoding as an argmax loop over full forwards of the HF model, ending at an EOS token."""
    seq, out = list(ids), []
    for _ in range(MAX_NEW):
        token = int(model(torch.tensor([seq])).logits[0, -1].argmax())
        out.append(token)
        seq.append(token)
        if token in eos:
            break
    return out


@torch.no_grad()
def log_prob_gap(model, out):
    """The largest |vLLM's sampled-token log-prob - the HF forward's log-softmax at that token| over real tokens."""
    prompt_width = out.batch["prompts"].shape[1]
    logits = model(
        input_ids=out.batch["input_ids"],
        attention_mask=out.batch["attention_mask"],
        position_ids=out.batch["position_ids"],
    ).logits.float()
    picked = logits[:, prompt_width - 1 : -1].log_softmax(-1).gather(-1, out.batch["responses"][..., None])[..., 0]
    mask = out.batch["response_mask"].bool()
    return float((picked[mask] - out.batch["rollout_log_probs"][mask]).abs().max())


def responses(out):
    """Each row's response tokens (through its last real token)."""
    lengths = out.batch["response_mask"].sum(-1).tolist()
    return [row[:n] for row, n in zip(out.batch["responses"].tolist(), lengths)]


def engine_rank(rank, world, port, model_dir, out_dir, tp):
    """One rank: ``world`` ranks with vLLM tp ``tp``; tp 1 on one rank runs the single-engine checks, tp 2 on two
    ranks pushes an FSDP2-sharded model's weights into a tensor-parallel engine."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(2 if world == 1 else 1)  # one rank owns the 2 cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.configs.schema import RolloutConfig
    from hybridflow.core.sampling import SamplingParams
    from hybridflow.workers.rollout.vllm_engine import VLLMRolloutEngine, iter_full_weights

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    first = spiky(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), seed=1)
    second = spiky(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), seed=2)
    engine = VLLMRolloutEngine.create(
        model_dir,
        tokenizer,
        RolloutConfig(name="vllm", enforce_eager=True),
        tp,
        max_model_len=64,
        device="cpu",
        rows=16,
        dtype="float32",
        seed=0,
    )
    batch, ids = prompts(tokenizer)
    eos = set(engine.eos_token_ids)
    greedy = SamplingParams(max_new_tokens=MAX_NEW)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # vLLM's CPU worker replaces set_num_threads with a no-op; the adapter undoes it
    result = {
        "threads_after_build": threads,
        "threads_settable": torch.get_num_threads() == 3,
        "sleep_mode": engine.enable_sleep_mode,
    }
    torch.set_num_threads(threads)
    if tp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        from hybridflow.workers.fsdp import shard_model

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        reference = spiky(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), seed=1)
        sharded = shard_model(first, mesh)
        result["pushed"] = engine.update_weights(iter_full_weights(sharded), version=1)
        out = engine.generate(batch, greedy=True, sampling=greedy)
        result["greedy"] = responses(out)
        result["reference"] = [hf_greedy(reference, row, eos) for row in ids]
    else:
        for version, model in enumerate((first, second), start=1):  # two syncs in a row
            tag = f"v{version}"
            result[f"{tag}_pushed"] = engine.update_weights(iter_full_weights(model), version=version)
            result[f"{tag}_sync"] = engine.sync_metrics()
            result[f"{tag}_greedy"] = responses(engine.generate(batch, greedy=True, sampling=greedy))
            result[f"{tag}_reference"] = [hf_greedy(model, row, eos) for row in ids]
            sampled = engine.generate(batch, n=2, sampling=SamplingParams(max_new_tokens=MAX_NEW), seed=5)
            result[f"{tag}_log_prob_gap"] = log_prob_gap(model, sampled)
            again = engine.generate(batch, n=2, sampling=SamplingParams(max_new_tokens=MAX_NEW), seed=5)
            result[f"{tag}_same_seed_same_tokens"] = bool(
                torch.equal(again.batch["responses"], sampled.batch["responses"])
            )
            if version == 1:  # rollout.ignore_eos: every sampled response runs to its length, EOS inside or not
                running = SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True)
                ran = engine.generate(batch, n=2, sampling=running, seed=5).batch["response_mask"].sum(-1)
                result["ignore_eos_lengths"] = sorted(set(ran.tolist()))
                result["lengths"] = sorted(set(sampled.batch["response_mask"].sum(-1).tolist()))
                # vLLM's CPU build has no sleep mode: sleep and wake are no-ops that keep the weights in place
                engine.sleep()
                result["awake_after_sleep"] = sorted(engine.awake)
                engine.wake_up()
                result["greedy_after_wake"] = responses(engine.generate(batch, greedy=True, sampling=greedy))
    if rank == 0:
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: vLLM's and gloo's threads sometimes abort it after the work is done
