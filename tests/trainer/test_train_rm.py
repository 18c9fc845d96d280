"""``hybridflow-train-rm``: the Bradley-Terry loss, the synthetic preferences, the token layout, and the command
end to end (the saved reward model rescored by hand, one rank against two, a bad config)."""

import json
import math
import os
import re
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import torch

from hybridflow.configs.rm_schema import RMConfig
from hybridflow.data.synthetic_preferences import REJECTED_KINDS, generate_preferences
from hybridflow.losses.bradley_terry import bradley_terry_loss, correct_pairs, pairwise_accuracy
from hybridflow.rewards.arithmetic import compute_score
from hybridflow.tools.train_rm import override_problems
from hybridflow.trainer.prompt_loader import PromptSet
from hybridflow.workers.models import load_tokenizer
from hybridflow.workers.reward_model_trainer import preference_ids

TRAIN_RM = [sys.executable, "-m", "hybridflow.tools.train_rm"]
STEPS = 6


def clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_API_KEY", "WANDB_MODE")}


# ------------------------------------------------------------------ the loss
def test_bradley_terry_loss_and_accuracy_match_hand_computed_values():
    chosen, rejected = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 1.0])
    # -log sigmoid(d) = log(1 + exp(-d)) for d = 2, 0, -2
    expected = [math.log(1 + math.exp(-2)), math.log(2), math.log(1 + math.exp(2))]
    assert bradley_terry_loss(chosen, rejected).tolist() == pytest.approx(expected, abs=1e-6)
    assert bradley_terry_loss(chosen, rejected).tolist() == pytest.approx([0.126928, 0.693147, 2.126928], abs=1e-6)
    # a margin of 1 moves every difference down by 1: d = 1, -1, -3
    assert bradley_terry_loss(chosen, rejected, margin=1.0).tolist() == pytest.approx(
        [0.313262, 1.313262, 3.048587], abs=1e-6
    )
    assert bradley_terry_loss(chosen, rejected, margin=torch.tensor([1.0, 0.0, 0.0])).tolist() == pytest.approx(
        [0.313262, 0.693147, 2.126928], abs=1e-6
    )
    # a tie is not a ranking: only the first pair counts as right
    assert correct_pairs(chosen, rejected).tolist() == [True, False, False]
    assert pairwise_accuracy(chosen, rejected) == pytest.approx(1 / 3)
    # finite, and linear in the difference, far out: -log sigmoid(-200) = 200
    assert bradley_terry_loss(torch.tensor([-100.0]), torch.tensor([100.0])).item() == pytest.approx(200.0)


def test_bradley_terry_gradient_pulls_the_pair_apart():
    chosen, rejected = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    bradley_terry_loss(chosen, rejected).sum().backward()
    # d/dr_c of -log sigmoid(r_c - r_r) = -(1 - sigmoid(0)) = -0.5: raising the chosen score lowers the loss
    assert chosen.grad.item() == pytest.approx(-0.5) and rejected.grad.item() == pytest.approx(0.5)


# --------------------------------------------------------- the preference set
@pytest.fixture(scope="module")
def preferences(tmp_path_factory):
    root = tmp_path_factory.mktemp("preferences")
    paths = generate_preferences(str(root / "a"), seed=0)
    return {split: pq.read_table(path).to_pylist() for split, path in paths.items()}


def digits_of(row):
    return [int(d) for d in re.findall(r"\d", row["prompt"][0]["content"])]


def test_preferences_are_deterministic_in_the_seed(preferences, tmp_path):
    again = generate_preferences(str(tmp_path / "b"), seed=0)
    assert {s: pq.read_table(p).to_pylist() for s, p in again.items()} == preferences
    other = pq.read_table(generate_preferences(str(tmp_path / "c"), seed=1)["train"]).to_pylist()
    assert other != preferences["train"]


def test_preference_splits_are_disjoint_and_sized(preferences):
    train, val = preferences["train"], preferences["val"]
    assert len(train) >= 2000 and 200 <= len(val) <= 1000
    train_prompts = {r["prompt"][0]["content"] for r in train}
    assert not train_prompts & {r["prompt"][0]["content"] for r in val}
    assert set(train[0]) >= {"prompt", "chosen", "rejected", "data_source"}
    assert {r["data_source"] for r in train + val} == {"synthetic/arithmetic"}
    first = train[0]["prompt"][0]
    assert first["role"] == "user" and re.fullmatch(r"max\(\d(,\d){3}\)=", first["content"])


def test_chosen_is_the_answer_and_rejected_is_wrong_of_every_kind(preferences):
    rows = preferences["train"] + preferences["val"]
    for row in rows:
        digits, kind = digits_of(row), row["extra_info"]["rejected_kind"]
        answer = str(max(digits))
        assert re.fullmatch(rf"{answer}([^\d ][^ ]{{0,2}})?", row["chosen"])  # the answer, junk after it or not
        # what the reward model stands in for: the task's verifier
        assert compute_score(row["data_source"], row["chosen"], answer) == 1.0
        assert compute_score(row["data_source"], row["rejected"], answer) == 0.0
        if kind == "prompt_digit":
            assert int(row["rejected"][0]) in digits and int(row["rejected"][0]) < max(digits)
            assert re.fullmatch(r"(\d)([^\d ][^ ]{0,2}|\1{1,3})?", row["rejected"])  # alone, junk after it, repeated
        elif kind == "junk":
            assert not re.search(r"\d", row["rejected"])
        elif kind == "longer_number":
            assert row["rejected"].startswith(answer) and re.fullmatch(r"\d{2,4}", row["rejected"])
    with_suffix = [r for r in rows if len(r["chosen"]) > 1]
    assert 0.4 < len(with_suffix) / len(rows) < 0.6  # half the chosen answers carry junk, as policies write them
    kinds = [r["extra_info"]["rejected_kind"] for r in preferences["train"]]
    assert set(kinds) == set(REJECTED_KINDS)
    assert kinds.count("prompt_digit") / len(kinds) > 0.25  # the hard negative is common


# ---------------------------------------------------------- the token layout
def test_preference_ids_are_the_rollout_layout_prompt_response_eos():
    tokenizer = load_tokenizer("builtin:tiny-qwen2")
    prompt = [{"role": "user", "content": "max(3,8,1,5)="}]
    ids = preference_ids(tokenizer, prompt, "8")
    assert tokenizer.decode(ids) == "<bos><|user|>max(3,8,1,5)=<|assistant|>8<eos>"
    # the prompt exactly as the RL driver tokenizes it, then the response, then EOS
    row = {"prompt": prompt, "data_source": "d", "reward_model": {"ground_truth": "8"}}
    rollout_prompt = PromptSet.from_rows([row], tokenizer, 64).token_ids[0]
    response = tokenizer("8", add_special_tokens=False)["input_ids"]
    assert ids == rollout_prompt + response + [tokenizer.eos_token_id]
    # an empty response is the prompt and EOS; a long text loses its start, never its end
    assert preference_ids(tokenizer, prompt, "") == rollout_prompt + [tokenizer.eos_token_id]
    assert preference_ids(tokenizer, prompt, "8", max_length=4) == ids[-4:]
    assert tokenizer.decode(ids[-4:]) == "=<|assistant|>8<eos>"


# ---------------------------------------------------------------- the model
def test_the_reward_model_is_the_backbone_with_a_fresh_seeded_one_output_head(tmp_path):
    from support import local_qwen2_checkpoint
    from transformers import AutoModelForCausalLM

    from hybridflow.workers.reward_model_trainer import build_score_model

    # a checkpoint on disk: its weights are not what a seeded init would draw, so a copy shows
    path = str(local_qwen2_checkpoint(tmp_path / "policy", seed=5))
    config = json.loads((tmp_path / "policy" / "config.json").read_text())
    config.pop("pad_token_id", None)  # as many checkpoints have it: the pad id comes from the tokenizer
    (tmp_path / "policy" / "config.json").write_text(json.dumps(config))
    policy = AutoModelForCausalLM.from_pretrained(path)
    model = build_score_model(path, torch.float32, 3)
    assert model.config.num_labels == 1 and model.config.pad_token_id == load_tokenizer(path).pad_token_id is not None
    backbone = policy.model.state_dict()
    assert sorted(model.model.state_dict()) == sorted(backbone)
    assert all(torch.equal(t, backbone[k]) for k, t in model.model.state_dict().items())
    assert model.score.weight.shape == (1, policy.config.hidden_size)
    again, other = build_score_model(path, torch.float32, 3), build_score_model(path, torch.float32, 4)
    assert torch.equal(again.score.weight, model.score.weight)
    assert not torch.equal(other.score.weight, model.score.weight)


# ----------------------------------------------------------- config problems
def test_config_problems_name_the_key_the_value_and_what_is_allowed():
    config = RMConfig()
    assert config.problems() == []
    config.data.batch_size, config.trainer.n_gpus_per_node, config.trainer.device = 5, 2, "tpu"
    config.optim.lr, config.model.fsdp_config.param_offload = -1.0, True
    problems = "\n".join(config.problems())
    assert "data.batch_size=5 must be divisible by trainer.n_gpus_per_node=2" in problems
    assert "trainer.device='tpu'; allowed: auto, cpu, cuda" in problems
    assert "optim.lr=-1.0 must be > 0" in problems
    assert "model.fsdp_config.param_offload=True" in problems
    assert override_problems(["trainer.total_step=3"]) == [
        "trainer.total_step: no such key; did you mean trainer.total_steps or trainer.total_epochs?"
    ]
    assert override_problems(["data.batch_size=abc", "trainer.total_steps=null", "hydra.run.dir=x"]) == [
        "data.batch_size='abc' must be an integer"
    ]


@pytest.mark.slow
def test_a_bad_config_exits_2_naming_every_key_without_a_traceback(tmp_path):
    runs = {
        "values": ["data.batch_size=0", "trainer.device=tpu", "model.path=builtin:nope"],
        "file": [f"data.train_files=[{tmp_path}/missing.parquet]"],
    }
    procs = {
        name: subprocess.Popen(
            [*TRAIN_RM, *args, f"hydra.run.dir={tmp_path}/{name}"],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in runs.items()
    }
    out = {name: proc.communicate(timeout=120) for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 2, out[name]
        assert "Traceback" not in out[name][1], out[name][1]
    values = out["values"][1]
    assert "data.batch_size=0 must be >= 1" in values and "trainer.device='tpu'; allowed: auto, cpu, cuda" in values
    assert "model.path='builtin:nope': unknown built-in model" in values
    assert f"data.train_files: {tmp_path}/missing.parquet: no such file" in out["file"][1]
    assert not (tmp_path / "values").exists()  # nothing ran: no run directory left behind


# ------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The command, STEPS steps on the synthetic preferences, on one rank and on two (both at once)."""
    root = tmp_path_factory.mktemp("train_rm")
    common = [
        f"trainer.total_steps={STEPS}",
        "trainer.eval_freq=3",
        "data.batch_size=16",
        "trainer.cpu_threads_per_rank=1",
        f"data.synthetic_dir={root}/data",
    ]
    # one micro-batch of 16 on one rank; 3 + 3 + 2 pairs on each of two: the same update all the same
    micro = {1: 16, 2: 3}
    procs = {}
    for ranks in (1, 2):
        args = [
            *common,
            f"trainer.n_gpus_per_node={ranks}",
            f"data.micro_batch_size_per_gpu={micro[ranks]}",
            f"hydra.run.dir={root}/dp{ranks}",
        ]
        procs[ranks] = subprocess.Popen(
            [*TRAIN_RM, *args], cwd=root, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    logs = {ranks: proc.communicate(timeout=240)[0] for ranks, proc in procs.items()}
    for ranks, proc in procs.items():
        assert proc.returncode == 0, logs[ranks][-3000:]
    return {ranks: (root / f"dp{ranks}", logs[ranks]) for ranks in procs}, root / "data" / "seed0"


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_run_logs_each_step_and_prints_its_summary(runs):
    (run_dir, log), _ = runs[0][1], runs[1]
    lines = metrics(run_dir)
    assert [line["step"] for line in lines] == list(range(STEPS + 1))
    assert all({"train/loss", "train/accuracy"} <= set(line) for line in lines[1:])
    assert {"val/loss", "val/accuracy"} <= set(lines[0]) and {"val/loss", "val/accuracy"} <= set(lines[3])
    assert "val/accuracy" not in lines[1] and {"val/loss", "val/accuracy"} <= set(lines[STEPS])
    assert lines[STEPS]["train/loss"] < lines[1]["train/loss"]  # it learns
    final = lines[STEPS]["val/accuracy"]
    assert f"val pairwise accuracy after   {final:.3f}" in log
    assert f"steps                         {STEPS}" in log and str(run_dir / "reward_model") in log


@pytest.mark.slow
def test_the_saved_reward_model_loads_and_rescored_by_hand_gives_the_reported_accuracy(runs):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    (run_dir, _), data_dir = runs[0][1], runs[1]
    model = AutoModelForSequenceClassification.from_pretrained(run_dir / "reward_model").eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "reward_model")
    assert model.config.num_labels == 1 and model.config.pad_token_id == tokenizer.pad_token_id is not None
    assert tokenizer.padding_side == "right" and tokenizer.chat_template
    rows = pq.read_table(data_dir / "val.parquet").to_pylist()

    def text(row, side):  # the layout written out by hand: chat template, response, EOS
        return (
            tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
            + row[side]
            + tokenizer.eos_token
        )

    with torch.no_grad():

        def scores(texts):  # a padded batch, as a user scores many texts
            enc = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
            return model(**enc).logits[:, 0]

        chosen = scores([text(r, "chosen") for r in rows])
        rejected = scores([text(r, "rejected") for r in rows])
        alone = [
            model(**tokenizer(text(r, "rejected"), add_special_tokens=False, return_tensors="pt")).logits[0, 0]
            for r in rows[:8]
        ]
    # padding (the saved tokenizer pads on the right) leaves every score as it is alone
    assert torch.stack(alone).tolist() == pytest.approx(rejected[:8].tolist(), abs=1e-5)
    by_hand = float((chosen > rejected).float().mean())
    reported = metrics(run_dir)[STEPS]["val/accuracy"]
    assert abs(by_hand - reported) <= 1 / len(rows), (by_hand, reported)


@pytest.mark.slow
def test_two_ranks_train_as_one(runs):
    one, two = metrics(runs[0][1][0]), metrics(runs[0][2][0])
    for key in ("train/loss", "train/accuracy", "train/grad_norm", "val/loss", "val/accuracy"):
        a = [line[key] for line in one if key in line]
        b = [line[key] for line in two if key in line]
        assert len(a) == len(b) > 0 and a == pytest.approx(b, rel=1e-4, abs=1e-5), key


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stopped_rank_is_named_within_the_heartbeats_bound_as_in_the_rl_trainer(ray_session, monkeypatch, tmp_path):
    """``hybridflow-train-rm`` waits on its ranks as ``hybridflow-train`` does (``trainer.timeouts``): a rank
    stopped (SIGSTOP) as its second training step begins is named, not waited for."""
    from omegaconf import OmegaConf
    from support import faulty

    from hybridflow import core
    from hybridflow.core import WorkerStalledError
    from hybridflow.tools.train_rm import build_and_fit

    heartbeat_s, stall_s = 0.5, 5.0
    cfg = OmegaConf.structured(RMConfig)
    for key, value in {
        "trainer.total_steps": 4,
        "data.batch_size": 16,
        "trainer.cpu_threads_per_rank": 1,
        "data.synthetic_dir": str(tmp_path / "data"),
        "trainer.timeouts.heartbeat_s": heartbeat_s,
        "trainer.timeouts.stall_s": stall_s,
    }.items():
        OmegaConf.update(cfg, key, value)
    record = tmp_path / "fault.json"
    real_spec = core.RoleSpec
    # the fault goes in where the group is described: the worker class itself stays importable by reference
    monkeypatch.setattr(
        core, "RoleSpec", lambda cls, **kw: real_spec(faulty(cls, "train_step", 0, 2, "stop", record), **kw)
    )
    try:
        with pytest.raises(WorkerStalledError) as info:
            build_and_fit(OmegaConf.to_object(cfg), tmp_path / "run")
        waited = time.time() - json.loads(record.read_text())["at"]
    finally:
        if record.exists():
            try:
                os.kill(json.loads(record.read_text())["pid"], 9)
            except ProcessLookupError:
                pass
    pid = json.loads(record.read_text())["pid"]
    assert re.match(rf"rm\.train_step: rank 0 \(node [\d.]+ \w+, pid {pid}\) stopped answering", str(info.value))
    assert waited < heartbeat_s + stall_s + 4.0, waited
