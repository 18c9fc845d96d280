#!/usr/bin/env bash
# The same benchmark on an earlier commit and on the working tree, taking turns on this machine (a change's
# before and after, side by side, as docs/benchmarks.md asks):
#
#   bash bench/ab_commit.sh COMMIT ROUNDS bench/bench_vllm.py step --repeats 1 --steps 10 --response-length 64
#
# The earlier commit is checked out in a temporary git worktree and imported through a PYTHONPATH shim
# (<shim>/hybridflow -> the worktree), which Python's path finder consults before the editable install; the
# runs' own subprocesses and Ray workers inherit it. The two take turns, the order swapped every round (odd rounds
# run the earlier commit first, even rounds the working tree): on this machine the second of two back-to-back
# runs is a few percent slower, which a fixed order charges to one side (measured, docs/benchmarks.md, issue 48).
# Give an even number of rounds. PYTHON names the interpreter (default .venv/bin/python; the TRL comparisons
# need PYTHON=.venv-bench/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$1 rounds=$2 py=${PYTHON:-.venv/bin/python}
shift 2
scratch=$(mktemp -d)
trap 'git worktree remove --force "$scratch/tree" >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
git worktree add --detach -q "$scratch/tree" "$commit"
mkdir "$scratch/shim" && ln -s "$scratch/tree" "$scratch/shim/hybridflow"
earlier() {
  echo "== $commit, round $round"
  PYTHONPATH="$scratch/shim" "$py" "$scratch/tree/$1" "${@:2}"
}
working() {
  echo "== working tree, round $round"
  "$py" "$@"
}
for round in $(seq 1 "$rounds"); do
  if ((round % 2)); then earlier "$@"; working "$@"; else working "$@"; earlier "$@"; fi
done
