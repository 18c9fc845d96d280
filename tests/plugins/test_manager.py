"""Plugin discovery through real entry points.

Third-party plugins are simulated by writing a real distribution's metadata
(``*.dist-info`` with ``entry_points.txt``) and its module into a temporary
folder on ``sys.path``: importlib.metadata discovers them exactly as it
discovers pip-installed packages.
"""

import subprocess
import sys
import textwrap

import pytest

from hybridflow.plugins import (
    PluginConflictError,
    UnknownNameError,
    get_estimator,
    get_plugin_manager,
    get_reward_verifier,
    reset_plugin_manager,
)
from hybridflow.plugins.listing import format_plugin_table
from hybridflow.plugins.manager import ESTIMATORS, PluginManager

BUILTINS = {
    "gae", "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
    "grpo_passk", "gdpo", "remax", "opo", "gpg", "optimal_token_baseline", "tir_optimal_token_baseline",
}  # fmt: skip

ESTIMATOR_PLUGIN = """
from hybridflow.plugins import AdvantageEstimator, hookimpl

def {fn}(token_level_rewards, response_mask):
    '''Zero advantage, for tests.'''
    zeros = token_level_rewards * 0
    return zeros, zeros

@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name={name!r}, fn={fn}))
"""


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    added = set(sys.modules)
    reset_plugin_manager()
    yield monkeypatch
    reset_plugin_manager()
    for name in set(sys.modules) - added:
        if name.startswith("fakeplug_"):
            del sys.modules[name]


def install_fake(monkeypatch, tmp_path, dist, modules, entry_points, version="1.0"):
    root = tmp_path / dist
    root.mkdir()
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[hybridflow]\n{lines}")
    monkeypatch.syspath_prepend(str(root))
    reset_plugin_manager()


def test_builtins_are_discovered_through_entry_points(fresh):
    manager = get_plugin_manager()
    registry = manager.registry(ESTIMATORS)
    assert set(registry.names()) >= BUILTINS
    for name in BUILTINS:
        [registration] = registry.by_name[name]
        assert registration.source.distribution == "hybridflow"
    assert manager.failures == []


def test_third_party_plugin_is_found_and_attributed(fresh, tmp_path):
    install_fake(
        fresh,
        tmp_path,
        "fakeplug-one",
        {"fakeplug_one": ESTIMATOR_PLUGIN.format(fn="zero", name="zero_adv")},
        {"zero_adv": "fakeplug_one"},
        version="2.5",
    )
    assert get_estimator("zero_adv").summary == "Zero advantage, for tests."
    [reg] = get_plugin_manager().registry(ESTIMATORS).by_name["zero_adv"]
    assert (reg.source.distribution, reg.source.version) == ("fakeplug-one", "2.5")
    assert rows(format_plugin_table(get_plugin_manager()))["zero_adv"] == ["fakeplug-one", "2.5", "-"]


def test_two_plugins_claiming_one_name_names_both_distributions(fresh, tmp_path):
    install_fake(
        fresh, tmp_path, "fakeplug-a", {"fakeplug_a": ESTIMATOR_PLUGIN.format(fn="f", name="grpo")}, {"a": "fakeplug_a"}
    )
    with pytest.raises(PluginConflictError) as err:
        get_estimator("grpo")
    assert "hybridflow" in str(err.value) and "fakeplug-a" in str(err.value)
    assert get_estimator("rloo").name == "rloo"  # other names are unaffected
    listing = format_plugin_table(get_plugin_manager())
    assert "CONFLICT estimator 'grpo'" in listing
    grpo = [line.split()[1] for line in listing.splitlines() if line.startswith("  grpo ")]
    assert sorted(grpo) == ["fakeplug-a", "hybridflow"]  # one row per registration


def test_plugin_that_fails_to_import_is_reported_and_others_work(fresh, tmp_path):
    install_fake(
        fresh,
        tmp_path,
        "fakeplug-broken",
        {"fakeplug_broken": "import a_module_that_does_not_exist\n"},
        {"broken": "fakeplug_broken"},
    )
    manager = get_plugin_manager()
    [failure] = manager.failures
    assert failure.source.distribution == "fakeplug-broken" and failure.stage == "import"
    assert "ModuleNotFoundError" in failure.error
    assert get_estimator("grpo").name == "grpo"
    assert "FAILED broken (fakeplug-broken 1.0) at import" in format_plugin_table(manager)


def test_plugin_whose_register_hook_raises_is_isolated(fresh, tmp_path):
    source = """
    from hybridflow.plugins import hookimpl

    @hookimpl
    def hybridflow_register_estimators(register):
        register("not an AdvantageEstimator")
    """
    install_fake(fresh, tmp_path, "fakeplug-bad", {"fakeplug_bad": source}, {"bad": "fakeplug_bad"})
    assert get_estimator("grpo").name == "grpo"
    [failure] = get_plugin_manager().failures
    assert failure.stage == "hybridflow_register_estimators"
    assert "must register AdvantageEstimator objects, got str" in failure.error


def test_autoload_disabled_keeps_builtins_only(fresh, tmp_path):
    install_fake(
        fresh,
        tmp_path,
        "fakeplug-off",
        {"fakeplug_off": ESTIMATOR_PLUGIN.format(fn="g", name="off_adv")},
        {"off": "fakeplug_off"},
    )
    fresh.setenv("HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD", "1")
    reset_plugin_manager()
    assert get_estimator("grpo").name == "grpo"
    with pytest.raises(UnknownNameError):
        get_estimator("off_adv")
    fresh.delenv("HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD")
    reset_plugin_manager()
    assert get_estimator("off_adv").name == "off_adv"


def test_unknown_name_lists_known_names_with_distribution(fresh):
    with pytest.raises(UnknownNameError) as err:
        get_estimator("reinforce_plus")
    msg = str(err.value)
    assert "unknown estimator 'reinforce_plus'" in msg
    assert "Did you mean 'reinforce_plus_plus'" in msg
    assert "grpo [hybridflow]" in msg


def test_unknown_reward_verifier_is_an_error(fresh):
    with pytest.raises(UnknownNameError, match="unknown reward verifier 'no-such-verifier'"):
        get_reward_verifier("no-such-verifier")


def test_same_plugin_registering_a_name_twice_is_reported(fresh, tmp_path):
    source = (
        ESTIMATOR_PLUGIN.format(fn="h", name="twice")
        + """
@hookimpl(specname="hybridflow_register_estimators")
def again(register):
    register(AdvantageEstimator(name="twice", fn=h))
"""
    )
    install_fake(fresh, tmp_path, "fakeplug-twice", {"fakeplug_twice": source}, {"twice": "fakeplug_twice"})
    get_estimator("grpo")
    assert any("registered estimator 'twice' twice" in f.error for f in get_plugin_manager().failures)


def test_invalid_name_is_rejected():
    from hybridflow.plugins import AdvantageEstimator

    with pytest.raises(ValueError, match="must be lowercase"):
        AdvantageEstimator(name="Bad Name", fn=lambda: None)


def test_manager_without_autoload_argument(fresh):
    manager = PluginManager(autoload=False)
    assert set(manager.registry(ESTIMATORS).names()) == BUILTINS


def rows(listing):
    """The compact table's rows, by name: the words after it (distribution, version, what it declares)."""
    return {
        line.split()[0]: line.split(maxsplit=1)[1].replace(",", "").split()
        for line in listing.splitlines()
        if line.startswith("  ")
    }


def sections(listing):
    """The compact table's kinds, in order, each with its row names."""
    out, kind = {}, None
    for line in listing.splitlines():
        if line.startswith("  "):
            out[kind].append(line.split()[0])
        elif " (" in line and "distribution" in line:
            kind = line.split(" (")[0]
            out[kind] = []
    return out


def test_cli_lists_one_row_per_name_grouped_by_kind_with_what_an_estimator_needs():
    out = subprocess.run(
        [sys.executable, "-m", "hybridflow", "plugins"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    by_kind = sections(out)
    assert list(by_kind) == [
        "estimators", "reward verifiers", "policy losses", "batch hooks", "agent loops", "tools", "rollout engines"
    ]  # fmt: skip
    assert set(by_kind["estimators"]) == BUILTINS and by_kind["estimators"] == sorted(BUILTINS)
    table = rows(out)
    assert table["grpo"] == ["hybridflow", "0.1.0", "groups"]
    assert table["gae"] == ["hybridflow", "0.1.0", "critic"]
    assert table["rloo"] == ["hybridflow", "0.1.0", "groups"]
    assert table["reinforce_plus_plus"] == ["hybridflow", "0.1.0", "-"]  # needs nothing beyond the rewards
    assert table["remax"] == ["hybridflow", "0.1.0", "reward_baselines"]
    assert table["gdpo"] == ["hybridflow", "0.1.0", "groups", "reward_components"]
    assert table["optimal_token_baseline"][2:] == [
        "groups",
        "old_log_probs",
        "sum_pi_squared",
        "rollout_is_weights",
        "(optional)",
    ]
    assert " ".join(table["dr_grpo"][2:]) == "groups; actor defaults: loss_agg_mode=seq-mean-token-sum-norm"
    assert table["dynamic_sampling"] == ["hybridflow", "0.1.0", "after_reward"]
    assert table["tool_calling"] == ["hybridflow", "0.1.0", "multi-turn"]
    assert table["single_turn"] == ["hybridflow", "0.1.0", "one", "generation"]
    assert table["vanilla"] == table["gsm8k"] == table["reveal"] == ["hybridflow", "0.1.0"]
    # compact: a line per name and kind, none per plugin (hooks are --verbose's)
    names = sum(len(v) for v in by_kind.values())
    assert len(out.splitlines()) == names + len(by_kind) + 1 and "hooks:" not in out


def test_cli_verbose_lists_each_plugin_with_its_hooks_and_each_name_with_its_options():
    out = subprocess.run(
        [sys.executable, "-m", "hybridflow", "plugins", "--verbose"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    lines = out.splitlines()
    for name in BUILTINS:
        block = lines.index(f"{name}  (hybridflow 0.1.0)")
        assert lines[block + 1] == "    hooks: hybridflow_register_estimators"
        assert lines[block + 2] == f"    estimators: {name}"
        assert lines[block + 3].startswith(f"        {name}(")
