"""The advantage-estimator contract: what every estimator must do, whatever its formula.

:func:`check_estimator` feeds the estimator's function the batches of
:mod:`~hybridflow.testing.estimator_cases` (every input it declares in
``needs``) and checks, each property on its own:

1. **outputs**: ``(advantages, returns)``, both (B, T), floating point and
   finite; the inputs are left as they were.
2. **zero on masked tokens**: advantages are exactly 0 wherever
   ``response_mask`` is 0, on every case including the edge cases.
3. **row order**: shuffling the rows within each group, reordering the
   groups, shuffling the whole batch (groups interleaved, as after a
   length-balancing reorder) and renaming the uids (so the group ids
   change) move each row's advantages and returns with it and change
   nothing else (to 1e-5: batch statistics may sum in another order).
4. **equal rewards give zero**: groups of two or more whose responses all
   score the same get zero advantage at every valid token (to 1e-5).
5. **edge cases** (finite outputs, zero on masked tokens): a group of one
   next to larger groups (``"group_of_one"``); rows and a whole group with
   no valid token (``"all_masked_rows"``); a batch of one row
   (``"single_row"``).

Not every formula implies every property; the caller says which do not:

- ``zero_on_masked=False`` for an estimator that leaves values on masked
  tokens for the loss to mask (``gae`` whitens them, as veRL does).
- ``equal_rewards_give_zero``: default True exactly when the estimator
  declares ``GROUP_IDS`` (it compares the responses of one prompt, and
  among equal responses none is better); False for one that also uses
  something a group's equal scores do not cancel (a critic, a per-token
  baseline with a zero tail, batch-wide returns).
- ``rejects``: edge cases the estimator documents as invalid input; the
  check then requires it to raise ``ValueError`` on them (``grpo_passk``
  needs two responses per prompt).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from hybridflow.plugins import AdvantageEstimator, get_estimator
from hybridflow.testing.contract import (
    ContractReport,
    call,
    checked_options,
    mismatch,
    not_finite,
    resolve,
    run_properties,
)
from hybridflow.testing.estimator_cases import EstimatorCase, make_case

EDGE_CASES = ("group_of_one", "all_masked_rows", "single_row")
"""Names of the edge cases, for ``rejects``."""
ATOL = 1e-5
"""Tolerance of "unchanged" and "zero" where float sums may run in another order."""

Outputs = tuple[torch.Tensor, torch.Tensor]


def check_estimator(
    estimator: AdvantageEstimator | str,
    *,
    options: Mapping[str, Any] | None = None,
    zero_on_masked: bool = True,
    equal_rewards_give_zero: bool | None = None,
    rejects: Collection[str] = (),
    seed: int = 0,
) -> ContractReport:
    """Check the estimator contract (module docstring) on ``estimator``, a record or a registered name.

    ``options`` are passed to its function (an option it does not have is a
    ``TypeError``, as in the adapter). Raises one ``AssertionError`` listing
    every broken property, each with its input and numbers; returns a
    :class:`~hybridflow.testing.contract.ContractReport` when all hold.
    """
    entry = resolve(estimator, AdvantageEstimator, get_estimator)
    options = checked_options(entry, options)
    unknown = sorted(set(rejects) - set(EDGE_CASES))
    if unknown:
        raise ValueError(f"rejects names unknown edge cases {unknown}; the edge cases are {list(EDGE_CASES)}")
    if equal_rewards_give_zero is None:
        equal_rewards_give_zero = entry.needs_groups

    def run(case: EstimatorCase) -> Outputs:
        return call(case.label, entry.fn, **case.inputs(entry), **options)

    base = make_case(entry, [4, 3, 2, 4], label=f"a batch of 4 groups (seed {seed})", seed=seed)
    properties: list[tuple[str, Callable[[], None]]] = [("outputs", lambda: _outputs(entry, options, base))]
    not_expected = {}
    if zero_on_masked:
        properties.append(("zero on masked tokens", lambda: _zero_on_masked(base, run(base))))
    else:
        not_expected["zero on masked tokens"] = "zero_on_masked=False"
    properties.append(("row order", lambda: _row_order(base, run, seed)))
    if equal_rewards_give_zero:
        equal = make_case(entry, [4, 3, 2], label=f"groups of equal scores (seed {seed})", seed=seed, equal_scores=True)
        properties.append(("equal rewards give zero", lambda: _equal_rewards(equal, run(equal))))
    else:
        not_expected["equal rewards give zero"] = "equal_rewards_give_zero=False"
    for name, case in _edge_cases(entry, seed).items():
        if name in rejects:
            properties.append((f"rejects {name}", lambda case=case: _rejects(entry, options, case)))
        else:
            properties.append((f"edge case {name}", lambda case=case: _edge(case, run(case), zero_on_masked)))
    return run_properties(f"estimator {entry.name!r}", properties, not_expected)


def _edge_cases(entry: AdvantageEstimator, seed: int) -> dict[str, EstimatorCase]:
    return {
        "group_of_one": make_case(entry, [3, 1, 2], label="a group of one beside groups of 3 and 2", seed=seed),
        "all_masked_rows": make_case(
            entry,
            [3, 3, 2],
            label="rows 1, 6 and 7 (all of the last group) fully masked",
            seed=seed,
            empty_rows=(1, 6, 7),
        ),
        "single_row": make_case(entry, [1], label="a batch of one full-length row", seed=seed, lengths=[6]),
    }


def _outputs(entry: AdvantageEstimator, options: dict[str, Any], case: EstimatorCase) -> None:
    inputs = case.inputs(entry)
    before = {k: v.clone() for k, v in inputs.items()}
    out = call(case.label, entry.fn, **inputs, **options)
    _check_pair(case, out)
    for key, value in before.items():
        if not torch.equal(inputs[key], value):
            raise AssertionError(f"on {case.label}: the estimator changed its input {key!r} in place")


def _check_pair(case: EstimatorCase, out: Any) -> None:
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        raise AssertionError(
            f"on {case.label}: expected a tuple (advantages, returns) of tensors, got {type(out).__name__}"
        )
    for label, tensor in zip(("advantages", "returns"), out):
        if tuple(tensor.shape) != tuple(case.mask.shape):
            raise AssertionError(
                f"on {case.label}: {label} has shape {tuple(tensor.shape)}, expected {tuple(case.mask.shape)}"
            )
        if not tensor.is_floating_point():
            raise AssertionError(f"on {case.label}: {label} has dtype {tensor.dtype}, expected floating point")
        problem = not_finite(tensor)
        if problem:
            raise AssertionError(f"on {case.label}: {label}: {problem}")


def _zero_on_masked(case: EstimatorCase, out: Outputs) -> None:
    advantages = out[0]
    leaked = (case.mask == 0) & (advantages != 0)
    if leaked.any():
        at = [int(i) for i in leaked.nonzero()[0]]
        raise AssertionError(
            f"on {case.label}: {int(leaked.sum())} of {int((case.mask == 0).sum())} masked tokens have a non-zero "
            f"advantage; advantages{at} = {float(advantages[tuple(at)]):.6g} where response_mask is 0"
        )


def _row_order(case: EstimatorCase, run: Callable[[EstimatorCase], Outputs], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 1)
    base = run(case)
    for rows, label in _orders(case, gen):
        moved = case.take(rows, f"{case.label}, {label}")
        _same(moved, run(moved), tuple(t[rows] for t in base))
    renamed = case.renamed(f"{case.label}, uids renamed (group ids reversed)")
    _same(renamed, run(renamed), base)


def _orders(case: EstimatorCase, gen: torch.Generator) -> list[tuple[torch.Tensor, str]]:
    """Row orders: within each group shuffled; groups reordered, each kept together; the whole batch shuffled."""
    groups: dict[str, list[int]] = {}
    for row, uid in enumerate(case.uids.tolist()):
        groups.setdefault(uid, []).append(row)
    members = list(groups.values())
    within = torch.arange(len(case.uids))
    for rows in members:
        within[rows] = torch.tensor(rows)[torch.randperm(len(rows), generator=gen)]
    order = torch.randperm(len(members), generator=gen)
    reordered = torch.tensor([row for g in order.tolist() for row in members[g]])
    return [
        (within, "rows shuffled within each group"),
        (reordered, f"groups reordered to {order.tolist()}"),
        (torch.randperm(len(case.uids), generator=gen), "all rows shuffled (groups interleaved)"),
    ]


def _same(case: EstimatorCase, out: Outputs, expected: Outputs) -> None:
    _check_pair(case, out)
    for label, got, want in zip(("advantages", "returns"), out, expected):
        problem = mismatch(got, want, atol=ATOL, rtol=ATOL)
        if problem:
            raise AssertionError(f"on {case.label}: {label} did not follow their rows: {problem}")


def _equal_rewards(case: EstimatorCase, out: Outputs) -> None:
    _check_pair(case, out)
    valid = case.mask > 0
    advantages = out[0] * valid
    worst = int(advantages.abs().argmax())
    row, col = divmod(worst, advantages.shape[1])
    if advantages.abs().max() > ATOL:
        raise AssertionError(
            f"on {case.label}: advantages[{row}, {col}] = {float(advantages[row, col]):.6g} "
            f"(|A| > {ATOL:g}) for a response "
            f"whose group all scored {float(case.rewards[row].sum()):g}"
        )


def _edge(case: EstimatorCase, out: Outputs, zero_on_masked: bool) -> None:
    _check_pair(case, out)
    if zero_on_masked:
        _zero_on_masked(case, out)


def _rejects(entry: AdvantageEstimator, options: dict[str, Any], case: EstimatorCase) -> None:
    try:
        entry.fn(**case.inputs(entry), **options)
    except ValueError:
        return
    except Exception as exc:
        raise AssertionError(
            f"on {case.label}: declared to reject it with ValueError, raised {type(exc).__name__}: {exc}"
        ) from exc
    raise AssertionError(f"on {case.label}: declared to reject it with ValueError, but returned")
