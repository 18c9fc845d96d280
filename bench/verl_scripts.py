"""veRL's own launch scripts, run through hybridflow-train as a veRL user would run them (issue 55).

    python bench/verl_scripts.py count --verl DIR [--every] [--json out.json]
    python bench/verl_scripts.py run --verl DIR [--json out.json] [--only NAME]

``DIR`` is a veRL repository: a checkout, or a bare git directory (``fetch`` writes one; its files are read
with ``git show HEAD:<path>``). Nothing of veRL is copied here: the scripts are read from ``DIR``.

``count``: every ``key=value`` a script passes to ``verl.trainer.main_ppo``, as written, sorted by what
``hybridflow-train`` does with it before anything starts: taken **as written** (a key of ours), **translated**
(rewritten to our keys, one line), **no effect** (accepted with one line saying why) or **refused** (exit 2,
with what to write instead). Run it with ``PYTHONPATH=<shim>`` (a ``<shim>/hybridflow`` symlink to an older
checkout, as ``bench/ab_commit.sh`` makes) for the count before a change. ``--every``: the totals over every
example script a machine like this could run (:func:`every_script`), not only the six.

``run``: each script itself, by bash, with ``python3 -m verl.trainer.main_ppo`` answered by ``hybridflow-train``
(a ``python3`` first on ``PATH`` that hands that module's arguments over and runs anything else as it is) and
``HOME`` a scratch directory holding what the scripts read there: ``data/gsm8k`` and ``data/math`` parquet files
in veRL's schema (a few arithmetic questions, written by our own preprocessing). The only edits are what a
user on this machine must change, appended as the script's own ``$@`` (Hydra takes the later value): the model
(a tiny Qwen2 saved as an HF directory), the hardware (2 ranks) and the sizes (:data:`EDITS`; each applies only
to a key the script sets). A script passes when it exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = {  # veRL's path -> what it is
    "examples/grpo_trainer/run_qwen3-8b.sh": "GRPO, Qwen3, vLLM tp 2",
    "examples/grpo_trainer/run_deepseek7b_llm_seq_balance.sh": "GRPO, DeepSeek, token budgets",
    "examples/ppo_trainer/run_gemma.sh": "PPO with a critic, Gemma",
    "examples/rloo_trainer/run_qwen2-7b.sh": "RLOO, KL in the reward",
    "examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh": "REINFORCE++, GSM8K and MATH",
    "examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh": "ReMax, token budgets",
}
MODEL = "{model}"
EDITS = {  # key -> the value this machine needs (model, hardware, sizes); applied where the script sets the key
    "actor_rollout_ref.model.path": MODEL,
    "critic.model.path": MODEL,
    "trainer.n_gpus_per_node": "2",
    "data.train_batch_size": "4",
    "data.max_prompt_length": "256",
    "data.max_response_length": "8",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "2",
    "critic.ppo_micro_batch_size_per_gpu": "1",
    "trainer.total_epochs": "1",
}
ADDED = ["trainer.total_training_steps=2"]  # the run's length: two steps, then the end-of-run validation
ENTRY = "verl.trainer.main_ppo"
KINDS = ("as written", "translated", "no effect", "refused")


# ------------------------------------------------------------------ reading veRL's scripts
def read_script(verl: Path, path: str) -> str:
    """The text of ``path`` in the veRL repository ``verl`` (a checkout, or a bare git directory)."""
    if (verl / path).is_file():
        return (verl / path).read_text()
    return subprocess.run(
        ["git", "--git-dir", str(verl), "show", f"HEAD:{path}"], capture_output=True, text=True, check=True
    ).stdout


def script_args(text: str, home: str = "/home/user") -> list[str]:
    """The ``key=value`` arguments the script passes to ``verl.trainer.main_ppo``, with its shell variables
    expanded (``$HOME``, and the ``name=value`` lines above the command), as bash would hand them over."""
    variables = {"HOME": home}
    joined = re.sub(r"\\\n", " ", text)
    command = None
    for line in joined.splitlines():
        line = line.strip()
        match = re.fullmatch(r"([A-Za-z_][A-Za-z_0-9]*)=(.*)", line)
        if match and command is None:
            variables[match[1]] = _expand(shlex.split(match[2])[0] if match[2] else "", variables)
        elif ENTRY in line:
            command = line
    if command is None:
        raise ValueError(f"no '{ENTRY}' command in the script")
    words = shlex.split(_expand_quoted(command, variables))
    return [w for w in words[words.index(ENTRY) + 1 :] if w != "$@" and "=" in w]


def _expand(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z_0-9]*)\}?", lambda m: variables.get(m[1], m[0]), text)


def _expand_quoted(command: str, variables: dict[str, str]) -> str:
    """``$name`` expanded where bash would (outside single quotes), the rest of the text kept."""
    parts = re.split(r"('[^']*')", command)
    return "".join(p if p.startswith("'") else _expand(p, variables) for p in parts)


def edits_for(args: list[str], model: str) -> list[str]:
    """:data:`EDITS` for the keys ``args`` set, then :data:`ADDED`."""
    keys = {a.partition("=")[0].lstrip("+") for a in args}
    return [f"{k}={v.replace(MODEL, model)}" for k, v in EDITS.items() if k in keys] + ADDED


# ------------------------------------------------------------------ count
def kind_of(arg: str, others: list[str]) -> str:
    """What hybridflow-train does with ``arg`` before anything starts (one of :data:`KINDS`), on a command line
    with ``others`` before it (a key may depend on another: the critic's path repeating the policy's)."""
    from hybridflow.configs.overrides import override_problems, translate

    alone, together = translate(others), translate([*others, arg])
    args = together.args[len(alone.args) :]
    lines = [line for line in together.lines if line not in alone.lines and "disagree" not in line]
    if override_problems(args):
        return "refused"
    if not lines:
        return "as written"
    return "no effect" if not args else "translated"


def every_script(verl: Path) -> list[str]:
    """veRL's example launch scripts of the PPO trainer that a machine like this could run: not Megatron's, not
    Ascend NPU's, not SFT's or offline generation's."""
    listed = subprocess.run(
        ["git", "--git-dir", str(verl), "ls-tree", "-r", "--name-only", "HEAD", "examples"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    skip = ("megatron", "npu", "/sft/", "/generation/")
    return [p for p in listed if p.endswith(".sh") and not any(s in p for s in skip)]


def count(verl: Path, paths: list[str]) -> dict[str, dict[str, list[str]]]:
    """Per script of ``paths``, the arguments of each kind (a script without the command is left out)."""
    found = {}
    for path in paths:
        kinds: dict[str, list[str]] = {k: [] for k in KINDS}
        try:
            args = script_args(read_script(verl, path))
        except ValueError:
            continue
        for i, arg in enumerate(args):
            kinds[kind_of(arg, args[:i])].append(arg)
        found[path] = kinds
    return found


def count_table(found: dict[str, dict[str, list[str]]]) -> str:
    rows = ["| script | keys | " + " | ".join(KINDS) + " |", "|---|---|" + "---|" * len(KINDS)]
    totals = dict.fromkeys(KINDS, 0)
    for path, kinds in found.items():
        for k in KINDS:
            totals[k] += len(kinds[k])
        cells = " | ".join(str(len(kinds[k])) for k in KINDS)
        rows.append(f"| `{path}` | {sum(len(v) for v in kinds.values())} | {cells} |")
    rows.append(f"| all {len(found)} | {sum(totals.values())} | " + " | ".join(str(totals[k]) for k in KINDS) + " |")
    return "\n".join(rows)


# ------------------------------------------------------------------ run
PYTHON3 = """#!/usr/bin/env bash
# veRL's entry point answered by hybridflow-train; every other python3 call runs as it is
if [ "$1" = "-m" ] && [ "$2" = "{entry}" ]; then shift 2; exec {train} "$@"; fi
exec {python} "$@"
"""


def prepare_home(home: Path) -> None:
    """``home/data/{gsm8k,math}/{train,test}.parquet`` in veRL's schema (data/preprocess.py's rows)."""
    from hybridflow.data.preprocess import gsm8k_row, math_row, write_rows

    for split, size in (("train", 16), ("test", 8)):
        gsm8k, math = [], []
        for i in range(size):
            a, b = 2 + i % 7, 3 + i % 5
            question = {
                "question": f"Tom has {a} apples and buys {b} more. How many apples?",
                "answer": f"#### {a + b}",
            }
            gsm8k.append(gsm8k_row(question, split=split, index=i))
            math.append(math_row({"problem": f"Compute ${a} + {b}$.", "answer": str(a + b)}, split=split, index=i))
        write_rows(gsm8k, str(home / "data" / "gsm8k"), split)
        write_rows(math, str(home / "data" / "math"), split)


def save_model(directory: Path) -> Path:
    """``builtin:tiny-qwen2-h32`` (heads vLLM's CPU attention runs) as an HF directory, random weights of seed 0."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.workers.models import load_model_config, load_tokenizer

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(load_model_config("builtin:tiny-qwen2-h32")).save_pretrained(directory)
    load_tokenizer("builtin:tiny-qwen2-h32").save_pretrained(directory)
    return directory


def run_script(verl: Path, path: str, scratch: Path, timeout: int) -> dict:
    """Run one script by bash as the module docstring says; its exit status, seconds and lines of note."""
    home, bin_dir = scratch / "home", scratch / "bin"
    work = scratch / Path(path).stem
    work.mkdir(parents=True)
    text = read_script(verl, path)
    (work / "run.sh").write_text(text)
    edits = edits_for(script_args(text, str(home)), str(scratch / "model"))
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}", "WANDB_MODE": "offline"}
    start = time.monotonic()
    try:
        done = subprocess.run(
            ["bash", "run.sh", *edits], cwd=work, env=env, capture_output=True, text=True, timeout=timeout
        )
        status, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        status, out = "timeout", (err.stdout or b"").decode() + (err.stderr or b"").decode()
    said = [line for line in out.splitlines() if line.startswith("hybridflow-train: ")]
    return {
        "script": path,
        "edits": edits,
        "status": status,
        "seconds": round(time.monotonic() - start, 1),
        "lines": said,
        "tail": out[-3000:] if status != 0 else "",
    }


def run_all(verl: Path, only: str | None, timeout: int) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        prepare_home(scratch / "home")
        save_model(scratch / "model")
        (scratch / "bin").mkdir()
        train = Path(sys.executable).with_name("hybridflow-train")
        shim = scratch / "bin" / "python3"
        shim.write_text(PYTHON3.format(entry=ENTRY, train=train, python=sys.executable))
        shim.chmod(0o755)
        for path in SCRIPTS:
            if only and only not in path:
                continue
            result = run_script(verl, path, scratch, timeout)
            print(json.dumps({k: v for k, v in result.items() if k != "tail"}), flush=True)
            if result["tail"]:
                print(result["tail"], file=sys.stderr, flush=True)
            results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("count", "run"))
    parser.add_argument("--verl", type=Path, required=True, help="veRL's repository (checkout or bare git dir)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--only", help="run the scripts whose path contains this")
    parser.add_argument("--every", action="store_true", help="count: every example script, not the six")
    parser.add_argument("--timeout", type=int, default=900)
    options = parser.parse_args()
    if options.what == "count":
        found = count(options.verl, every_script(options.verl) if options.every else list(SCRIPTS))
        print(count_table(found) if not options.every else count_table(found).splitlines()[-1])
        refused = [a for kinds in found.values() for a in kinds["refused"]]
        print("\nrefused:\n  " + "\n  ".join(refused) if refused else "\nnothing refused")
        result: object = found
    else:
        result = run_all(options.verl, options.only, options.timeout)
        passed = sum(r["status"] == 0 for r in result)
        print(f"{passed} of {len(result)} scripts exited 0")
    if options.json:
        options.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
