"""A veRL command line as veRL's example scripts write it: translated where the meaning is the same, refused
with what to write where it is not (``configs/overrides.py`` :func:`translate`, the table in
``configs/foreign_keys.py``). A real run written this way: ``tests/trainer/test_run_report.py``.
"""

import pytest

from hybridflow.configs.overrides import override_problems, translate

R = "actor_rollout_ref.rollout"


@pytest.mark.parametrize(
    "arg,expected_args,said",
    [
        (
            "data.train_files=/d/train.parquet",
            ["data.train_files=['/d/train.parquet']"],
            "one item where a list is expected",
        ),
        (
            "data.val_files=/root/data/gsm8k/test.parquet",
            ["data.val_files=['/root/data/gsm8k/test.parquet']"],
            "one item",
        ),
        (
            "data.max_response_length=1024",
            [f"{R}.response_length=1024"],
            f"veRL's data.max_response_length=1024 -> {R}.response_length=1024",
        ),
        (
            "data.filter_overlong_prompts=True",
            [],
            "changes nothing here: prompts over data.max_prompt_length are always",
        ),
        ("data.truncation='error'", [], "changes nothing here: prompts over data.max_prompt_length are dropped"),
        ("trainer.critic_warmup=0", [], "changes nothing here: the actor updates from the first step"),
        ("trainer.save_freq=-1", ["trainer.save_freq=0"], "veRL's -1 is off; 0 here"),
        ("trainer.test_freq=-1", ["trainer.test_freq=0"], "veRL's -1 is off; 0 here"),
        (f"{R}.mode=async", [f"{R}.mode=direct"], "trainer.rollout_mode (with trainer.placement=split) overlaps"),
        ("data.return_raw_chat=True", [], "has no effect here"),
        ("+trainer.val_before_train=False", ["trainer.val_before_train=False"], "a key here"),
        (
            "actor_rollout_ref.nccl_timeout=1200",
            ["trainer.timeouts.collective_s=1200"],
            "-> trainer.timeouts.collective_s=1200",
        ),
        ("critic.model.fsdp_config.optimizer_offload=False", ["critic.fsdp_config.optimizer_offload=False"], "->"),
        (
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
            [f"{R}.log_prob_micro_batch_size_per_gpu=16"],
            "->",
        ),
        (
            "actor_rollout_ref.actor.clip_ratio=0.2",
            [
                "+actor_rollout_ref.actor.policy_loss_options.clip_ratio_low=0.2",
                "+actor_rollout_ref.actor.policy_loss_options.clip_ratio_high=0.2",
            ],
            "->",
        ),
        ("algorithm.filter_groups.enable=True", ["algorithm.batch_hooks=[dynamic_sampling]"], "dynamic_sampling"),
    ],
)
def test_a_verl_key_with_the_same_meaning_is_rewritten_with_one_line(arg, expected_args, said):
    out = translate([arg, "trainer.seed=1"])
    assert out.args == [*expected_args, "trainer.seed=1"]
    assert len(out.lines) == 1 and said in out.lines[0], out.lines
    assert override_problems(out.args) == []


def test_the_critic_path_is_accepted_when_it_is_the_policys_and_refused_with_what_to_write_otherwise():
    same = translate(["actor_rollout_ref.model.path=/models/q", "critic.model.path=/models/q/"])
    assert (
        same.args == ["actor_rollout_ref.model.path=/models/q"]
        and "repeats actor_rollout_ref.model.path" in same.lines[0]
    )
    other = translate(["actor_rollout_ref.model.path=/models/q", "critic.model.path=/models/prm"])
    assert other.lines == [] and "critic.model.path=/models/prm" in other.args
    [problem] = override_problems(other.args)
    assert (
        problem.startswith("critic.model.path is veRL's name") and "its path is actor_rollout_ref.model.path" in problem
    )
    # a script's paths, then both replaced by the user's (appended as the script's $@): the last values agree
    edited = translate([*other.args, "actor_rollout_ref.model.path=/tiny", "critic.model.path=/tiny"])
    assert [a for a in edited.args if a.startswith("critic.")] == [] and override_problems(edited.args) == []


@pytest.mark.parametrize(
    "arg,says",
    [
        (f"{R}.log_prob_micro_batch_size=256", f"here: {R}.log_prob_micro_batch_size_per_gpu"),  # global, not per rank
        ("data.truncation=left", "prompts are never truncated"),
        ("reward_model.micro_batch_size=32", "here: reward_model.micro_batch_size_per_gpu"),  # global, not per rank
        ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1", "a step count here"),
    ],
)
def test_a_verl_key_whose_meaning_differs_is_left_for_the_check_to_refuse(arg, says):
    out = translate([arg])
    assert out.args == [arg] and out.lines == []
    [problem] = override_problems(out.args)
    assert says in problem


def test_values_and_flags_that_are_not_verls_are_left_alone():
    args = [
        "-m",
        "trainer.seed=1,2",
        "trainer.save_freq=5",
        "data.train_files=[a.parquet]",
        "hydra.run.dir=x",
        "~trainer.run_name",
        "data.max_response_length=8,16",
    ]
    assert translate(args).args == args  # a sweep over a renamed key is left for the check to explain


def test_a_translation_that_disagrees_with_another_setting_of_its_key_says_which_value_is_used():
    """veRL's reference and rollout budgets are two settings; here one serves both passes (the later wins)."""
    args = [
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=8192",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",  # agrees with the native one: no line
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "trainer.seed=1",  # the user's own two settings of one key: Hydra's override, no line
        "trainer.seed=2",
        "data.max_response_length=1024",  # a script's value, then the user's (appended as the script's $@)
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",  # both budgets changed alike: agreed
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    ]
    lines = translate(args).lines
    assert lines[-1] == (
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu: 4096 (as written) and 8192 (from veRL's "
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu) disagree; 8192, the later, is used"
    )
    assert sum("disagree" in line for line in lines) == 1
