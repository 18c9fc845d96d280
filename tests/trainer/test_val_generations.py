"""``trainer.log_val_generations``: the first N validation prompts with their responses, in every sink.

A real run (2 Ray ranks, the built-in tiny model) validates at steps 0 and 2
with ``trainer.log_val_generations=4`` and validation batches of 3, so the
four rows span two generation calls. The rows are read back from the console
log, ``val_generations.jsonl`` and the offline W&B run, and checked against
the validation file (prompts in order, ground truths) and a score computed
here from the response text.
"""

import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.data.loading import load_rows
from hybridflow.data.synthetic import generate_synthetic
from hybridflow.trainer.main import build_and_fit
from hybridflow.trainer.prompt_loader import PromptSet
from hybridflow.trainer.tracking import GENERATION_COLUMNS
from hybridflow.workers.models import build_char_tokenizer

pytestmark = pytest.mark.slow

SHOWN = 4

DIGIT_SHARE = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
    "    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)\n"
)


def digit_share(response):
    """The reward above, on the text the reward manager sees: the response without its special tokens."""
    text = re.sub(r"<[^<>]*>", "", response)
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def test_first_validation_prompts_reach_console_jsonl_and_wandb(ray_session, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    files = generate_synthetic(str(tmp_path / "data"), train_size=16, val_size=8, seed=0)
    reward = tmp_path / "digit_share.py"
    reward.write_text(DIGIT_SHARE)
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {
        "data.train_files": [files["train"]],
        "data.val_files": [files["val"]],
        "data.train_batch_size": 4,
        "data.val_batch_size": 3,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.rollout.response_length": 4,
        "reward.custom_reward_function.path": str(reward),
        "trainer.total_training_steps": 2,
        "trainer.test_freq": 2,
        "trainer.log_val_generations": SHOWN,
        "trainer.logger": ["console", "jsonl", "wandb"],
    }.items():
        OmegaConf.update(cfg, key, value)
    run = tmp_path / "run"
    with caplog.at_level("INFO", logger="hybridflow.metrics"):
        build_and_fit(OmegaConf.to_object(cfg), run)

    val = PromptSet.from_rows(load_rows([files["val"]])[0], build_char_tokenizer(), 512)
    rows = [json.loads(line) for line in (run / "val_generations.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] * SHOWN + [2] * SHOWN
    for row in rows[:SHOWN], rows[SHOWN:]:
        assert [r["prompt"] for r in row] == val.texts[:SHOWN]  # the first N prompts, in order
        assert [r["ground_truth"] for r in row] == val.ground_truths[:SHOWN]
    for r in rows:
        assert set(r) == {"step", *GENERATION_COLUMNS}
        assert 1 <= len(re.findall(r"<[^<>]*>|[^<]", r["response"])) <= 4  # at most response_length tokens
        assert r["score"] == pytest.approx(digit_share(r["response"]))

    lines = [rec.getMessage() for rec in caplog.records if " val/generations[" in rec.getMessage()]
    assert len(lines) == 2 * SHOWN
    for index, (line, r) in enumerate(zip(lines, rows)):
        assert line == (
            f"step {r['step']} val/generations[{index % SHOWN}]: prompt={r['prompt']!r} "
            f"response={r['response']!r} ground_truth={r['ground_truth']!r} score={r['score']:.4g}"
        )

    # the offline W&B run: one table file per validation, each referenced from the run's transaction log (in
    # logging order; tests/trainer/test_tracking.py reads the history record itself, step included)
    [offline] = Path(run, "wandb").glob("offline-run-*")
    [log] = offline.glob("run-*.wandb")
    records = log.read_bytes()
    tables = list(offline.glob("files/media/table/val/generations_*.table.json"))
    positions = {path: records.find(str(path.relative_to(offline / "files")).encode()) for path in tables}
    assert len(tables) == 2 and -1 not in positions.values()
    for path, logged in zip(sorted(tables, key=positions.get), (rows[:SHOWN], rows[SHOWN:])):
        table = json.loads(path.read_text())
        assert table["columns"] == list(GENERATION_COLUMNS)
        assert table["data"] == [[r[c] for c in GENERATION_COLUMNS] for r in logged]
