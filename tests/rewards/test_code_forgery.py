"""Forged passes against the ``code`` verifier: every attempt scores 0, honest solutions to the same tests score 1.

Each attack was first written to beat the harness the verifier had before the
verdict moved out of the sandbox (the solution ran in the interpreter of a
harness that held a pass token and the test list, and printed its verdict on
stdout); docs/reliability.md records which ones scored 1.0 against it. Some
also try the present design (the result channel at fd 3, the harness's
``steps``). ``Attack.kind`` groups them as the table there does.
"""

import json
import math
from dataclasses import dataclass

import pytest

from hybridflow.rewards.code import code_score
from hybridflow.rewards.code_asserts import decode, judge, plan_asserts

pytestmark = pytest.mark.timeout(120)

LIMITS = {"timeout_s": 4.0, "cpu_s": 2, "memory_mb": 256}

TASKS = {
    "add": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"],
    "rev": ["assert rev('abc') == 'cba'", "assert rev('') == ''"],
    "desc": ["assert desc([3, 1, 2]) == [3, 2, 1]", "assert desc([]) == []"],
    "area": ["assert abs(area(2.0) - 12.566) < 1e-3", "assert abs(area(1.0) - 3.1416) < 1e-4"],
    "isclose": [
        "import math",
        "assert math.isclose(area(1.0), 3.1416, rel_tol=1e-4)",
        "assert math.isclose(area(2.0), 12.566, rel_tol=1e-4)",
    ],
    "prime": ["assert is_prime(7)", "assert not is_prime(8)", "assert is_prime(2) is True"],
}
HONEST = {
    "add": "def add(a, b):\n    return a + b\n",
    "rev": "def rev(s):\n    return s[::-1]\n",
    "desc": "def desc(xs):\n    return sorted(xs, reverse=True)\n",
    "area": "import math\ndef area(r):\n    return math.pi * r * r\n",
    "isclose": "import math\ndef area(r):\n    return math.pi * r * r\n",
    "prime": "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
}

# Looks the expected values up in any text holding the tests ("assert add(1, 2) == 3")
# and answers from them, never solving the task.
_ANSWER_FROM_TESTS = """
import ast, re
_answers = {}
def _learn(text):
    for m in re.finditer(r"assert (\\w+)\\(([-0-9, ]*)\\) == (-?[0-9]+)", text):
        _answers[(m[1], ast.literal_eval("(" + m[2] + ",)"))] = int(m[3])
def add(*args):
    return _answers[("add", args)]
"""

_READ_CWD = (
    _ANSWER_FROM_TESTS
    + """
import os
for _name in os.listdir("."):
    with open(_name, encoding="utf-8", errors="replace") as _f:
        _learn(_f.read())
"""
)

_READ_OWN_MEMORY = (
    _ANSWER_FROM_TESTS
    + """
with open("/proc/self/maps") as _maps:
    _regions = [line.split()[0].split("-") for line in _maps if line.split()[1].startswith("r")]
with open("/proc/self/mem", "rb", buffering=0) as _mem:
    for _lo, _hi in _regions:
        for _at in range(int(_lo, 16), int(_hi, 16), 1 << 20):
            try:
                _mem.seek(_at)
                _learn(_mem.read(min(1 << 20, int(_hi, 16) - _at) + 256).decode("latin-1"))
            except (OSError, OverflowError, ValueError):
                break
"""
)

# init (pid 1 of the sandbox) is a fork of the launcher: its argv names the launcher's
# file, so the trainer's checkout; its tests and data hold the expected values.
_READ_TRAINER_FILES = (
    _ANSWER_FROM_TESTS
    + """
import os
with open("/proc/1/cmdline", "rb") as _f:
    _launcher = next(arg.decode() for arg in _f.read().split(b"\\0") if arg.endswith(b"sandbox_launcher.py"))
for _dir, _subdirs, _names in os.walk(os.path.dirname(os.path.dirname(_launcher))):
    _subdirs[:] = [d for d in _subdirs if not d.startswith(".")]
    for _name in _names:
        if _name.endswith((".py", ".json", ".jsonl")):
            with open(os.path.join(_dir, _name), encoding="utf-8", errors="replace") as _f:
                _learn(_f.read())
"""
)

# The old harness kept its pass token and its tests as globals of __main__:
# print its "all passed" line, then leave before it prints its own.
_FORGE_VERDICT = """
def _forge(harness):
    os.write(1, ("\\n%s %d\\n" % (harness["_token"], len(harness["_tests"]))).encode())
    os._exit(0)
"""

_FRAME_WALK = (
    "import os, sys\n"
    + _FORGE_VERDICT
    + """
if "_token" in sys._getframe(1).f_globals:
    _forge(sys._getframe(1).f_globals)
frame = sys._getframe(1)  # a harness without a token: empty its list of steps, so nothing is checked
while frame is not None:
    if isinstance(frame.f_locals.get("steps"), list):
        frame.f_locals["steps"].clear()
    frame = frame.f_back
"""
)

_ALWAYS_EQUAL = """
class _Equal:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
def add(a, b):
    return _Equal()
"""

_SUBCLASS_EQUAL = """
class _Sub({base}):
    def __eq__(self, other):
        return True
    __hash__ = {base}.__hash__
    def __repr__(self):
        return repr({forged!r})
def {name}(*args):
    return _Sub({value!r})
"""

_REWRITE_STDOUT = """
import re, sys
class _Rewriter:
    def __init__(self, stream):
        self.stream = stream
    def write(self, text):
        caller = sys._getframe(1).f_globals
        if "_tests" in caller:
            text = re.sub(r"(\\w{32}) \\d+", lambda m: m[1] + " " + str(len(caller["_tests"])), text)
        return self.stream.write(text)
    def __getattr__(self, name):
        return getattr(self.stream, name)
sys.stdout = _Rewriter(sys.stdout)
def add(a, b):
    return a - b
"""

_REWRITE_SERIALIZERS = """
import builtins, json, marshal, os
_true = ["value", ["bool", True]]
def _forged_report(outcomes):  # whatever the harness reports: every call returned True
    return json.JSONEncoder().encode([outcomes[0]] + [_true for _ in outcomes[1:]])
json._default_encoder.encode = _forged_report
marshal.dumps = lambda value, *a: b"T"
builtins.repr = lambda value: "True"
builtins.print = lambda *a, **k: None
_write = os.write
os.write = lambda fd, data: _write(fd, data.replace(b"false", b"true"))
def is_prime(n):
    return False
"""

_SETTRACE = """
import sys
def _tracer(frame, event, arg):
    if "_tests" in frame.f_globals:
        frame.f_globals["_passed"] = len(frame.f_globals["_tests"])
    if event == "return" and isinstance(arg, list) and arg and arg[0] in ("raised", "value"):
        arg[:] = ["value", ["bool", True]]  # a harness that reports values: every call said True
    return _tracer
sys._getframe(1).f_trace = _tracer
sys.settrace(_tracer)
def add(a, b):
    return a - b
"""

_ATEXIT = (
    "import atexit, os, sys\n"
    + _FORGE_VERDICT
    + """
atexit.register(lambda: _forge(vars(sys.modules["__main__"])))
def add(a, b):
    return a - b
"""
)


def _on_every_fd(payload: str) -> str:
    """Write ``payload`` (an expression) to every descriptor that takes it, then leave."""
    return (
        f"import json, os, sys\n_payload = {payload}\n"
        "for _fd in range(1, 64):\n    try:\n        os.write(_fd, _payload)\n    except OSError:\n        pass\n"
        "os._exit(0)\n"
    )


@dataclass(frozen=True)
class Attack:
    kind: str
    task: str
    code: str


ATTACKS = {
    "frame walk to the harness": Attack("reads the harness", "add", _FRAME_WALK),
    "gc.get_objects finds the harness globals": Attack(
        "reads the harness",
        "add",
        "import gc, os\n"
        + _FORGE_VERDICT
        + "_forge(next(o for o in gc.get_objects() if isinstance(o, dict) and '_token' in o))\n",
    ),
    "globals of __main__": Attack(
        "reads the harness", "add", "import os, sys\n" + _FORGE_VERDICT + "_forge(vars(sys.modules['__main__']))\n"
    ),
    "answers from files in cwd": Attack("reads the harness", "add", _READ_CWD),
    "answers from /proc/self/mem": Attack("reads the harness", "add", _READ_OWN_MEMORY),
    "answers from the trainer's checkout": Attack("reads files outside", "add", _READ_TRAINER_FILES),
    "builtins.exec does nothing": Attack(
        "rebinds builtins", "add", "import builtins\nbuiltins.exec = lambda *args, **kwargs: None\n"
    ),
    "compile turns tests into pass": Attack(
        "rebinds builtins",
        "add",
        "import builtins\n_compile = builtins.compile\n"
        "builtins.compile = lambda src, name, mode, *a, **k: "
        "_compile('None' if mode == 'eval' else 'pass', name, mode)\n",
    ),
    "str reports every test passed": Attack(
        "rebinds builtins",
        "add",
        "import builtins, sys\n_str = builtins.str\n"
        "def _forged_str(x=''):\n"
        "    caller = sys._getframe(1).f_globals\n"
        "    return _str(len(caller['_tests'])) if '_tests' in caller else _str(x)\n"
        "builtins.str = _forged_str\n"
        "def add(a, b):\n    return a - b\n",
    ),
    "sys.stdout.write rewrites the verdict": Attack("rebinds builtins", "add", _REWRITE_STDOUT),
    "__import__ hands the tests a fake math": Attack(
        "rebinds builtins",
        "isclose",
        "import builtins, types\n_import = builtins.__import__\n"
        "def _fake_import(name, *args, **kwargs):\n"
        "    if name == 'math':\n        return types.SimpleNamespace(isclose=lambda *a, **k: True, pi=3.0)\n"
        "    return _import(name, *args, **kwargs)\n"
        "builtins.__import__ = _fake_import\n"
        "def area(r):\n    return 0.0\n",
    ),
    "json, marshal, repr, print, os.write rewritten": Attack("rebinds builtins", "prime", _REWRITE_SERIALIZERS),
    "__eq__ always True": Attack("always-equal result", "add", _ALWAYS_EQUAL),
    "int subclass equal to everything": Attack(
        "always-equal result", "add", _SUBCLASS_EQUAL.format(base="int", forged=3, name="add", value=0)
    ),
    "str subclass equal to everything": Attack(
        "always-equal result", "rev", _SUBCLASS_EQUAL.format(base="str", forged="cba", name="rev", value="wrong")
    ),
    "list subclass equal to everything": Attack(
        "always-equal result", "desc", _SUBCLASS_EQUAL.format(base="list", forged=[3, 2, 1], name="desc", value=[])
    ),
    "always-close number": Attack(
        "always-equal result",
        "area",
        "class _Close(float):\n    def __sub__(self, other):\n        return 0.0\n"
        "def area(r):\n    return _Close(1.0)\n",
    ),
    "atexit prints the verdict": Attack("early exit", "add", _ATEXIT),
    "sys.exit(0)": Attack("early exit", "add", "import sys\nsys.exit(0)\n"),
    "raise SystemExit in the call": Attack("early exit", "add", "def add(a, b):\n    raise SystemExit(0)\n"),
    "os._exit(0)": Attack("early exit", "add", "import os\nos._exit(0)\n"),
    "kill the parent": Attack("early exit", "add", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"),
    "settrace rewrites the harness's results": Attack("tampers with the harness", "add", _SETTRACE),
    "forged report on every fd": Attack(
        "writes the result channel",
        "add",
        _on_every_fd(
            "(json.dumps([['ok', None]] + [['value', ['bool', True]]] * 3) + '\\n%s %d\\n' % ("
            "vars(sys.modules['__main__']).get('_token', ''), "
            "len(vars(sys.modules['__main__']).get('_tests', [])))).encode()"
        ),
    ),
    "report of the solution alone": Attack("writes the result channel", "add", _on_every_fd("b'[[\"ok\", null]]'")),
    "parser bomb in the channel": Attack("writes the result channel", "add", _on_every_fd("b'[' * 200000")),
    "wrong answer flooding stdout and stderr": Attack(
        "output flood",
        "add",
        "import sys\nsys.stdout.write('x' * (3 << 20))\nsys.stderr.write('y' * (3 << 20))\n"
        "def add(a, b):\n    return a - b\n",
    ),
}

_IO_SUM = json.dumps({"inputs": ["2 3\n"], "outputs": ["5\n"]})
_FLOOD = "import sys\nsys.stdout.write('x' * (3 << 20))\nsys.stderr.write('y' * (3 << 20))\n"
OUTPUT_FLOODS = {  # name -> (program, ground truth, its right score)
    "correct, 3 MiB on stdout and on stderr (asserts)": (
        _FLOOD + HONEST["add"],
        json.dumps({"asserts": TASKS["add"]}),
        1.0,
    ),
    "correct, 7 MiB printed per call (asserts)": (
        "def add(a, b):\n    print('.' * (7 << 20))\n    return a + b\n",
        json.dumps({"asserts": TASKS["add"]}),
        1.0,
    ),
    "correct, 20 MiB on stderr (io)": (
        "import sys\na, b = map(int, input().split())\nsys.stderr.write('y' * (20 << 20))\nprint(a + b)\n",
        _IO_SUM,
        1.0,
    ),
    "wrong, 3 MiB more on stdout (io)": ("print(5)\nprint('x' * (3 << 20))\n", _IO_SUM, 0.0),
}


def asserts(task):
    return json.dumps({"asserts": TASKS[task]})


def score(code, ground_truth):
    return code_score("code", f"```python\n{code}\n```", ground_truth, None, **LIMITS)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_honest_solutions_score_one(task):
    assert score(HONEST[task], asserts(task)) == 1.0


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_forgery_scores_zero(name):
    attack = ATTACKS[name]
    assert score(attack.code, asserts(attack.task)) == 0.0


@pytest.mark.parametrize("name", sorted(OUTPUT_FLOODS))
def test_output_floods(name):
    """Before, the verdict line was lost past 1 MiB of stdout, and stderr past 16 MiB killed the program."""
    code, ground_truth, right = OUTPUT_FLOODS[name]
    assert score(code, ground_truth) == right


def test_values_compare_as_python_compares_them():
    """Subclasses of built-in types are read as their base type: a namedtuple, a Counter, an IntEnum pass."""
    code = (
        "import collections, enum\n"
        "Point = collections.namedtuple('Point', 'x y')\n"
        "class Color(enum.IntEnum):\n    RED = 1\n"
        "def f():\n    return Point(1, 2), collections.Counter('aab'), Color.RED, bytearray(b'hi'), 2 ** 100, -0.5j\n"
    )
    tests = json.dumps(
        {
            "asserts": [
                "assert f() == ((1, 2), {'a': 2, 'b': 1}, 1, b'hi', 1267650600228229401496703205376, -0.5j)",
                "assert f()[0] in [(1, 2), (2, 1)]",
                "assert 0 < f()[2] <= 1",
                "assert f()[1]",
            ]
        }
    )
    assert score(code, tests) == 1.0
    assert score(code.replace("'aab'", "'abb'"), tests) == 0.0


def test_the_expected_values_never_enter_the_sandbox():
    plan = plan_asserts(
        TASKS["add"] + TASKS["area"] + TASKS["isclose"] + ["assert 12345 == add(1, 2) and 0 < add(0, 0) < 678"]
    )
    sent = json.dumps(plan.steps)
    assert plan.steps == [
        ["eval", "add(1, 2)"],
        ["eval", "add(-1, 1)"],
        ["eval", "add(10, 5)"],
        ["eval", "area(2.0)"],
        ["eval", "area(1.0)"],
        ["exec", "import math"],
        ["eval", "area(1.0)"],
        ["eval", "area(2.0)"],
        ["eval", "add(1, 2)"],
        ["eval", "add(0, 0)"],
    ]
    for expected in ("15", "12.566", "3.1416", "1e-3", "1e-4", "12345", "678"):
        assert expected not in sent


@pytest.mark.parametrize(
    "test, why",
    [
        ("assert add(1, 2) == add(2, 1)", "exactly one computed side"),
        ("assert (add(1, 2) == 3) == True", "decided inside the sandbox"),
        ("assert all(x == 1 for x in f())", "decided inside the sandbox"),
        ("assert f(1) or f(2)", "decided inside the sandbox"),
        ("assert [x for x in f() if x]", "decided inside the sandbox"),
        ("assert not (f(1) == 2 and f(2) == 3)", "'not' over 'and'"),
        ("assert math.isclose(f(1), g(1))", "isclose needs one computed argument"),
        ("for i in range(3):\n    assert f(i) == i", "a For statement"),
        ("def check():\n    return f(1) == 2", "a FunctionDef statement"),
        ("ok = f(1) == 2", "decided inside the sandbox"),
        ("assert True", "asserts a literal"),
    ],
)
def test_asserts_the_sandbox_would_decide_are_refused(test, why):
    with pytest.raises(ValueError, match=why):
        plan_asserts([test])


def test_judge_reads_only_well_formed_reports():
    plan = plan_asserts(["assert f(1) == [1, (2, 3)]"])
    good = [["ok", None], ["value", ["list", [["int", "0x1"], ["tuple", [["int", "0x2"], ["int", "0x3"]]]]]]]
    assert judge(plan, json.dumps(good).encode()).passed
    for broken in (
        [["ok", None]],
        [["ok", None], ["ok", None]],
        [["ok", None], ["value", ["list", "0x1"]]],
        [["ok", None], ["value", ["int", "0x1"]], ["value", ["int", "0x1"]]],
        [["raised", "X"]],
        {"ok": 1},
    ):
        assert not judge(plan, json.dumps(broken).encode()).passed, broken
    assert not judge(plan, b"[" * 100_000).passed
    assert decode(["dict", [[["frozenset", [["str", "a"]]], ["float", "inf"]]]]) == {frozenset("a"): float("inf")}


@pytest.mark.parametrize("kind", ["set", "frozenset", "dict"])
def test_a_report_of_elements_that_hash_alike_is_judged_in_linear_time(kind):
    """A forged 1 MiB report of ints that all hash to 0 (multiples of 2**61 - 1) took 5.9 s to judge: building
    the set probed every earlier element. It is refused as malformed, fast; a real set of as many ints is not."""
    import gc
    import time

    plan = plan_asserts(["assert f() == {1}"])

    def report(values):
        items = [["int", hex(v)] for v in values]
        tree = [kind, [[item, ["none"]] for item in items]] if kind == "dict" else [kind, items]
        return json.dumps([["ok", None], ["value", tree]]).encode()

    forged = report(k * (2**61 - 1) for k in range(1, 40_000))
    assert len(forged) > 1 << 20  # the size of the measured forgery
    honest_report = report(range(40_000))  # as many elements, distinct hashes: decoded, then compared

    def cpu_seconds(payload):
        # best of three with the collector off: a full collection of a long-lived xdist worker's heap landing
        # inside one call cost 0.6 s in CI, ten times the judging it interrupted
        best = math.inf
        gc.disable()
        try:
            for _ in range(3):
                start = time.process_time()  # this process's CPU time: the suite's other workers count less
                verdict = judge(plan, payload)
                best = min(best, time.process_time() - start)
        finally:
            gc.enable()
        return verdict, best

    honest, honest_s = cpu_seconds(honest_report)
    verdict, forged_s = cpu_seconds(forged)
    assert not verdict.passed and not honest.passed and honest.reason == "'assert f() == {1}' does not hold"
    # linear: about as dear as the honest report of its size (0.05 s each alone); quadratic, the forgery took
    # 9.1 s, 180 times the honest one (issue 30 asks for under 0.5 s)
    assert forged_s < 0.5, (forged_s, honest_s)
    assert decode(json.loads(report([1]))[1][1]) == (
        {1: None} if kind == "dict" else {"set": {1}, "frozenset": frozenset({1})}[kind]
    )
    assert decode(["set", [["int", hex(-1)], ["int", hex(-2)]]]) == {-1, -2}  # hash(-1) == hash(-2): a coincidence


def report_of(*values):
    """A well-formed report: the solution ran, then each step's value tree."""
    return json.dumps([["ok", None], *(["value", value] for value in values)]).encode()


@pytest.mark.parametrize("kind", ["list", "tuple", "set", "frozenset", "dict value", "dict key"])
def test_a_report_nested_deeper_than_200_is_refused_at_every_kind_of_container(kind):
    """Each container counts one level (a dict's keys and values too): 200 levels decode, 201 are malformed."""

    def tree(levels):
        inner = ["int", "0x7"]
        for _ in range(levels - 1):  # tuples inside, hashable for a set's element or a dict's key
            inner = ["tuple", [inner]]
        if kind == "dict value":
            return ["dict", [[["int", "0x0"], inner]]]
        if kind == "dict key":
            return ["dict", [[inner, ["none"]]]]
        return [kind, [inner]]

    assert decode(tree(200)) is not None
    with pytest.raises(ValueError, match="not a value tree"):
        decode(tree(201))


def test_a_distance_with_the_literal_first_is_computed_here():
    plan = plan_asserts(["assert abs(3.0 - f()) < 0.1"])
    assert plan.steps == [["eval", "f()"]]
    for value, holds in ((3.05, True), (2.95, True), (3.2, False), (-3.0, False)):
        assert judge(plan, report_of(["float", repr(value)])).passed is holds, value


def test_isclose_takes_both_tolerances_and_refuses_any_other_option():
    plan = plan_asserts(["assert math.isclose(f(), 1.0, rel_tol=1e-9, abs_tol=1e-3)"])
    assert judge(plan, report_of(["float", "1.0005"])).passed  # within abs_tol, far outside rel_tol
    assert not judge(plan, report_of(["float", "1.002"])).passed
    with pytest.raises(ValueError, match="literal tolerances"):
        plan_asserts(["assert math.isclose(f(), 1.0, tol=0.1)"])


def test_a_report_of_the_wrong_length_says_how_many_outcomes_for_how_many_steps():
    plan = plan_asserts(["assert f() == 1"])
    verdict = judge(plan, report_of(["int", "0x1"], ["int", "0x1"]))
    assert not verdict.passed and verdict.reason == "the report has 2 outcomes for 1 steps"


@pytest.mark.parametrize(
    "test, call",
    [
        ("assert Area(f() - 1) < 5", "Area(f() - 1)"),  # a function of the solution's, not abs: the sandbox's call
        ("assert abs(f() - g()) < 1", "abs(f() - g())"),  # two computed sides: no literal to keep here
        ("assert abs(f(2) - 1) < 1", "f(2)"),  # the distance form: only the computed side is sent
    ],
)
def test_only_abs_of_a_computed_side_minus_a_literal_is_a_distance(test, call):
    plan = plan_asserts([test])
    assert plan.steps == [["eval", call]]
    assert judge(plan, report_of(["float", "0.5"])).passed


def test_a_boolean_under_any_other_kind_is_malformed():
    assert decode(["bool", True]) is True
    for kind in ("bo", "a", "int"):
        with pytest.raises(ValueError):
            decode([kind, True])


def test_a_setup_step_that_raised_fails_the_solution_even_when_the_checks_hold():
    plan = plan_asserts(["x = f()", "assert x == 1"])
    assert plan.steps == [["exec", "x = f()"], ["eval", "x"]]
    ran = json.dumps([["ok", None], ["ok", None], ["value", ["int", "0x1"]]]).encode()
    assert judge(plan, ran).passed
    raised = json.dumps([["ok", None], ["raised", "NameError"], ["value", ["int", "0x1"]]]).encode()
    verdict = judge(plan, raised)
    assert not verdict.passed and verdict.reason.startswith("'x = f()': ")


def test_a_method_call_is_a_truth_check_and_only_math_isclose_is_isclose():
    assert plan_asserts(["assert f().startswith('a')"]).steps == [["eval", "f().startswith('a')"]]
    assert plan_asserts(["assert cmath.isclose(f(), 1)"]).steps == [["eval", "cmath.isclose(f(), 1)"]]


def test_an_outcome_that_is_not_a_value_pair_fails_the_step_that_produced_it():
    plan = plan_asserts(["assert f() == 1"])
    for outcome in ({"value": ["int", "0x1"]}, 7, "value", ["raised", "ZeroDivisionError"]):
        verdict = judge(plan, json.dumps([["ok", None], outcome]).encode())
        assert not verdict.passed and verdict.reason.startswith("'f()': "), (outcome, verdict)


def test_only_the_complex_kind_reads_a_pair_of_number_strings():
    assert decode(["complex", ["1.5", "-2"]]) == complex(1.5, -2)
    for kind in ("bool", "bytes", "list", "tuple", "set", "frozenset", "dict"):  # before "complex" and after
        with pytest.raises(ValueError):
            decode([kind, ["1", "2"]])


def test_isclose_of_two_literals_is_refused():
    with pytest.raises(ValueError, match="isclose needs one computed argument"):
        plan_asserts(["assert math.isclose(1.0, 1.0)"])


def test_a_report_short_of_the_steps_says_so():
    plan = plan_asserts(["assert f() == 1", "assert g() == 2"])
    verdict = judge(plan, report_of(["int", "0x1"]))
    assert not verdict.passed and verdict.reason == "the report has 1 outcomes for 2 steps"


def test_up_to_32_elements_may_share_a_hash():
    same_hash = [["int", hex(k * (2**61 - 1))] for k in range(1, 34)]  # multiples of 2**61 - 1 all hash to 0
    assert len(decode(["set", same_hash[:32]])) == 32
    with pytest.raises(ValueError, match="hash alike"):
        decode(["set", same_hash])


def test_isclose_with_the_literal_first():
    plan = plan_asserts(["assert math.isclose(3.0, f(), rel_tol=1e-3)"])
    assert plan.steps == [["eval", "f()"]]
    assert judge(plan, report_of(["float", "3.002"])).passed and not judge(plan, report_of(["float", "3.01"])).passed


def test_a_lowercase_function_of_a_difference_is_the_sandboxs_call():
    assert plan_asserts(["assert area(f() - 1) < 5"]).steps == [["eval", "area(f() - 1)"]]


def test_a_report_of_300_steps_is_read_whole():
    plan = plan_asserts(["assert f() == 1"] * 300)
    assert judge(plan, report_of(*[["int", "0x1"]] * 300)).passed


def test_a_dict_of_no_pairs_is_malformed_and_a_failed_start_is_quoted():
    with pytest.raises(ValueError):
        decode(["dict", 5])
    plan = plan_asserts(["assert f() == 1"])
    verdict = judge(plan, json.dumps([["raised", "SyntaxError: x"], ["value", ["int", "0x1"]]]).encode())
    assert verdict.reason == "the solution did not run: ['raised', 'SyntaxError: x']"


def test_frozensets_nested_201_deep_are_refused():
    def tree(levels):
        inner = ["int", "0x7"]
        for _ in range(levels):
            inner = ["frozenset", [inner]]
        return inner

    assert decode(tree(200)) is not None
    with pytest.raises(ValueError, match="not a value tree"):
        decode(tree(201))


def test_dicts_nested_201_deep_in_their_values_are_refused():
    def tree(levels):
        inner = ["int", "0x7"]
        for _ in range(levels):
            inner = ["dict", [[["int", "0x0"], inner]]]
        return inner

    assert decode(tree(200)) is not None
    with pytest.raises(ValueError, match="not a value tree"):
        decode(tree(201))


def test_another_modules_isclose_is_the_sandboxs_call_and_an_empty_tree_is_malformed():
    assert plan_asserts(["assert np.isclose(f(), 1)"]).steps == [["eval", "np.isclose(f(), 1)"]]
    with pytest.raises(ValueError, match="not a value tree"):
        decode([])


@pytest.mark.parametrize("tree", [5, "int", {"k": ["int", "0x1"]}, [5, "0x1"], None])
def test_anything_but_a_list_headed_by_its_kind_is_malformed(tree):
    with pytest.raises(ValueError, match="not a value tree"):
        decode(tree)


@pytest.mark.parametrize("kind", ["bool", "int", "float", "list", "dict", "none"])
def test_only_the_none_kind_may_come_without_data(kind):
    """``["none"]`` is None; an empty tree of any other kind (these sort before "none" and after) is malformed."""
    if kind == "none":
        assert decode(["none"]) is None
    else:
        with pytest.raises(ValueError, match=f"malformed '{kind}'"):
            decode([kind])


def test_a_setup_step_must_report_exactly_ok_none():
    """A setup outcome cut short (``["ok"]``) is not a step that ran, even when every check holds."""
    plan = plan_asserts(["x = f()", "assert x == 1"])
    for outcome in (["ok"], ["ok", None, None], ["ok", 0]):
        report = json.dumps([["ok", None], outcome, ["value", ["int", "0x1"]]]).encode()
        verdict = judge(plan, report)
        assert not verdict.passed and verdict.reason.startswith("'x = f()': "), outcome


def test_abs_is_a_distance_only_with_exactly_one_argument():
    """``abs()`` and ``abs(x - 1, 2)`` are the sandbox's calls (they raise there), not a distance taken here."""
    assert plan_asserts(["assert abs() < 1"]).steps == [["eval", "abs()"]]
    assert plan_asserts(["assert abs(f() - 1, 2) < 1"]).steps == [["eval", "abs(f() - 1, 2)"]]


def test_isclose_with_a_third_positional_argument_is_refused():
    with pytest.raises(ValueError, match="isclose needs one computed argument"):
        plan_asserts(["assert math.isclose(f(), 1.0, 0.5)"])


@pytest.mark.parametrize("test", ["assert 0", "assert ''", "assert None", "assert 1", "assert (1, 2)"])
def test_asserting_any_literal_is_refused_falsy_ones_too(test):
    with pytest.raises(ValueError, match="it asserts a literal"):
        plan_asserts([test])


@pytest.mark.parametrize("start", [["ok"], ["error", None], ["ok", None, None], ["a", None]])
def test_the_solution_ran_only_when_its_start_reports_exactly_ok_none(start):
    plan = plan_asserts(["assert f() == 1"])
    verdict = judge(plan, json.dumps([start, ["value", ["int", "0x1"]]]).encode())
    assert not verdict.passed and verdict.reason.startswith("the solution did not run"), start


@pytest.mark.parametrize("test", ["assert math.ceil(f())", "assert valid(f())", "assert math.isfinite(f())"])
def test_only_isclose_by_that_name_is_split_other_calls_go_whole(test):
    """Names that sort before or after "isclose" are the sandbox's calls, checked for truth here."""
    assert plan_asserts([test]).steps == [["eval", test.removeprefix("assert ")]]


def test_a_complex_or_a_value_of_more_than_one_datum_is_malformed():
    with pytest.raises(ValueError, match="not a value: 'complex'"):
        decode(["complex", ["1", "2", "3"]])
    with pytest.raises(ValueError, match="malformed 'int'"):
        decode(["int", "0x1", "0x2"])
