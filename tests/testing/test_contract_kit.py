"""The contract kit: every built-in estimator and loss passes it, and it fails on plugins broken on purpose.

Built-ins that break a property by design declare it (``DECLARED`` below),
and a test checks each declaration is needed: without it, the kit fails that
built-in on exactly that property. The broken plugins live in
``broken_plugins.py``, one realistic mistake each; every check must catch
its mistake and name the property, the input and the numbers.
"""

import importlib
import sys
from pathlib import Path

import pytest

from hybridflow.plugins import AdvantageEstimator, PolicyLoss, RewardVerifier
from hybridflow.plugins.manager import BUILTIN_DISTRIBUTION, ESTIMATORS, POLICY_LOSSES, get_plugin_manager
from hybridflow.testing import VerifierCase, check_estimator, check_policy_loss, check_reward_verifier

pytestmark = pytest.mark.timeout(120)

# What a built-in's formula does not imply, and why (the kit's keyword -> value).
DECLARED = {
    # veRL's GAE whitens masked positions instead of zeroing them; the actor's loss masks them
    "gae": {"zero_on_masked": False},
    # documented: every prompt needs two responses (a ValueError otherwise, as in veRL)
    "grpo_passk": {"rejects": ("group_of_one", "single_row")},
    # handle_zero_tail zeroes the baseline of a group's strictly longest response past the second-longest length,
    # so its tail keeps the full reward-to-go even when the group's scores are equal
    "optimal_token_baseline": {"equal_rewards_give_zero": False},
    "tir_optimal_token_baseline": {"equal_rewards_give_zero": False},
    # drops the gradient of a few high-covariance tokens at random, also at ratio 1: that is the method
    "clip_cov": {"policy_gradient_at_ratio_one": False},
}
# The property each declaration switches off, as the kit names it in its failures.
PROPERTY_OF = {
    "zero_on_masked": "zero on masked tokens",
    "rejects": "edge case group_of_one",
    "equal_rewards_give_zero": "equal rewards give zero",
    "policy_gradient_at_ratio_one": "the gradient at ratio 1 is the policy gradient",
}
NEEDED_OPTIONS = {"dro": {"dro_beta": 0.1}}  # no default, as in veRL


def builtins(kind):
    registry = get_plugin_manager().registry(kind)
    return [n for n, regs in sorted(registry.by_name.items()) if regs[0].source.distribution == BUILTIN_DISTRIBUTION]


ESTIMATOR_NAMES = builtins(ESTIMATORS)
LOSS_NAMES = builtins(POLICY_LOSSES)


@pytest.mark.parametrize("name", ESTIMATOR_NAMES)
def test_every_builtin_estimator_keeps_the_contract(name):
    declared = DECLARED.get(name, {})
    report = check_estimator(name, **declared)
    off = {PROPERTY_OF[k] for k in declared if k in ("zero_on_masked", "equal_rewards_give_zero")}
    # the default rule: equal rewards must give zero exactly when the estimator reads group ids
    if not get_plugin_manager().registry(ESTIMATORS).get(name).needs_groups:
        off.add("equal rewards give zero")
    assert {n.split(" (")[0] for n in report.not_expected} == off
    assert len(report.checked) == 7 - len(off)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_builtin_loss_keeps_the_contract(name):
    report = check_policy_loss(name, options=NEEDED_OPTIONS.get(name), **DECLARED.get(name, {}))
    assert "no gradient through masked tokens" in report.checked


def test_the_parametrization_covers_the_builtins():
    # thirteen estimators and eleven losses today; a new built-in joins the tests above by itself
    assert {"grpo", "gae", "rloo", "remax", "gdpo", "optimal_token_baseline"} <= set(ESTIMATOR_NAMES)
    assert {"vanilla", "gspo", "dro", "clip_cov", "geo_mean"} <= set(LOSS_NAMES)
    assert set(DECLARED) <= set(ESTIMATOR_NAMES) | set(LOSS_NAMES)


@pytest.mark.parametrize("name,keyword", [(n, k) for n, d in DECLARED.items() for k in d])
def test_each_declaration_is_needed(name, keyword):
    check = check_estimator if name in ESTIMATOR_NAMES else check_policy_loss
    rest = {k: v for k, v in DECLARED[name].items() if k != keyword}
    with pytest.raises(AssertionError) as failure:
        check(name, **rest)
    assert f"- {PROPERTY_OF[keyword]}: on " in str(failure.value)


def test_otb_gives_zero_for_equal_rewards_without_the_zero_tail():
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        report = check_estimator(name, options={"handle_zero_tail": False})
        assert "equal rewards give zero" in report.checked


def test_caller_mistakes_are_errors_not_failures():
    with pytest.raises(TypeError, match=r"has no option\(s\) \['clipp'\]"):
        check_estimator("grpo", options={"clipp": 1.0})
    with pytest.raises(ValueError, match="unknown edge cases"):
        check_estimator("grpo", rejects=("empty_batch",))
    with pytest.raises(TypeError, match="expected a PolicyLoss"):
        check_policy_loss(3)


def test_the_fixtures_come_from_the_pytest_plugin(request):
    # autoloaded through hybridflow's pytest11 entry point: no import, no conftest
    assert request.getfixturevalue("check_estimator") is check_estimator
    assert request.getfixturevalue("check_policy_loss") is check_policy_loss
    assert request.getfixturevalue("check_reward_verifier") is check_reward_verifier
    assert request.config.pluginmanager.get_plugin("hybridflow") is importlib.import_module("hybridflow.testing.plugin")


# --- the kit fails on broken plugins ----------------------------------------------


@pytest.fixture(scope="module")
def here_on_path():
    """This folder on sys.path, so its modules import by name here and in the kit's reward workers (they inherit it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(Path(__file__).parent))
        yield
    for name in ("broken_plugins", "broken_verifiers"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def broken(here_on_path):
    return importlib.import_module("broken_plugins")


@pytest.fixture(scope="module")
def broken_verifiers(here_on_path):
    return importlib.import_module("broken_verifiers")


def failure_of(check, *args, **kwargs):
    with pytest.raises(AssertionError) as failure:
        check(*args, **kwargs)
    return str(failure.value)


def estimator(fn):
    return AdvantageEstimator(name="broken", fn=fn, needs_groups=True)


def test_an_estimator_leaking_onto_masked_tokens_fails(broken):
    message = failure_of(check_estimator, estimator(broken.leaky_advantage))
    # the base case has 78 tokens (13 rows x 6), of which the masked ones are counted
    assert "- zero on masked tokens: on a batch of 4 groups (seed 0): " in message
    assert "masked tokens have a non-zero advantage; advantages[" in message
    assert "row order" not in message and "equal rewards" not in message


def test_an_estimator_depending_on_row_order_fails(broken):
    message = failure_of(check_estimator, estimator(broken.first_row_baseline_advantage))
    assert message.startswith(
        "estimator 'broken' breaks 1 contract property:\n- row order: on a batch of 4 groups (seed 0), "
    )
    assert "advantages did not follow their rows" in message and "worst at [" in message


def test_an_estimator_without_a_baseline_fails_equal_rewards(broken):
    message = failure_of(check_estimator, estimator(broken.no_baseline_advantage))
    assert "- equal rewards give zero: on groups of equal scores (seed 0): advantages[" in message
    # ...and saying equal rewards need not give zero is what such an estimator must declare
    check_estimator(estimator(broken.no_baseline_advantage), equal_rewards_give_zero=False)


def test_an_estimator_with_nan_on_a_group_of_one_fails(broken):
    message = failure_of(check_estimator, estimator(broken.std_without_epsilon_advantage))
    assert "- edge case group_of_one: on a group of one beside groups of 3 and 2: advantages: " in message
    assert "entries are not finite" in message


def test_an_estimator_changing_its_inputs_fails(broken):
    message = failure_of(check_estimator, estimator(broken.in_place_advantage))
    assert (
        "- outputs: on a batch of 4 groups (seed 0): the estimator changed its input 'token_level_rewards' in place"
        in message
    )


def test_a_false_rejection_declaration_fails():
    message = failure_of(check_estimator, "grpo", rejects=("single_row",))
    assert (
        "- rejects single_row: on a batch of one full-length row: declared to reject it with ValueError, but returned"
        in message
    )


def loss(fn):
    return PolicyLoss(name="broken", fn=fn)


def test_a_loss_with_gradient_through_masked_tokens_fails(broken):
    message = failure_of(check_policy_loss, loss(broken.unmasked_sequence_ratio_loss))
    assert (
        "- no gradient through masked tokens: on a batch of 5 responses (seed 0), token-mean: the gradient" in message
    )
    assert (
        "- masked tokens carry no loss: on a batch of 5 responses (seed 0), with other values at masked positions: "
        in message
    )


def test_a_sign_flipped_loss_fails(broken):
    message = failure_of(check_policy_loss, loss(broken.sign_flipped_loss))
    assert message.startswith(
        "policy loss 'broken' breaks 1 contract property:\n- the gradient at ratio 1 is the policy gradient: "
    )
    assert "the gradient is not that of -A * log_probs" in message


def test_a_loss_with_tensor_metrics_fails(broken):
    message = failure_of(check_policy_loss, loss(broken.tensor_metrics_loss))
    assert "- outputs: on a batch of 5 responses (seed 0): metric 'ppo_kl' = tensor(" in message


def test_a_loss_refusing_rollout_weights_fails(broken):
    message = failure_of(check_policy_loss, loss(broken.no_weights_loss))
    assert (
        "- unit rollout weights change nothing: on a batch of 5 responses (seed 0), rollout_is_weights all 1: "
        "raised TypeError" in message
    )


def verifier(fn):
    return RewardVerifier(name="broken", fn=fn)


def test_a_verifier_returning_nan_fails(broken_verifiers):
    message = failure_of(check_reward_verifier, verifier(broken_verifiers.nan_on_empty), cases=[("42", "42", 1.0)])
    assert message.startswith("reward verifier 'broken' breaks 1 contract property:\n")
    assert (
        "- a finite score or an ordinary exception: on an empty response (vs '42'): "
        "verifier 'broken' returned score nan" in message
    )


def test_a_hanging_verifier_fails(broken_verifiers):
    message = failure_of(
        check_reward_verifier, verifier(broken_verifiers.hangs_on_long), ground_truth="42", timeout_s=1.0
    )
    assert "- returns within 1 s: on a 1 MB response (vs '42'): no result after 1." in message
    assert "its worker was killed" in message


def test_a_nondeterministic_verifier_fails(broken_verifiers):
    message = failure_of(check_reward_verifier, verifier(broken_verifiers.sampled_score), ground_truth="42")
    assert "- deterministic: on an empty response (vs '42'): gave score {'score': 0." in message


def test_a_verifier_ending_its_process_fails(broken_verifiers):
    message = failure_of(check_reward_verifier, verifier(broken_verifiers.exits_on_non_ascii), ground_truth="42")
    assert (
        "- a finite score or an ordinary exception: on a non-ASCII response (vs '42'): SystemExit: cannot score"
        in message
    )


def test_a_verifier_giving_the_wrong_score_fails(broken_verifiers):
    cases = [
        VerifierCase(" 42 ", "42", 1.0),
        ("41", "42", 0.5),
    ]  # the second expects partial credit exact_match never gives
    message = failure_of(check_reward_verifier, verifier(broken_verifiers.exact_match), cases=cases)
    assert message.endswith("- expected scores: on case 1 ('41' vs '42'): scored 0.0, expected 0.5")


def test_a_closure_verifier_fails():
    def closure(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    message = failure_of(check_reward_verifier, verifier(closure))
    assert message.startswith("reward verifier 'broken': its function cannot be sent to a reward worker (")
    assert "must be a module-level function of an importable module" in message


def test_an_exception_on_odd_text_is_allowed_unless_declared_otherwise(broken_verifiers):
    report = check_reward_verifier(verifier(broken_verifiers.raises_on_empty), cases=[("42", "42", 1.0)])
    assert report.not_expected == ("odd responses scored without raising (odd_responses_may_raise=True)",)
    message = failure_of(
        check_reward_verifier,
        verifier(broken_verifiers.raises_on_empty),
        cases=[("42", "42", 1.0)],
        odd_responses_may_raise=False,
    )
    assert message.endswith(
        "- odd responses scored without raising: on an empty response (vs '42'): raised ValueError: empty response; "
        "odd text must score (0), not raise"
    )


@pytest.mark.parametrize(
    "name,cases",
    [
        ("arithmetic", [("7 because", "7", 1.0), ("x7", "7", 0.0)]),
        ("gsm8k", [("so #### 42", "42", 1.0), ("#### 41", "42", 0.0)]),
        ("math", [("the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0), ("\\boxed{3}", "2", 0.0)]),
    ],
)
def test_builtin_verifiers_keep_the_contract(name, cases):
    report = check_reward_verifier(name, cases=cases)
    assert report.checked == (
        "returns within 10 s",
        "a finite score or an ordinary exception",
        "deterministic",
        "expected scores",
    )
