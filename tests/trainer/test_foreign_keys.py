"""veRL keys and TRL ``GRPOConfig`` names get the hybridflow key that does the same, and that key works.

Every suggestion of ``configs/foreign_keys.py`` is checked the way a reader
would use it: each key it names exists in the schema, and its overrides
(with the entry's example value) parse, compose and pass the config check,
with the policy loss's options checked against the loss as the actor will
(only what this machine lacks is forgiven, as for the documented commands).
An alias must not shadow one of our keys, nor a ``.*`` section one of our
sections (a misspelt key of ours would lose difflib's suggestion).
"""

import dataclasses
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.foreign_keys import (
    TABLE,
    TRL_NAMES,
    VERL_KEYS,
    VERL_VALUES,
    ForeignKey,
    explain,
    lookup,
    suggestion,
)
from hybridflow.configs.overrides import group_options, override_problems, schema_keys
from hybridflow.configs.schema import PPOConfig, register_configs
from hybridflow.plugins import get_policy_loss
from hybridflow.trainer.config_checks import config_problems

ROOT = Path(__file__).resolve().parents[2]
NOT_OURS = object()
KEYS, GROUPS = schema_keys(), group_options()
MACHINE_PROBLEMS = (  # what the example values name but this machine lacks: a model directory, GPUs, a file
    "is not a directory; give a local HF model",
    "GPU(s)",
    "rollout.name='vllm': ",
    "reward.custom_reward_function.path='my_score.py': no such file",
)


def suggestions(entry: ForeignKey) -> list[tuple[str, ...]]:
    """Every override list ``entry`` can suggest, with its example value (and ``x`` under a ``.*`` section)."""
    rest = "x" if entry.name.endswith(".*") else ""
    found = [suggestion(entry, entry.example, rest)] if entry.here else []
    found += [suggestion(entry, value, rest) for value in entry.by_value]
    return [tuple(a for item in s for a in shlex.split(item)) for s in found if s]


def named_key(item: str) -> str:
    """The key or group an override (or a bare key) sets: ``+a.b=1`` -> ``a.b``, ``rollout@x.y=vllm`` -> ``rollout``."""
    return item.partition("=")[0].lstrip("+~").partition("@")[0]


def exists(key: str) -> bool:
    """A key of the schema, a config group, Hydra's run directory, or an entry of a dict-valued key."""
    if key in KEYS or key in GROUPS or key == "hydra.run.dir":
        return True
    parent = key.rpartition(".")[0]
    while parent and parent not in KEYS:
        parent = parent.rpartition(".")[0]
    return bool(parent) and typing.get_origin(KEYS[parent]) is dict


ENTRIES = list(TABLE.values())
CASES = [(e.name, s, e.checked_with) for e in ENTRIES for s in suggestions(e)]


VERL_KEY_LIST = Path(__file__).parent / "data" / "verl_0.8.0.dev_ppo_trainer_keys.txt"


def test_every_key_of_verls_config_has_a_rule():
    """veRL's whole PPO trainer config, key by key: each is ours (taken as written) or has an entry (translated,
    accepted with a line, or refused saying what to write instead); none falls through to difflib's guess."""
    keys = [k for k in VERL_KEY_LIST.read_text().splitlines() if k and not k.startswith("#")]
    assert len(keys) == 556
    defaults = OmegaConf.structured(PPOConfig)
    ruleless = [k for k in keys if OmegaConf.select(defaults, k, default=NOT_OURS) is NOT_OURS and lookup(k) is None]
    assert ruleless == []


def test_the_table_covers_both_frameworks():
    assert len(VERL_KEYS) > 100 and len(TRL_NAMES) > 60
    assert len(TABLE) == len(VERL_KEYS) + len(TRL_NAMES), "a name is listed twice"


# The three checks below run over every entry (~470) in one test each: one test item per entry cost the suite
# seconds of collection and scheduling for checks that take microseconds. Each names every entry that fails.
def entry_problems(entry) -> list[str]:
    """What is wrong with how ``entry`` answers (empty when nothing is)."""
    checks = [
        (entry.here or entry.by_value or entry.missing or entry.ignored, "says nothing: no suggestion, no reason"),
        (not (entry.ignored and (entry.here or entry.by_value or entry.same_as)), "ignored, and yet a suggestion"),
        (not entry.same_as or (entry.missing and not entry.here), "same_as needs the advice for other values"),
        (not (entry.here and entry.missing and not entry.by_value), "a suggestion and 'no equivalent' at once"),
        (set(entry.value_notes) <= set(entry.by_value) | {entry.example.lower()}, "a note for a value it lacks"),
    ]
    return [f"{entry.name}: {what}" for ok, what in checks if not ok]


def shadowed(entry) -> list[str]:
    """Our keys that ``entry``'s name would hide (empty when none)."""
    name = entry.name.removesuffix(".*")
    if name in KEYS or name in GROUPS:
        return [f"{name} is a key here now: drop it from the table"]
    if entry.name.endswith(".*") and any(k.startswith(name + ".") for k in KEYS):
        return [f"{entry.name} would hide typos of our keys"]
    return []


def missing_keys(entry) -> list[str]:
    """The keys ``entry``'s advice names that are not keys here."""
    items = [*entry.here, *(i for s in entry.by_value.values() for i in s), *entry.checked_with]
    args = [arg for item in items for arg in shlex.split(item.replace("{value}", "v").replace("{rest}", "x"))]
    return [f"{entry.name}: {named_key(arg)} is not a key here" for arg in args if not exists(named_key(arg))]


def test_an_entry_says_what_to_do_or_why_not():
    assert [p for e in ENTRIES for p in entry_problems(e)] == []


def test_an_alias_shadows_none_of_our_keys():
    assert [p for e in ENTRIES for p in shadowed(e)] == []


def test_every_key_an_entry_names_exists():
    assert [p for e in ENTRIES for p in missing_keys(e)] == []


def test_the_entry_checks_name_what_is_wrong():
    """The three checks above find a broken entry (so their empty lists mean something)."""
    entry = TABLE["vllm_tensor_parallel_size"]
    said_nothing = dataclasses.replace(entry, here=(), by_value={}, missing="", ignored="")
    assert entry_problems(entry) == [] and entry_problems(said_nothing) != []
    assert shadowed(dataclasses.replace(entry, name="trainer.total_training_steps")) != []
    assert missing_keys(dataclasses.replace(entry, here=("trainer.no_such_key=1",))) == [
        "vllm_tensor_parallel_size: trainer.no_such_key is not a key here"
    ]


@pytest.mark.parametrize("name,overrides,context", CASES, ids=[f"{n}:{' '.join(s)[:50]}" for n, s, _ in CASES])
def test_a_suggestion_composes_and_passes_the_config_check(name, overrides, context):
    settings = [o for o in overrides if "=" in o]
    if not settings:
        pytest.skip("names a key only (its value is not the foreign one)")
    args = [*context, *settings]
    assert override_problems(args) == [], (name, args)
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = OmegaConf.to_object(compose("ppo_trainer", overrides=args))
    problems = [p for p in config_problems(config) if not any(m in p for m in MACHINE_PROBLEMS)]
    actor = config.actor_rollout_ref.actor
    unknown = set(actor.policy_loss_options) - set(get_policy_loss(actor.policy_loss).options)
    assert problems == [] and not unknown, (name, args, problems, unknown)


@pytest.mark.parametrize(
    "args,expected",
    [
        (
            ["data.max_response_length=512"],
            "data.max_response_length is veRL's name; here: actor_rollout_ref.rollout.response_length=512",
        ),
        (["learning_rate=1e-6"], "learning_rate is TRL's GRPOConfig name; here: actor_rollout_ref.actor.optim.lr=1e-6"),
        (
            ["--learning_rate", "1e-6"],
            "learning_rate is TRL's GRPOConfig name; here: actor_rollout_ref.actor.optim.lr=1e-6",
        ),
        (
            ["algorithm.gamma=0.99"],
            "algorithm.gamma is veRL's name; here: +algorithm.estimator_options.gamma=0.99; "
            "an option of the estimators that discount (gae, reinforce_plus_plus)",
        ),
        (
            ["loss_type=bnpo"],
            "loss_type is TRL's GRPOConfig name; here: actor_rollout_ref.actor.loss_agg_mode=token-mean-local; "
            "a TRL loss type is a policy loss and an aggregation mode here (losses/aggregation.py)",
        ),
        (
            ["critic.model.use_remove_padding=false"],
            "critic.model.use_remove_padding is veRL's name; here: actor_rollout_ref.model.use_remove_padding=false; "
            "one switch for the actor, the reference and the critic",
        ),
        (
            ["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768"],
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu is veRL's name; here: "
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768; "
            "the reference's forward passes are micro-batched as the actor's old-log-prob pass",
        ),
        (
            ["+custom_reward_function.reward_kwargs.alpha=2"],
            "custom_reward_function.reward_kwargs.alpha is veRL's name; "
            "here: +reward.custom_reward_function.kwargs.alpha=2",
        ),
        (
            ["reward_model.micro_batch_size=32"],
            "reward_model.micro_batch_size is veRL's name; here: "
            "reward_model.micro_batch_size_per_gpu; veRL's global micro-batch (deprecated there); here per rank: "
            "divide by the data-parallel ranks",
        ),
        (
            ["trainer.total_trainig_steps=3"],
            "trainer.total_trainig_steps: no such key; did you mean trainer.total_training_steps?",
        ),
    ],
)
def test_messages(args, expected):
    assert override_problems(args) == [expected]


def test_verl_keys_that_are_ours_now_just_work():
    keys = [
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=8192",
        "critic.use_dynamic_bsz=true",
        "critic.ppo_max_token_len_per_gpu=4096",
        "critic.forward_max_token_len_per_gpu=8192",
        "reward_model.enable=false",
        "reward_model.model.path=/models/rm",
        "reward_model.micro_batch_size_per_gpu=8",
        "reward_model.max_length=2048",
        "reward_model.use_dynamic_bsz=true",
        "reward_model.forward_max_token_len_per_gpu=8192",
        "reward_model.model.fsdp_config.param_offload=true",
    ]
    assert override_problems(keys) == []
    assert all(lookup(k.partition("=")[0]) is None for k in keys)


def test_each_foreign_override_gets_its_own_line_beside_valid_ones():
    problems = override_problems(["trainer.seed=1", "num_generations=4", "trainer.project_name=x", "top_p=0.9"])
    assert problems == [
        "num_generations is TRL's GRPOConfig name; here: actor_rollout_ref.rollout.n=4",
        "top_p is TRL's GRPOConfig name; here: actor_rollout_ref.rollout.top_p=0.9",
    ]


def test_the_value_picks_the_suggestion():
    assert (
        explain("use_vllm", "False")
        == "use_vllm is TRL's GRPOConfig name; here: actor_rollout_ref.rollout.name=builtin"
    )
    assert explain("beta", "0.0").endswith("here: nothing to set; no KL term and no reference is the default here")
    assert "luspo" in explain("loss_type", "vespo")
    assert explain("actor_rollout_ref.rollout.val_kwargs.do_sample", "maybe").endswith("and maybe is none of those")


def test_hydra_flags_are_still_left_to_hydra_but_foreign_names_beside_them_are_answered():
    assert override_problems(["--cfg", "job", "trainer.seed=1"]) == []
    problems = override_problems(["learning_rate=1e-6", "--num_generations", "4", "--use_vllm", "trainer.seed=1"])
    assert problems == [
        "learning_rate is TRL's GRPOConfig name; here: actor_rollout_ref.actor.optim.lr=1e-6",
        "num_generations is TRL's GRPOConfig name; here: actor_rollout_ref.rollout.n=4",
        "use_vllm is TRL's GRPOConfig name; here: rollout@actor_rollout_ref.rollout=vllm trainer=gpu; "
        "colocated on the training GPUs (on CPUs: trainer=cpu with vLLM's CPU build, docs/vllm.md)",
    ]


def test_the_command_answers_a_verl_key_it_cannot_translate_and_exits_2(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybridflow.trainer.main",
            "data.max_response_length=512",
            "actor_rollout_ref.actor.ppo_micro_batch_size=64",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "veRL's data.max_response_length=512 -> actor_rollout_ref.rollout.response_length=512" in out.stderr
    assert "here: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu; veRL's global micro-batch" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "entry",
    [e for e in ENTRIES if e.exact] + list(VERL_VALUES),
    ids=[e.name for e in ENTRIES if e.exact] + [e.name for e in VERL_VALUES],
)
def test_an_exact_entry_rewrites_to_settings(entry):
    """``exact`` applies the suggestion: each must set a value (a bare key would be dropped)."""
    for overrides in suggestions(entry):
        assert all("=" in o for o in overrides), (entry.name, overrides)


@pytest.mark.parametrize("entry", VERL_VALUES, ids=[e.name for e in VERL_VALUES])
def test_a_verl_value_is_for_one_of_our_keys_and_its_translation_passes_the_check(entry):
    assert entry.name in KEYS and entry.exact
    for value, overrides in entry.by_value.items():
        assert override_problems([f"{entry.name}={value}"]) == [] or value == "-1"
        register_configs()
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            config = OmegaConf.to_object(compose("ppo_trainer", overrides=list(overrides)))
        assert [p for p in config_problems(config) if not any(m in p for m in MACHINE_PROBLEMS)] == []


# The first words of the dotted names the "coming from" pages talk about: ours, and veRL's sections we lack.
SECTIONS = (
    "algorithm.",
    "actor_rollout_ref.",
    "critic.",
    "reward.",
    "data.",
    "trainer.",
    "reward_model.",
    "custom_reward_function.",
    "reward_manager.",
)


@pytest.mark.parametrize("page", ["coming-from-verl.md", "coming-from-trl.md"])
def test_every_dotted_name_on_the_pages_is_ours_or_in_the_table(page):
    """A key of ours renamed, or a veRL key the table lacks, shows up here: the page would mislead."""
    unknown = set()
    for span in re.findall(r"`([^`]+)`", (ROOT / "docs" / page).read_text()):
        for word in span.split():
            name = word.strip("'();,:").lstrip("+~").partition("=")[0].removesuffix(".*")
            if name.startswith(SECTIONS) and not name.endswith((".", "...")) and "<" not in name:
                if not (exists(name) or lookup(name) or any(k.startswith(name + ".") for k in KEYS)):
                    unknown.add(name)
    assert not unknown, sorted(unknown)


def test_hydra_groups_and_keys_are_left_to_hydra():
    from hybridflow.configs.overrides import override_problems

    assert override_problems(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=x"]) == []
