"""The engine passes hybridflow's rollout-engine contract (the kit's fixture) and counts what it did."""

from hybridflow.plugins import get_rollout_engine


def test_the_engine_keeps_the_rollout_engine_contract(check_rollout_engine):
    report = check_rollout_engine("traced_builtin")
    assert "weights load in place" in report.checked


def test_it_is_registered_by_name_from_this_package():
    entry = get_rollout_engine("traced_builtin")
    assert entry.summary.startswith("The built-in engine, counting its weight loads")
    assert entry.log_probs_match_training
