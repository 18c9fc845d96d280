"""``hybridflow export``: a checkpoint's policy as a transformers directory, read offline.

The fast tests write a checkpoint in this process (``save_role`` on a plain
model, as one rank would) and export it; the slow one trains on 2 Ray ranks
(FSDP shards), exports in a fresh process without Ray and checks that the
exported model's greedy responses to the 8 validation prompts are, token for
token, the ones the trainer's validation generated with the same weights.
"""

import json
import re
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.cli import main
from hybridflow.configs.schema import PPOConfig
from hybridflow.data.synthetic import generate_synthetic
from hybridflow.tools.export import ExportError, export_checkpoint
from hybridflow.trainer.checkpoint import DRIVER_STATE, latest_checkpoint
from hybridflow.trainer.main import build_and_fit
from hybridflow.workers.checkpointing import HF_FILES, save_hf_files, save_role
from hybridflow.workers.models import load_model_and_tokenizer

RESPONSE_LENGTH = 6

# the fast tests save a checkpoint in this process alone, as one rank would; DCP warns about exactly that
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def noisy_builtin(scale):
    """The built-in tiny Qwen2 (seed 0) with seeded noise of std ``scale`` on every weight, and its tokenizer.

    Seeded random init makes a tied model echo its last input token whatever the prompt; noise of std 0.3
    makes its greedy responses differ from prompt to prompt (EOS and other special tokens among them).
    """
    model, tokenizer = load_model_and_tokenizer("builtin:tiny-qwen2", seed=0)
    noise = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=noise))
    return model, tokenizer


def write_checkpoint(run_dir, *, hf_files=True):
    """A trained-looking policy saved as step 3 of ``run_dir`` (as one rank would); returns (dir, model)."""
    model, tokenizer = noisy_builtin(0.01)
    checkpoint = run_dir / "checkpoints" / "global_step_3"
    save_role(checkpoint, "actor", model, torch.optim.AdamW(model.parameters()))
    if hf_files:
        save_hf_files(checkpoint, "actor", model.config, model.generation_config, tokenizer)
    (checkpoint / DRIVER_STATE).write_text(json.dumps({"global_step": 3}))
    return checkpoint, model


def assert_same_weights(exported, model):
    expected = model.state_dict()
    got = exported.state_dict()
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    assert exported.lm_head.weight.data_ptr() == exported.model.embed_tokens.weight.data_ptr()  # still tied


def test_export_writes_a_directory_from_pretrained_loads(tmp_path, capsys):
    checkpoint, model = write_checkpoint(tmp_path / "run")
    assert main(["export", str(checkpoint), str(tmp_path / "out")]) == 0
    assert "wrote" in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert_same_weights(exported, model)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer("12+3=")["input_ids"] == load_model_and_tokenizer("builtin:tiny-qwen2")[1]("12+3=")["input_ids"]
    assert tokenizer.chat_template and tokenizer.eos_token == "<eos>"
    prompt = torch.tensor([tokenizer("<bos><|user|>1+2=<|assistant|>", add_special_tokens=False)["input_ids"]])
    assert torch.equal(exported(prompt).logits, model.eval()(prompt).logits)


def test_an_older_checkpoint_exports_through_the_run_config(tmp_path):
    """Without ``actor/huggingface`` the run's ``.hydra/config.yaml`` names the model (here the built-in one)."""
    checkpoint, model = write_checkpoint(tmp_path / "run", hf_files=False)
    assert not (checkpoint / "actor" / HF_FILES).exists()
    with pytest.raises(ExportError, match=r"no folder above it holds the run's \.hydra/config\.yaml"):
        export_checkpoint(checkpoint, tmp_path / "out")
    (tmp_path / "run" / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.structured(PPOConfig), tmp_path / "run" / ".hydra" / "config.yaml")
    export_checkpoint(checkpoint, tmp_path / "out")
    assert_same_weights(AutoModelForCausalLM.from_pretrained(tmp_path / "out"), model)
    assert AutoTokenizer.from_pretrained(tmp_path / "out").pad_token == "<pad>"


def test_export_of_something_else_says_what_it_expected(tmp_path, capsys):
    (tmp_path / "global_step_2").mkdir()
    assert main(["export", str(tmp_path / "global_step_2"), str(tmp_path / "out")]) == 2
    assert (
        "is not a checkpoint (expected a .../global_step_<N> directory holding driver.json)" in capsys.readouterr().err
    )
    (tmp_path / "global_step_2" / DRIVER_STATE).write_text("{}")
    assert main(["export", str(tmp_path / "global_step_2"), str(tmp_path / "out")]) == 2
    assert "has no 'actor' model shards" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def train_config(files, **overrides):
    """3 steps of 4 prompts x 4 samples on 2 ranks; validation (logging all 8 rows) and a checkpoint at step 3."""
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {
        "data.train_files": [files["train"]],
        "data.val_files": [files["val"]],
        "data.train_batch_size": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.rollout.response_length": RESPONSE_LENGTH,
        "trainer.total_training_steps": 3,
        "trainer.test_freq": 3,
        "trainer.save_freq": 3,
        "trainer.log_val_generations": 8,
        "trainer.save_hf_on_end": True,
        **overrides,
    }.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_object(cfg)


def token_ids(text, tokenizer):
    """The ids a decoded text came from. The built-in vocabulary is single characters and ``<...>`` specials
    (no ``<`` among the characters), so a text splits into tokens one way only; re-encoding it would not do:
    the tokenizer drops a space next to a special token."""
    vocab = tokenizer.get_vocab()
    pieces = re.findall("|".join(re.escape(t) for t in sorted(vocab, key=len, reverse=True)), text)
    assert "".join(pieces) == text, text
    return [vocab[piece] for piece in pieces]


def greedy_ids(model, tokenizer, prompt):
    """The response tokens of HF greedy decoding, up to and including EOS, as the rollout engine stops."""
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=RESPONSE_LENGTH,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.slow
def test_exported_model_generates_what_the_trainer_validated(ray_session, tmp_path):
    """Train 3 steps on 2 ranks, checkpoint at step 3 right after validating there; export the checkpoint
    in a process without Ray; greedy decoding with ``from_pretrained`` of the export reproduces the token ids
    of the step-3 validation responses (logged with special tokens kept, so each text names its ids).

    The policy starts from a local directory holding a noisy tiny model, so the 8 responses differ from prompt
    to prompt, and the comparison can fail: the step-0 validation (the initial weights) answered differently.
    """
    files = generate_synthetic(str(tmp_path / "data"), train_size=16, val_size=8, seed=0)
    start, tokenizer = noisy_builtin(0.3)
    start.save_pretrained(tmp_path / "start")
    tokenizer.save_pretrained(tmp_path / "start")
    run = tmp_path / "run"
    overrides = {"actor_rollout_ref.model.path": str(tmp_path / "start"), "actor_rollout_ref.actor.optim.lr": 1e-4}
    summary = build_and_fit(train_config(files, **overrides), run)
    assert summary.steps == 3
    checkpoint = latest_checkpoint(run / "checkpoints")
    assert checkpoint.name == "global_step_3"
    assert (checkpoint / "actor" / HF_FILES / "config.json").is_file()

    out = tmp_path / "exported"
    script = (
        "import sys; from hybridflow.cli import main; code = main(sys.argv[1:]); "
        "assert 'ray' not in sys.modules, 'export imported Ray'; sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "export", str(checkpoint), str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    rows = [json.loads(line) for line in (run / "val_generations.jsonl").read_text().splitlines()]
    before, after = [r for r in rows if r["step"] == 0], [r for r in rows if r["step"] == 3]
    assert len(before) == len(after) == 8
    assert [r["prompt"] for r in before] == [r["prompt"] for r in after]
    assert len({r["response"] for r in after}) >= 4, "the responses hardly depend on the prompt"
    assert [r["response"] for r in before] != [r["response"] for r in after], "training changed no greedy response"
    for row in after:
        assert greedy_ids(model, tokenizer, row["prompt"]) == token_ids(row["response"], tokenizer), row

    # the end-of-run HF directory (trainer.save_hf_on_end) holds the same weights, gathered by the live actor
    live = AutoModelForCausalLM.from_pretrained(run / "hf_model", dtype=torch.float32)
    assert_same_weights(model, live)
