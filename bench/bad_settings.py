"""Every bad setting we know of, through the real command line: how fast and how clearly it fails.

    python bench/bad_settings.py [--json out.json] [--code DIR] [--timeout 90]
    PYTHONPATH=<shim> python bench/bad_settings.py --check-only --json before.json
    python bench/bad_settings.py --table before.json after.json   # the markdown table of docs/reliability.md

Each case runs ``python -m hybridflow.trainer.main <overrides>`` in a fresh
directory (the default job, cut to 3 steps without validation so that a case
which is *not* caught ends soon) and records the exit status, the seconds to
exit, whether Ray started, whether a traceback was printed, and the message
(its lines from the first ``hybridflow-train:`` or Hydra error on). ``--code
DIR`` runs another checkout of the package (e.g. a worktree of an older
commit) instead of the installed one, which is how the table's "before"
column was first tried. That runs an old checkout's workers against the
installed package's entry points, so its Ray runs did not finish in time; the
"before" column of the table therefore comes from ``--check-only``: each case
composed and passed to the checkout's own ``check_config`` in process, with a
``<shim>/hybridflow`` symlink to the old checkout first on ``PYTHONPATH``.
A case that check did not refuse went on to start Ray (the issue describes
what happened then for the first nine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

BASE = ["trainer.total_training_steps=3", "trainer.test_freq=0"]

SERVER = ["experiment=tool_use", "actor_rollout_ref.rollout.mode=server"]

# (label, overrides): the settings of issue 27; tests/trainer/test_bad_settings.py also runs each through the
# real command
ISSUE_27_CASES: list[tuple[str, list[str]]] = [
    ("typo in a policy loss option", ["+actor_rollout_ref.actor.policy_loss_options.clip_ratio_hgh=0.28"]),
    ("text for a policy loss option", ["+actor_rollout_ref.actor.policy_loss_options.clip_ratio_high=high"]),
    ("true for an estimator option", ["+algorithm.estimator_options.epsilon=true"]),
    ("text for an agent loop option", ["experiment=tool_use", "actor_rollout_ref.rollout.agent.options.max_turns=two"]),
    (
        "a number for a batch hook option",
        ["algorithm.batch_hooks=[dynamic_sampling]", "+algorithm.batch_hook_options.dynamic_sampling.metric=1"],
    ),
    ("missing train file", ["data.train_files=[{tmp}/missing.parquet]"]),
    ("zero-byte train file", ["data.train_files=[{tmp}/zero.parquet]"]),
    ("train file of no rows", ["data.train_files=[{tmp}/no_rows.parquet]"]),
    ("train file without a prompt column", ["data.train_files=[{tmp}/no_prompt.parquet]"]),
    ("text file named .parquet", ["data.train_files=[{tmp}/text.parquet]"]),
    ("validation file without a prompt column", ["data.val_files=[{tmp}/no_prompt.parquet]"]),
    (
        "more rollout ranks than the machine holds",  # 1026 quarter-CPU ranks: more than a machine of < 257 cores holds
        ["trainer.placement=split", "trainer.rollout_ranks=1024", "data.train_batch_size=1024"],
    ),
    ("server on a busy port", [*SERVER, "actor_rollout_ref.rollout.server.port={busy_port}"]),
    ("server on an address not of this machine", [*SERVER, "actor_rollout_ref.rollout.server.host=192.0.2.1"]),
]


def bad_data_files(directory: Path) -> None:
    """The bad data files the cases name, written into ``directory``: ``zero.parquet`` (0 bytes),
    ``no_rows.parquet``, ``no_prompt.parquet`` (no ``prompt`` column), ``text.parquet`` (a text file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {"data_source": "synthetic/arithmetic", "prompt": "1+1=", "reward_model": {"ground_truth": "2"}}
    (directory / "zero.parquet").write_bytes(b"")
    pq.write_table(pa.Table.from_pylist([row]).slice(0, 0), directory / "no_rows.parquet")
    no_prompt = {k: v for k, v in row.items() if k != "prompt"}
    pq.write_table(pa.Table.from_pylist([no_prompt]), directory / "no_prompt.parquet")
    (directory / "text.parquet").write_text("data_source,prompt\nsynthetic/arithmetic,1+1=\n")


@contextlib.contextmanager
def busy_port() -> Iterator[int]:
    """A local port with a socket listening on it, until the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def filled(overrides: list[str], tmp: str | Path, port: int) -> list[str]:
    """``overrides`` with the placeholders of :data:`CASES` filled in (``{tmp}``, ``{notckpt}``, ``{busy_port}``)."""
    marks = {"{tmp}": str(tmp), "{notckpt}": f"{tmp}/not_a_checkpoint", "{busy_port}": str(port)}
    out = []
    for override in overrides:
        for mark, value in marks.items():
            override = override.replace(mark, value)
        out.append(override)
    return out


# (label, overrides); {tmp} is a fresh directory per case holding the bad data files of bad_data_files(),
# {notckpt} a directory that is not a checkpoint, {busy_port} a port that a socket listens on during the case
CASES: list[tuple[str, list[str]]] = [
    # the issue's list of settings that failed late, unclearly or not at all
    ("negative learning rate", ["actor_rollout_ref.actor.optim.lr=-0.001"]),
    ("zero train batch", ["data.train_batch_size=0"]),
    ("zero critic micro-batch", ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=0"]),
    ("negative total steps", ["trainer.total_training_steps=-5"]),
    ("resume path is a directory, no checkpoint", ["trainer.resume_mode={notckpt}"]),
    ("unknown verifier in a route", ["+reward.route={synthetic/arithmetic: nosuch}"]),
    ("zero reward timeout", ["reward.timeout_s=0"]),
    ("trainer=gpu without GPUs", ["trainer=gpu"]),
    ("train batch larger than the dataset", ["data.train_batch_size=16384"]),
    # settings the checks caught before (kept caught)
    ("unknown estimator", ["algorithm.adv_estimator=grpoo"]),
    ("one sample for a group estimator", ["actor_rollout_ref.rollout.n=1"]),
    ("gae with the critic disabled", ["algorithm.adv_estimator=gae", "critic.enable=false"]),
    ("missing model directory", ["actor_rollout_ref.model.path=/no/such/model"]),
    ("train batch not whole mini-batches", ["data.train_batch_size=12"]),
    ("3 ranks split 16 prompts", ["trainer.n_gpus_per_node=3"]),
    ("rollout tp larger than the ranks", ["actor_rollout_ref.rollout.tensor_model_parallel_size=4"]),
    ("actor tp that does not tile the ranks", ["actor_rollout_ref.actor.tensor_model_parallel_size=3"]),
    ("unknown loss aggregation", ["actor_rollout_ref.actor.loss_agg_mode=mean"]),
    ("unknown KL estimator", ["actor_rollout_ref.actor.kl_loss_type=k9"]),
    ("unknown rollout engine", ["actor_rollout_ref.rollout.name=sglang"]),
    ("vLLM on the CPU", ["actor_rollout_ref.rollout.name=vllm"]),
    ("estimator option it does not take", ["+algorithm.estimator_options={gamma: 0.9}"]),
    ("unknown resume mode", ["trainer.resume_mode=sometimes"]),
    ("top_p 0", ["actor_rollout_ref.rollout.top_p=0"]),
    ("unknown KL controller", ["algorithm.kl_ctrl.type=pid"]),
    ("unknown logger", ["trainer.logger=[console,mlflow]"]),
    ("temperature 0", ["actor_rollout_ref.rollout.temperature=0"]),
    ("zero samples", ["actor_rollout_ref.rollout.n=0"]),
    ("zero response length", ["actor_rollout_ref.rollout.response_length=0"]),
    ("zero PPO epochs", ["actor_rollout_ref.actor.ppo_epochs=0"]),
    # more of our own
    (
        "critic rows do not split over 4 ranks (actor tp 2)",
        [
            "trainer.n_gpus_per_node=4",
            "actor_rollout_ref.actor.tensor_model_parallel_size=2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "algorithm.adv_estimator=gae",
            "data.train_batch_size=6",
            "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            "actor_rollout_ref.rollout.n=2",
        ],
    ),
    ("zero critic learning rate", ["algorithm.adv_estimator=gae", "critic.optim.lr=0"]),
    ("zero gradient clip", ["actor_rollout_ref.actor.optim.grad_clip=0"]),
    ("a beta of 1.5", ["actor_rollout_ref.actor.optim.betas=[0.9,1.5]"]),
    ("negative warm-up", ["actor_rollout_ref.actor.optim.warmup_steps=-1"]),
    ("negative top_k", ["actor_rollout_ref.rollout.top_k=-2"]),  # -1 is veRL's "off": translated to 0
    ("zero reshard bucket", ["actor_rollout_ref.rollout.reshard_bucket_mb=0"]),
    ("vLLM memory fraction 1.5", ["actor_rollout_ref.rollout.gpu_memory_utilization=1.5"]),
    ("zero adaptive KL target", ["algorithm.kl_ctrl.target_kl=0"]),
    ("zero reward workers", ["reward.num_workers=0"]),
    ("16 MB reward workers", ["reward.worker_memory_mb=16"]),
    ("zero validation batch", ["data.val_batch_size=0"]),
    ("zero prompt length", ["data.max_prompt_length=0"]),
    ("zero epochs", ["trainer.total_epochs=0"]),
    ("zero nodes", ["trainer.nnodes=0"]),
    ("negative test_freq", ["trainer.test_freq=-2"]),  # -1 is veRL's "off": translated to 0
    ("negative save_freq", ["trainer.save_freq=-2"]),  # -1 is veRL's "off": translated to 0
    ("unknown device", ["trainer.device=tpu"]),
    ("overlong zone as long as the response", ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=4"]),
    ("options for an unknown verifier", ["+reward.verifier_kwargs={nosuch: {a: 1}}"]),
    ("unknown policy loss", ["actor_rollout_ref.actor.policy_loss=ppo"]),
    ("unknown in-reward KL estimator", ["algorithm.kl_penalty=k7"]),
    ("misspelt key", ["trainer.total_trainig_steps=3"]),
    ("text where a number goes", ["data.train_batch_size=sixteen"]),
    # issue 27: found late (in a worker, by Ray or by Hydra), now refused before Ray
    *ISSUE_27_CASES,
]


def run_case(overrides: list[str], code: str | None, timeout_s: float) -> dict:
    """Run one case in a fresh directory; what happened."""
    with tempfile.TemporaryDirectory() as tmp, busy_port() as port:
        (Path(tmp) / "not_a_checkpoint").mkdir()
        bad_data_files(Path(tmp))
        args = filled(overrides, tmp, port)
        env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": ""}
        if code:  # an older checkout: import hybridflow from it
            shim = Path(tmp) / "shim"
            shim.mkdir()
            (shim / "hybridflow").symlink_to(Path(code).resolve())
            env["PYTHONPATH"] = str(shim)
        cmd = [sys.executable, "-m", "hybridflow.trainer.main", *BASE, f"data.synthetic_dir={tmp}/data", *args]
        start = time.perf_counter()
        try:
            out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s)
            code_, text = out.returncode, out.stdout + out.stderr
        except subprocess.TimeoutExpired as err:
            code_, text = (
                None,
                (err.stdout or b"").decode(errors="replace") + (err.stderr or b"").decode(errors="replace"),
            )
        seconds = time.perf_counter() - start
    return {
        "exit": code_,
        "seconds": round(seconds, 1),
        "ray_started": "started a local ray instance" in text.lower() or "connected to ray cluster" in text.lower(),
        "traceback": "Traceback (most recent call last)" in text,
        "message": _message(text),
    }


def _message(text: str) -> list[str]:
    """The error's own lines: from the first line that names the problem, at most 8."""
    lines = [line for line in text.splitlines() if line.strip()]
    markers = ("hybridflow-train:", "Error", "error", "Could not", "Key '", "invalid config")
    start = next((i for i, line in enumerate(lines) if any(m in line for m in markers)), max(len(lines) - 3, 0))
    return lines[start : start + 8]


def check_only() -> dict:
    """Each case composed and given to ``check_config`` of whichever hybridflow is imported, in process, no Ray."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from hybridflow.configs import CONFIG_DIR
    from hybridflow.configs.schema import register_configs
    from hybridflow.trainer.config_checks import check_config

    register_configs()
    results = {}
    for label, overrides in CASES:
        with tempfile.TemporaryDirectory() as tmp, busy_port() as port:
            (Path(tmp) / "not_a_checkpoint").mkdir()
            bad_data_files(Path(tmp))
            args = filled(BASE + overrides, tmp, port)
            try:
                with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
                    config = OmegaConf.to_object(compose("ppo_trainer", overrides=args))
                check_config(config)
                results[label] = {"stage": "passed the check", "message": ""}
            except Exception as err:  # noqa: BLE001 - recording what each stage said is the point
                text = str(err).strip().splitlines()
                stage = "Hydra" if "override" in text[0].lower() else "check"
                results[label] = {"stage": stage, "message": (text[-1] if stage == "check" else text[0]).strip()}
    return results


def table(before: dict, after: dict) -> str:
    """The markdown table of docs/reliability.md from two result files."""
    rows = ["| # | setting | before | after (time to the error, lines) |", "|---:|---|---|---|"]
    for i, (label, overrides) in enumerate(CASES, 1):
        b, a = before.get(label), after[label]
        rows.append(
            f"| {i} | {label}: `{' '.join(overrides)}` | {_describe(b) if b else 'n/a'} | {_describe(a, after=True)} |"
        )
    return "\n".join(rows)


def _describe(r: dict, after: bool = False) -> str:
    if "stage" in r:  # a --check-only result
        if r["stage"] == "passed the check":
            return "not refused: passed the check, went on to start Ray"
        return f"refused by {r['stage']} (then exit 1 with a traceback): {_cell(r['message'])}"
    if r["exit"] is None:
        return f"no error; still running after {r['seconds']:.0f} s"
    if r["exit"] == 0:
        return f"no error: exit 0 after {r['seconds']:.0f} s"
    first = _cell(
        next((line for line in r["message"] if line.strip() and not line.startswith("hybridflow-train: invalid")), "")
    )
    where = "after Ray started, " if r["ray_started"] else ""
    tb = ", traceback" if r["traceback"] else ""
    lines = f", {len(r['message'])} lines" if after else ""
    return f"exit {r['exit']} {where}in {r['seconds']:.1f} s{tb}{lines}: {first}"


def _cell(text: str) -> str:
    return text.strip().lstrip("- ").replace("|", "\\|")[:160]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--code", help="a checkout of hybridflow to run instead of the installed one")
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--only", help="run only cases whose label contains this")
    parser.add_argument("--table", nargs=2, metavar=("BEFORE", "AFTER"), help="print the markdown table and exit")
    parser.add_argument("--check-only", action="store_true", help="run each case's config check in process (no Ray)")
    args = parser.parse_args()
    if args.check_only:
        results = check_only()
        for label, r in results.items():
            print(f"{label}: {_describe(r)}")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return
    if args.table:
        before, after = (json.loads(Path(p).read_text()) for p in args.table)
        print(table(before, after))
        return
    results = {}
    for label, overrides in CASES:
        if args.only and args.only not in label:
            continue
        results[label] = run_case(overrides, args.code, args.timeout)
        print(f"{label}: {_describe(results[label], after=True)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
