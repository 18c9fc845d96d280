"""Helpers shared by tests (importable as ``support``: setup.cfg puts tests/ on sys.path)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from hybridflow.core import DataProto


def tiny_model(seed=0):
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=24,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config).float()


def spiky_model(name="tiny-qwen2"):
    """A built-in model with large random weights, so greedy outputs vary from token to token (the default
    0.02-std init repeats one token) and some tokens become likely EOS candidates; and its tokenizer."""
    from hybridflow.workers.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(f"builtin:{name}", seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.35)
    return model, tokenizer


def rollout_batch(rows=8, prompt=4, response=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, prompt + 1, (rows,), generator=gen)
    response_len = torch.randint(1, response + 1, (rows,), generator=gen)
    prompts = torch.randint(3, 24, (rows, prompt), generator=gen)
    responses = torch.randint(3, 24, (rows, response), generator=gen)
    p_mask = (torch.arange(prompt) >= prompt - prompt_len[:, None]).long()  # left padded
    r_mask = (torch.arange(response) < response_len[:, None]).long()
    attention = torch.cat([p_mask, r_mask], dim=1)
    position = (attention.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {
            "prompts": prompts * p_mask,
            "responses": responses * r_mask,
            "input_ids": torch.cat([prompts * p_mask, responses * r_mask], dim=1),
            "attention_mask": attention,
            "position_ids": position,
            "response_mask": r_mask,
            "advantages": torch.randn(rows, 1, generator=gen).expand(rows, response).contiguous() * r_mask,
        }
    )


def fsdp_update_rank(
    rank, world, port, mode, micro, out_dir, mini_batches=1, reshard_after_forward=True, accumulate_unsharded=True
):
    """One rank of a dp=``world`` FSDP2 PPO update (``mini_batches`` optimizer steps); rank 0 saves the full
    parameters."""
    from torch.distributed.device_mesh import init_device_mesh

    from hybridflow.configs.schema import ActorConfig, FSDPConfig
    from hybridflow.workers.actor.ppo_actor import PPOActor
    from hybridflow.workers.fsdp import full_parameters, shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        model = shard_model(tiny_model(), mesh, reshard_after_forward=reshard_after_forward)
        data = torch.load(os.path.join(out_dir, "data.pt"), weights_only=False)
        shard = data.chunk(world)[rank]
        actor = PPOActor(
            model,
            torch.optim.SGD(model.parameters(), lr=0.5),
            ActorConfig(
                ppo_micro_batch_size_per_gpu=micro,
                fsdp_config=FSDPConfig(accumulate_unsharded_grads=accumulate_unsharded),
            ),
            loss_agg_mode=mode,
            rows_per_mini_batch=len(shard) // mini_batches,
            dp_group=mesh.get_group(),
        )
        actor.update_policy(shard, temperature=1.0)
        params = full_parameters(model)
        if rank == 0:
            torch.save(params, os.path.join(out_dir, "params.pt"))
        dist.barrier()  # no rank tears down its connections while another still uses them
    finally:
        dist.destroy_process_group()
    # Skip interpreter teardown: a torch.distributed background thread still
    # joinable at exit sometimes aborts the process ("terminate called without
    # an active exception") after all the work above is done and saved.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SENTENCES = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "Weng earns 12 dollars an hour for babysitting. Yesterday she did 50 minutes of babysitting.",
    "Let's think step by step. The answer is #### 72",
    "How many clips did Natalia sell altogether in April and May? 0123456789 + - * / = ( ) ? !",
]


def bpe_chat_tokenizer():
    """A byte-level BPE tokenizer trained on :data:`SENTENCES`, with a chat template (:data:`CHAT_TEMPLATE`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        SENTENCES,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def local_qwen2_checkpoint(directory, *, hidden=32, layers=2, seed=0, tied=True):
    """A real local HF checkpoint, as a practitioner has one: a small Qwen2 with random weights and a byte-level
    BPE tokenizer trained on a few sentences, with a chat template, both written with ``save_pretrained``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = bpe_chat_tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=tied,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def gsm8k_parquet(path, rows):
    """A GSM8K-format parquet (veRL's schema, as ``data.preprocess gsm8k`` writes it) of simple sums."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = []
    for i in range(rows):
        a, b = 3 + i % 17, 5 + (7 * i) % 23
        question = f"Natalia sold {a} clips in April and {b} clips in May. How many clips did she sell?"
        records.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [
                    {
                        "role": "user",
                        "content": question + ' Let\'s think step by step and output the final answer after "####".',
                    }
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": "train", "index": i},
            }
        )
    pq.write_table(pa.Table.from_pylist(records), path)
    return str(path)


def small_config(tmp_path, **overrides):
    """The trainer's config for a 3-step job on the tiny model (4 prompts x 4 samples, 4-token responses) on
    one rank (a test of a layout sets its ranks: each rank is a process that costs the suite seconds to
    start), checked as the command checks it; ``overrides`` are dotted keys."""
    from omegaconf import OmegaConf

    from hybridflow.configs.schema import PPOConfig
    from hybridflow.trainer.config_checks import check_config

    cfg = OmegaConf.structured(PPOConfig)
    base = {
        "data.synthetic_dir": str(tmp_path / "data"),
        "data.train_batch_size": 4,
        "data.val_batch_size": 64,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.rollout.response_length": 4,
        "trainer.total_training_steps": 3,
        "trainer.test_freq": 0,
        "trainer.n_gpus_per_node": 1,
    }
    for key, value in {**base, **overrides}.items():
        OmegaConf.update(cfg, key, value)
    config = OmegaConf.to_object(cfg)
    check_config(config)
    return config


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def read_trail(run_dir):
    """The run's audit trail (``trained_prompts.jsonl``), one record per line."""
    return [json.loads(line) for line in (run_dir / "trained_prompts.jsonl").read_text().splitlines()]


def mixed_precision_rank(rank, model_dir, out_dir, port):
    """One gloo rank: ``experiment=gsm8k_grpo trainer=cpu`` composed, the actor loaded and sharded as its worker
    does (master dtype, the role's compute dtype), one forward and one AdamW step; writes the dtypes seen."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from torch.distributed.device_mesh import init_device_mesh

    from hybridflow.configs import CONFIG_DIR
    from hybridflow.configs.schema import register_configs
    from hybridflow.workers.fsdp import shard_role
    from hybridflow.workers.models import load_model_and_tokenizer, torch_dtype
    from hybridflow.workers.optim import build_optimizer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=1)
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(
            "ppo_trainer",
            overrides=["experiment=gsm8k_grpo", "trainer=cpu", f"actor_rollout_ref.model.path={model_dir}"],
        )
    arr = OmegaConf.to_object(cfg).actor_rollout_ref
    fsdp = arr.actor.fsdp_config
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    model, _ = load_model_and_tokenizer(model_dir, dtype=torch_dtype(fsdp.master_dtype))
    model = shard_role(model, mesh, fsdp, compute_dtype=fsdp.compute_dtype(arr.model))
    optimizer, _ = build_optimizer(model, arr.actor.optim)
    logits = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
    logits.float().mean().backward()
    optimizer.step()
    states = {str(t.dtype) for state in optimizer.state.values() for t in state.values() if t.dim() > 0}
    with open(os.path.join(out_dir, "dtypes.json"), "w") as f:
        json.dump(
            {
                "parameters": sorted({str(p.dtype) for p in model.parameters()}),
                "logits": str(logits.dtype),
                "optimizer_state": sorted(states),
            },
            f,
        )
    dist.destroy_process_group()


def local_reward_model(directory, tokenizer, *, hidden=32, layers=2, seed=0, scale=0.3):
    """A local reward-model directory as ``reward_model.model.path`` takes it: a Qwen2 sequence classifier with one
    label and random weights (``scale``: their std, so scores differ from text to text) beside ``tokenizer``."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen2ForSequenceClassification(config).float()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, scale)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@contextlib.contextmanager
def editable_install(example, workdir, distribution, module):
    """``example`` (a plugin package folder) copied into ``workdir`` and pip-installed in editable mode into this
    interpreter's environment without the network; uninstalled, and the plugin manager reset, on exit. Yields
    the copy's path. Tests that use it change the venv every other test reads: mark them serial."""
    import shutil
    import subprocess

    from hybridflow.plugins import reset_plugin_manager

    source = workdir / example.name
    shutil.copytree(example, source)
    pip = [sys.executable, "-m", "pip"]
    flags = ["--quiet", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(source)]
    result = subprocess.run([*pip, "install", *flags], capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stderr
    try:
        yield source
    finally:
        subprocess.run([*pip, "uninstall", "--yes", distribution], capture_output=True, timeout=170)
        sys.modules.pop(module, None)
        reset_plugin_manager()


def faulty(base: type, method: str, rank: int, call: int, action: str, record: Path, after: Path | None = None) -> type:
    """``base`` whose rank ``rank`` stops itself (``action="stop"``), sleeps for good (``"sleep"``) or dies by
    SIGKILL (``"kill"``) as call ``call`` of ``method`` begins, after writing its pid and the time to ``record``.
    The fault fires once: not where ``record`` exists already (a run that restarts itself makes new workers), nor
    before ``after`` exists (faults that fire in turn, one per restart). A class made here is sent to the workers
    by value, faults and all."""

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        if self.rank != rank:
            return
        real, calls = getattr(self, method), [0]

        def wrapped(*a, **kw):
            calls[0] += 1
            armed = not record.exists() and (after is None or after.exists())
            if calls[0] == call and armed:
                record.write_text(json.dumps({"pid": os.getpid(), "at": time.time()}))
                if action == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if action == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                time.sleep(600)
            return real(*a, **kw)

        setattr(self, method, wrapped)

    return type(f"Faulty{base.__name__}", (base,), {"__init__": __init__})


def borrowed_venv(where: Path, *, with_hybridflow: bool) -> tuple[Path, Path]:
    """A virtualenv at ``where`` whose site-packages links every package this suite's venv has (fast: nothing is
    installed), hybridflow's editable install included or not; returns its python and its site-packages. What a
    test pip-installs there stays out of the venv every other test reads, so the test need not run serially."""
    import sysconfig
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = where / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip())
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if with_hybridflow or "hybridflow" not in entry.name:
            (site / entry.name).symlink_to(entry)
    return python, site
