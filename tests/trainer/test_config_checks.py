import os
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.plugins.options import option_problems
from hybridflow.trainer.config_checks import ConfigError, check_config, config_problems, dataset_rows


def cfg(**overrides):
    conf = OmegaConf.structured(PPOConfig)
    for key, value in overrides.items():
        OmegaConf.update(conf, key, value)
    return conf


def test_defaults_are_valid():
    check_config(cfg())


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"algorithm.adv_estimator": "grpoo"}, "algorithm.adv_estimator: unknown estimator 'grpoo'"),
        ({"actor_rollout_ref.rollout.n": 1}, "rollout.n=1: estimator 'grpo' compares the responses"),
        (
            {"algorithm.adv_estimator": "gae", "critic.enable": False},
            "critic.enable=False but estimator 'gae' needs a critic",
        ),
        ({"actor_rollout_ref.model.path": "/no/such/model"}, "model.path='/no/such/model' is not a directory"),
        ({"data.train_batch_size": 12}, "data.train_batch_size=12 must be a multiple of 8"),
        ({"trainer.n_gpus_per_node": 3}, "ppo_mini_batch_size x rollout.n=64 must be a multiple of 3"),
        ({"trainer.n_gpus_per_node": 3}, "data.train_batch_size=16 must be a multiple of 3"),
        ({"actor_rollout_ref.rollout.tensor_model_parallel_size": 4}, "n_gpus_per_node=2 must be a multiple of 4"),
        ({"actor_rollout_ref.actor.tensor_model_parallel_size": 3}, "n_gpus_per_node=2 must be a multiple of 3 (actor"),
        # 4 ranks, rollout tp 4: one rollout dp rank, so any batch divides; the built-in tiny model has 4 heads
        (
            {"trainer.n_gpus_per_node": 8, "actor_rollout_ref.rollout.tensor_model_parallel_size": 8},
            "rollout.tensor_model_parallel_size=8: rollout tensor parallelism cannot split this model: "
            "num_attention_heads=4 is not divisible by 8",
        ),
        (
            {
                "trainer.n_gpus_per_node": 8,
                "actor_rollout_ref.actor.tensor_model_parallel_size": 2,
                "data.train_batch_size": 16,
                "actor_rollout_ref.actor.ppo_mini_batch_size": 1,
                "actor_rollout_ref.rollout.n": 2,
            },
            "ppo_mini_batch_size x rollout.n=2 must be a multiple of 4 (each mini-batch's rows are split evenly over "
            "the 4 training data-parallel ranks: trainer.nnodes x trainer.n_gpus_per_node=8 / actor tp 2)",
        ),
        ({"actor_rollout_ref.actor.loss_agg_mode": "mean"}, "loss_agg_mode='mean'; allowed: token-mean"),
        ({"actor_rollout_ref.actor.kl_loss_type": "k9"}, "kl_loss_type='k9'; allowed: k1"),
        (
            {"actor_rollout_ref.rollout.name": "sglang"},
            "rollout.name: unknown rollout engine 'sglang'. Known rollout engines: builtin [hybridflow], vllm",
        ),
        ({"actor_rollout_ref.rollout.name": "vllm"}, "heads are 16 wide; vLLM's CPU attention supports 32"),
        ({"algorithm.estimator_options": {"gamma": 0.9}}, "estimator_options has ['gamma']; estimator 'grpo' takes"),
        ({"trainer.resume_mode": "sometimes"}, "trainer.resume_mode='sometimes'; allowed: auto, disable"),
        (
            {"trainer.default_local_dir": "nfs2://host/run"},
            "trainer.default_local_dir='nfs2://host/run': no filesystem for it here (Protocol not known: nfs2)",
        ),
        (
            {"trainer.default_local_dir": "s3://bucket/run", "trainer.cpu_mmap_threshold_mb": 64},
            "trainer.cpu_mmap_threshold_mb=64.0 must be in (0, 32]",
        ),
        ({"actor_rollout_ref.rollout.top_p": 0.0}, "top_p=0.0 must be in (0, 1]"),
        ({"algorithm.kl_ctrl.type": "pid"}, "algorithm.kl_ctrl.type='pid'; allowed: fixed, adaptive"),
        ({"trainer.logger": ["console", "mlflow"]}, "trainer.logger has ['mlflow']; allowed: console, jsonl, wandb"),
        (
            {"trainer.rollout_mode": "async"},
            "trainer.rollout_mode='async' overlaps generation with training and needs "
            "the rollout on ranks of its own: set trainer.placement=split",
        ),
        ({"trainer.rollout_mode": "later"}, "trainer.rollout_mode='later'; allowed: sync, one_step_off, async"),
        ({"trainer.async_weight_swap": "drained"}, "trainer.async_weight_swap='drained'; allowed: step, batch"),
        (
            {
                "actor_rollout_ref.rollout.name": "vllm",
                "trainer.placement": "split",
                "trainer.rollout_mode": "async",
                "trainer.async_weight_swap": "batch",
            },
            "rollout.name='vllm' with trainer.async_weight_swap='batch': vLLM's stream steps every generation call",
        ),
        (
            {"trainer.placement": "split", "trainer.rollout_ranks": 3},
            "data.train_batch_size=16 must be a multiple of 3 (each step's prompts are split evenly over the 3 rollout "
            "data-parallel ranks: trainer.rollout_ranks=3 / rollout tp 1)",
        ),
        (
            {"trainer.placement": "split", "actor_rollout_ref.rollout.tensor_model_parallel_size": 2},
            "trainer.rollout_ranks=1 must be a multiple of 2 (rollout tensor-parallel groups",
        ),
        (
            {
                "trainer.placement": "split",
                "trainer.rollout_mode": "one_step_off",
                "actor_rollout_ref.rollout.agent_loop": "tool_calling",
            },
            "the agent loop 'tool_calling' runs with trainer.rollout_mode=sync",
        ),
        # options: names and types against the plugin's defaults
        (
            {"actor_rollout_ref.actor.policy_loss_options": {"clip_ratio_hgh": 0.28}},
            "actor_rollout_ref.actor.policy_loss_options has ['clip_ratio_hgh']; policy loss 'vanilla' takes "
            "{'clip_ratio_low': 0.2, 'clip_ratio_high': 0.2, 'clip_ratio_c': 3.0}",
        ),
        (
            {"actor_rollout_ref.actor.policy_loss_options": {"clip_ratio_high": "0.28"}},
            "actor_rollout_ref.actor.policy_loss_options.clip_ratio_high='0.28' is text; policy loss 'vanilla' takes a "
            "number there (default 0.2)",
        ),
        (
            {"algorithm.estimator_options": {"norm_by_std": 1}},
            "algorithm.estimator_options.norm_by_std=1 is an integer; estimator 'grpo' takes true or false there "
            "(default True)",
        ),
        (
            {"algorithm.estimator_options": {"epsilon": True}},
            "algorithm.estimator_options.epsilon=True is true or false; estimator 'grpo' takes a number there",
        ),
        (
            {
                "actor_rollout_ref.rollout.agent_loop": "tool_calling",
                "actor_rollout_ref.rollout.agent.options": {"max_turns": 2.5},
            },
            "actor_rollout_ref.rollout.agent.options.max_turns=2.5 is a number; agent loop 'tool_calling' takes an "
            "integer there (default 4)",
        ),
        (
            {
                "algorithm.batch_hooks": ["dynamic_sampling"],
                "algorithm.batch_hook_options": {"dynamic_sampling": {"metric": 1}},
            },
            "algorithm.batch_hook_options['dynamic_sampling'].metric=1 is an integer; "
            "hook 'dynamic_sampling' takes text",
        ),
        # ranks against the CPUs of the local Ray instance (a quarter CPU per CPU rank): no machine of < 257 cores
        (
            {"trainer.placement": "split", "trainer.rollout_ranks": 1024, "data.train_batch_size": 1024},
            "trainer.rollout_ranks=1024 with trainer.placement=split beside trainer.n_gpus_per_node=2 training ranks "
            "asks for 1026 ranks of 0.25 CPU each (trainer.device='cpu'), but this machine has",
        ),
        (
            {"trainer.n_gpus_per_node": 2048},
            "trainer.n_gpus_per_node=2048 training ranks ask for 2048 ranks of 0.25 CPU "
            "each (trainer.device='cpu'), but this machine has",
        ),
        # the server's address
        (
            {
                "actor_rollout_ref.rollout.agent_loop": "tool_calling",
                "actor_rollout_ref.rollout.mode": "server",
                "actor_rollout_ref.rollout.server.host": "192.0.2.1",
            },
            "actor_rollout_ref.rollout.server.host='192.0.2.1' is not an address of this machine",
        ),
        (
            {
                "actor_rollout_ref.rollout.agent_loop": "tool_calling",
                "actor_rollout_ref.rollout.mode": "server",
                "actor_rollout_ref.rollout.server.host": "no-such-host.invalid",
            },
            "actor_rollout_ref.rollout.server.host='no-such-host.invalid' is not an address this machine resolves",
        ),
        ({"trainer.save_freq": -1}, "trainer.save_freq=-1 must be >= 0 (0 turns it off, as veRL's -1 does)"),
        # LoRA
        ({"actor_rollout_ref.model.lora_rank": -1}, "actor_rollout_ref.model.lora_rank=-1 must be >= 0"),
        (
            {"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.lora_alpha": 0},
            "actor_rollout_ref.model.lora_alpha=0.0 must be > 0",
        ),
        ({"critic.lora_rank": -2}, "critic.lora_rank=-2 must be >= 0"),
        ({"critic.lora_rank": 4, "critic.target_modules": []}, "critic.target_modules is empty: name the modules"),
        (
            {"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.actor.tensor_model_parallel_size": 2},
            "actor_rollout_ref.model.lora_rank=8 with actor.tensor_model_parallel_size=2: LoRA trains under FSDP2 data "
            "parallelism only",
        ),
        (
            {
                "actor_rollout_ref.model.lora_rank": 8,
                "actor_rollout_ref.model.lora_adapter_path": "/nonexistent/adapter",
            },
            "actor_rollout_ref.model.lora_adapter_path='/nonexistent/adapter' holds no adapter_config.json",
        ),
    ],
)
def test_each_invalid_setting_names_key_value_and_allowed(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_config(cfg(**overrides))
    assert message in str(err.value)


def test_tensor_parallel_sizes_that_split_the_model_pass():
    check_config(
        cfg(
            **{
                "trainer.n_gpus_per_node": 4,
                "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
                "actor_rollout_ref.actor.tensor_model_parallel_size": 2,
            }
        )
    )


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as err:
        check_config(cfg(**{"actor_rollout_ref.rollout.n": 0, "trainer.device": "tpu"}))
    assert "rollout.n=0" in str(err.value) and "trainer.device='tpu'" in str(err.value)


def test_an_option_takes_a_value_of_its_defaults_type():
    defaults = {"ratio": 0.2, "turns": 4, "flag": True, "name": "x", "anything": None}
    good = {"ratio": 1, "turns": 2, "flag": False, "name": "y", "anything": [1, "a"]}
    assert option_problems("k", good, defaults, "loss 'l'") == []
    assert option_problems("k", {"ratio": 0.5}, defaults, "loss 'l'") == []
    bad = {"ratio": True, "turns": 2.0, "flag": 1, "name": 3, "typo": 1}
    assert option_problems("k", bad, defaults, "loss 'l'") == [
        f"k has ['typo']; loss 'l' takes {defaults}",
        "k.ratio=True is true or false; loss 'l' takes a number there (default 0.2)",
        "k.turns=2.0 is a number; loss 'l' takes an integer there (default 4)",
        "k.flag=1 is an integer; loss 'l' takes true or false there (default True)",
        "k.name=3 is an integer; loss 'l' takes text there (default 'x')",
    ]


def test_room_for_the_ranks_is_left_to_the_cluster_given_an_address(monkeypatch):
    split = {"trainer.placement": "split", "trainer.rollout_ranks": 1024, "data.train_batch_size": 1024}
    assert any("this machine has" in p for p in config_problems(cfg(**split)))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert not any("this machine has" in p for p in config_problems(cfg(**split)))
    assert not any("this machine has" in p for p in config_problems(cfg(**split, **{"trainer.ray_address": "auto"})))


SERVER = {"actor_rollout_ref.rollout.agent_loop": "tool_calling", "actor_rollout_ref.rollout.mode": "server"}


def test_a_busy_server_port_is_refused_and_a_free_one_passes():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        problems = config_problems(cfg(**SERVER, **{"actor_rollout_ref.rollout.server.port": port}))
        assert (
            f"actor_rollout_ref.rollout.server.port={port}: port {port} on 127.0.0.1 is in use (Address already in "
            "use); use a free port, or 0 to let the server pick one (the URL is logged)"
        ) in problems
    for free in ({}, {"actor_rollout_ref.rollout.server.port": port}):  # port 0 (any free one), the port let go
        assert not any("rollout.server" in p for p in config_problems(cfg(**SERVER, **free)))


def test_bad_data_files_name_their_key_and_file(tmp_path):
    row = {"data_source": "d", "prompt": "1+1=", "reward_model": {"ground_truth": "2"}}
    good, no_rows, text = tmp_path / "good.parquet", tmp_path / "no_rows.parquet", tmp_path / "text.parquet"
    pq.write_table(pa.Table.from_pylist([row]), good)
    pq.write_table(pa.Table.from_pylist([row]).slice(0, 0), no_rows)
    text.write_text("not parquet")
    with pytest.raises(ConfigError) as err:
        dataset_rows(cfg(**{"data.val_files": [str(no_rows)]}).data, [str(text)], [str(no_rows)])
    lines = str(err.value).splitlines()
    assert lines[1].startswith(f"  - data.train_files: {text}: not a readable parquet file")
    assert lines[2].startswith(f"  - data.val_files: {no_rows}: the file has no rows; allowed: parquet files with rows")
    train, val = dataset_rows(cfg().data, [str(good)], [str(good)])  # no data.val_files: the training rows validate
    assert train == [row] and val is train
    # the synthetic task's own validation split (resolve_data_files gives it without data.val_files) is what
    # validates, not the training rows: taking those made a vLLM e2e run validate on every training prompt (3x)
    other = tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist([{**row, "prompt": "2+2="}] * 3), other)
    train, val = dataset_rows(cfg().data, [str(good)], [str(other)])
    assert train == [row] and len(val) == 3 and val[0]["prompt"] == "2+2="


def test_a_custom_reward_file_is_read_at_start(tmp_path):
    """A missing file, a file that does not parse, and a file without the named function are refused before
    anything starts (a missing file once trained to the end with every reward an error); a good file passes."""
    key = "reward.custom_reward_function"
    missing = str(tmp_path / "nowhere.py")
    with pytest.raises(ConfigError, match=rf"{key}.path='{missing}': no such file"):
        check_config(cfg(**{f"{key}.path": missing}))
    broken = tmp_path / "broken.py"
    broken.write_text("def compute_score(:\n")
    with pytest.raises(ConfigError, match=rf"{key}.path='{broken}': not a readable Python file"):
        check_config(cfg(**{f"{key}.path": str(broken)}))
    other = tmp_path / "other.py"
    other.write_text("import math\n\ndef score(a, b, c, d):\n    return 1.0\n\ndef helper():\n    pass\n")
    with pytest.raises(ConfigError, match=rf"{key}.name='compute_score': {other} defines no such function; it "
                       "defines: score, helper"):  # fmt: skip
        check_config(cfg(**{f"{key}.path": str(other)}))
    check_config(cfg(**{f"{key}.path": str(other), f"{key}.name": "score"}))


@pytest.fixture
def eight_quiet_cpus(monkeypatch):
    """A machine of 8 CPUs of which 0.4 are busy stands in for this one (unit test: the sample is core/devices')."""
    import hybridflow.trainer.config_checks as checks

    monkeypatch.setattr(checks, "_local_cpus", lambda: 8)
    monkeypatch.setattr(checks, "busy_cores", lambda: 0.4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def settled_threads(**overrides):
    from hybridflow.trainer.config_checks import settle_cpu_threads

    trainer = OmegaConf.to_object(cfg(**{"trainer.device": "cpu", **overrides})).trainer
    settle_cpu_threads(trainer)
    return trainer.cpu_threads_per_rank


def test_auto_threads_split_the_free_cpus_among_the_ranks_on_this_machine(eight_quiet_cpus, caplog):
    with caplog.at_level("INFO", logger="hybridflow.trainer.config_checks"):
        assert settled_threads(**{"trainer.n_gpus_per_node": 2}) == 4
    assert "trainer.cpu_threads_per_rank=auto: 4 (8 of 8 CPUs free at start, 2 rank(s) on this machine)" in caplog.text
    split = {"trainer.placement": "split", "trainer.rollout_ranks": 2}
    assert settled_threads(**{"trainer.n_gpus_per_node": 2, **split}) == 2  # the rollout's ranks are here too


def test_auto_threads_keep_to_omp_num_threads_a_joined_cluster_and_a_set_value(eight_quiet_cpus, monkeypatch):
    assert settled_threads(**{"trainer.cpu_threads_per_rank": 3}) == 3
    assert settled_threads(**{"trainer.device": "cuda"}) is None  # GPU ranks keep torch's default
    assert settled_threads(**{"trainer.ray_address": "10.0.0.1:6379"}) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert settled_threads(**{"trainer.n_gpus_per_node": 1}) == 2


def test_auto_threads_are_settled_once_where_a_run_is_built_not_by_the_check(eight_quiet_cpus, monkeypatch, tmp_path):
    import hybridflow.trainer.main as main
    from hybridflow.trainer.launch import group_options

    config = OmegaConf.to_object(cfg(**{"trainer.device": "cpu"}))
    config_problems(config)
    assert config.trainer.cpu_threads_per_rank is None  # the check decides nothing a run builds from
    with pytest.raises(ValueError, match="cpu_threads_per_rank is auto .null. and not settled"):
        group_options(config)

    class Built(Exception):
        pass

    def stop(_config):
        raise Built

    monkeypatch.setattr(main, "resolve_data_files", stop)  # the run's next step after settling: stop there
    with pytest.raises(Built):
        main.build_and_fit(config, tmp_path)
    assert config.trainer.cpu_threads_per_rank == 4  # 8 free CPUs, 2 ranks
    assert group_options(config).cpu_torch_threads == 4


def test_the_run_defaults_omp_num_threads_only_while_ray_runs_after_its_threads_are_settled(
    eight_quiet_cpus, monkeypatch, tmp_path
):
    """``hybridflow-train`` gives its own processes OMP_NUM_THREADS=1 only inside ``ray_running``, after auto
    threads are settled, and takes the default away after: set before (as it once was), it capped every run's
    ranks at 1 thread, and left in place, every later run in the process (a sweep's next job)."""
    import types

    import hybridflow.trainer.main as main

    class Stop(Exception):
        pass

    seen = []

    def stop_in_ray(address):  # ray_running's default, then the run's threads: record, leave before Ray starts
        seen.append((os.environ.get("OMP_NUM_THREADS"), threads.pop()))
        raise Stop

    threads, settle = [], main.settle_cpu_threads

    def settle_and_record(trainer):
        settle(trainer)
        threads.append(trainer.cpu_threads_per_rank)

    monkeypatch.setattr(main, "settle_cpu_threads", settle_and_record)
    monkeypatch.setattr("hybridflow.core.init_ray", stop_in_ray)
    hydra = types.SimpleNamespace(runtime=types.SimpleNamespace(output_dir=str(tmp_path)))
    monkeypatch.setattr(main, "HydraConfig", types.SimpleNamespace(get=lambda: hydra))
    monkeypatch.setattr(os, "environ", dict(os.environ))  # nothing a run sets leaks into the suite
    overrides = {"trainer.device": "cpu", "trainer.n_gpus_per_node": 1, "data.synthetic_dir": str(tmp_path / "data")}
    for _ in range(2):  # two runs in one process, as a sweep's jobs
        with pytest.raises(Stop):
            main.train(cfg(**overrides))
        assert "OMP_NUM_THREADS" not in os.environ  # the default left with the run
    assert seen == [("1", 8), ("1", 8)]  # 8 free CPUs, 1 rank, in both runs; Ray's processes got the default
