"""The split placement across the nodes of a Ray cluster (three nodes made on this machine by Ray's
``cluster_utils``): two training ranks on two nodes, the rollout on the third, the weights crossing over the
transfer group. Every mode ends with the weights of the same layout run on one node (2 training ranks and a rollout
rank of its own there too), bitwise: the synchronous loop, one step off, and async with staleness 1 and 2 under the
reproducible weight swap (``trainer.async_weight_swap=batch``; the default swap lets weights in whenever they
arrive, so which tokens each version samples depends on timing). The pipelined modes keep each sample within its
staleness bound.
"""

import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file
from support import read_metrics, read_trail, small_config

from hybridflow.trainer.main import build_and_fit

pytestmark = pytest.mark.slow

SPLIT = {
    "trainer.placement": "split",
    "trainer.rollout_ranks": 1,
    "trainer.save_hf_on_end": True,
    "trainer.logger": ["jsonl"],
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
}
MODES = {
    "sync": {},
    "one_step_off": {"trainer.rollout_mode": "one_step_off"},
    "async-1": {"trainer.rollout_mode": "async", "trainer.max_staleness": 1, "trainer.async_weight_swap": "batch"},
    "async-2": {"trainer.rollout_mode": "async", "trainer.max_staleness": 2, "trainer.async_weight_swap": "batch"},
}
ACROSS_NODES = """
import json, pathlib, sys
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table
sys.path.insert(0, {tests!r})
from support import small_config
from hybridflow.trainer.main import build_and_fit

cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 1}})
for _ in range(2):
    cluster.add_node(num_cpus=1)
cluster.wait_for_nodes()
ray.init(address=cluster.address)
tmp = pathlib.Path({tmp!r})
nodes = {{}}
for mode, overrides in json.loads({runs!r}).items():  # one run after the other on the same cluster
    seen = set(placement_group_table())
    build_and_fit(small_config(tmp / mode, **overrides), tmp / mode / "run")
    groups = [g for pg, g in placement_group_table().items() if pg not in seen]  # this run's, now removed
    nodes[mode] = {{pool: sorted(n for g in groups if g["name"].startswith(pool + "_")
        for n in g["bundles_to_node_id"].values()) for pool in ("hybridflow", "hybridflow-rollout")}}
print("NODES", json.dumps(nodes))
ray.shutdown()
cluster.shutdown()
"""


def across_nodes(tmp_path, runs: dict[str, dict]) -> dict[str, dict[str, list[str]]]:
    """Run each of ``runs`` (name: overrides) in turn on one three-node cluster, in a process of its own; the nodes
    of each run's ranks."""
    script = ACROSS_NODES.format(
        tests=str(__import__("pathlib").Path(__file__).parents[1]), tmp=str(tmp_path), runs=json.dumps(runs)
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return json.loads(out.stdout.split("NODES", 1)[1].splitlines()[0])


def test_split_across_three_nodes_trains_as_on_one_node_in_every_mode(ray_session, tmp_path):
    """One cluster for the four modes, one run after the other (a cluster's start is much of a short run's time)."""
    placed = across_nodes(tmp_path / "nodes", {mode: {**SPLIT, **MODES[mode], "trainer.nnodes": 2} for mode in MODES})
    for mode in MODES:
        one = tmp_path / "one" / mode
        build_and_fit(small_config(one, **SPLIT, **MODES[mode], **{"trainer.n_gpus_per_node": 2}), one / "run")
        check_mode(mode, placed[mode], tmp_path / "nodes" / mode / "run", one / "run")


def check_mode(mode: str, nodes: dict[str, list[str]], many, one) -> None:
    """The run across nodes (``many``) placed a training rank a node and the rollout on the third, and trained as
    the same layout on one node (``one``)."""
    assert len(set(nodes["hybridflow"])) == 2 and len(nodes["hybridflow-rollout"]) == 1, (mode, nodes)
    assert nodes["hybridflow-rollout"][0] not in nodes["hybridflow"], (mode, nodes)
    assert [m["step"] for m in read_metrics(many)] == [1, 2, 3], mode
    assert all(m["weight_sync/bytes"] > 0 for m in read_metrics(many)), mode
    trail = read_trail(many)
    assert trail == read_trail(one), mode  # the same prompts, each step, from the same weight versions
    ahead = {"sync": 0}.get(mode, MODES[mode].get("trainer.max_staleness", 1))
    assert all(
        r["step"] - 1 - ahead <= r["weight_version"][0] <= r["weight_version"][1] <= r["step"] - 1 for r in trail
    ), mode
    assert any(r["weight_version"][0] < r["step"] - 1 for r in trail) == (mode != "sync"), mode  # off-policy samples
    theirs, ours = load_file(one / "hf_model" / "model.safetensors"), load_file(many / "hf_model" / "model.safetensors")
    assert theirs.keys() == ours.keys(), mode
    assert all(theirs[name].equal(ours[name]) for name in theirs), f"{mode}: the final weights differ from one node's"


UNSEEN_DIRECTORY = """
import json, os, pathlib, signal, subprocess, sys, time
import ray
from ray.cluster_utils import Cluster
sys.path.insert(0, {tests!r})
from support import small_config
from hybridflow.trainer.config_checks import ConfigError
from hybridflow.trainer.main import build_and_fit

tmp = pathlib.Path({tmp!r})
root = tmp / "run" / "checkpoints"
root.mkdir(parents=True)
cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 1}})
ray_cli = str(pathlib.Path(sys.executable).parent / "ray")
# a node whose processes see an empty directory of their own at the run's checkpoint root (a mount namespace)
node = subprocess.Popen(["unshare", "-m", "sh", "-c", f"mount -t tmpfs tmpfs {{root}} && exec {{ray_cli}} start "
    f"--address={{cluster.address}} --num-cpus=1 --block"], start_new_session=True)
ray.init(address=cluster.address)
try:
    deadline = time.monotonic() + 60
    while sum(n["Alive"] for n in ray.nodes()) < 2:
        assert node.poll() is None and time.monotonic() < deadline, "the second node did not join"
        time.sleep(0.5)
    head = ray.get_runtime_context().get_node_id()
    unshared = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)
    start = time.monotonic()
    try:
        build_and_fit(small_config(tmp, **{{"trainer.nnodes": 2, "trainer.save_freq": 1}}), tmp / "run")
        print("RESULT", json.dumps({{"refused": None}}))
    except ConfigError as err:
        print("RESULT", json.dumps({{"refused": str(err), "seconds": time.monotonic() - start, "node": unshared}}))
finally:
    os.killpg(node.pid, signal.SIGTERM)
    node.wait(timeout=60)
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.skipif(subprocess.run(["unshare", "-m", "true"]).returncode != 0, reason="needs mount namespaces")
def test_a_checkpoint_directory_one_node_does_not_share_is_refused_before_the_first_step(tmp_path):
    script = UNSEEN_DIRECTORY.format(tests=str(__import__("pathlib").Path(__file__).parents[1]), tmp=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    result = json.loads(out.stdout.split("RESULT", 1)[1].splitlines()[0])
    assert result["refused"], "the run trained with a checkpoint directory one node does not share"
    lines = result["refused"].splitlines()
    assert "trainer.default_local_dir=" in lines[1] and "is not shared by every rank" in lines[1]
    assert len(lines) == 3 and f"({result['node'][:8]})" in lines[2] and "FileNotFoundError" in lines[2]
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or read_metrics(tmp_path / "run") == []


ROLLOUT_NODE_REMOVED = """
import json, pathlib, sys, threading, time
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table
sys.path.insert(0, {tests!r})
from support import small_config
from hybridflow.trainer.main import build_and_fit

tmp = pathlib.Path({tmp!r})
overrides = json.loads({overrides!r})
cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 0}})  # the driver's node: no ranks, kept
workers = [cluster.add_node(num_cpus=1) for _ in range(3)]
cluster.wait_for_nodes()
ray.init(address=cluster.address)
ended = {{}}

def first_run():
    try:
        build_and_fit(small_config(tmp, **overrides), tmp / "run")
    except BaseException as err:
        ended["error"] = f"{{type(err).__name__}}: {{err}}"
    ended["at"] = time.monotonic()

run = threading.Thread(target=first_run)
run.start()
while not (tmp / "run" / "checkpoints" / "global_step_2").is_dir():
    assert run.is_alive(), ended
    time.sleep(0.05)
rollout = next(n for g in placement_group_table().values() if g["name"].startswith("hybridflow-rollout_")
               and g["state"] == "CREATED" for n in g["bundles_to_node_id"].values())
cluster.remove_node(next(w for w in workers if w.node_id == rollout))
removed = time.monotonic()
run.join(timeout=300)
cluster.add_node(num_cpus=1)  # a replacement, as a cluster's autoscaler or its operator would add
cluster.wait_for_nodes()
summary = build_and_fit(small_config(tmp, **overrides), tmp / "run")
print("RESULT", json.dumps({{"error": ended.get("error"), "seconds": ended["at"] - removed, "node": rollout,
    "resumed_at": summary.resumed_at, "steps": summary.steps}}))
ray.shutdown()
cluster.shutdown()
"""


def test_a_rollout_node_removed_mid_run_is_named_and_the_run_resumes_from_its_checkpoint(tmp_path):
    overrides = {**SPLIT, "trainer.nnodes": 2, "trainer.save_freq": 1, "trainer.total_training_steps": 6}
    script = ROLLOUT_NODE_REMOVED.format(
        tests=str(__import__("pathlib").Path(__file__).parents[1]), tmp=str(tmp_path), overrides=json.dumps(overrides)
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    result = json.loads(out.stdout.split("RESULT", 1)[1].splitlines()[0])
    assert result["error"] and result["node"][:8] in result["error"], result  # the removed node, named
    assert result["seconds"] < 60
    assert 2 <= result["resumed_at"] < 6 and result["steps"] == 6
    assert [m["step"] for m in read_metrics(tmp_path / "run")] == [1, 2, 3, 4, 5, 6]  # each step once
