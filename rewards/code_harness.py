"""The ``code`` verifier's harness, run as ``main.py`` inside the sandbox; standard library only.

It runs ``solution.py``, then the steps the verifier read on stdin (JSON
pairs: ``["exec", statement]`` for a test's setup, ``["eval", expression]``
for a value an assert checks) and writes, once, at the end, to the result
channel (:data:`RESULT_FD`) a JSON list of outcomes: the solution's, then
one per step, each ``[status, payload]``:

* ``["ok", null]``: the solution or a statement ran;
* ``["value", tree]``: the expression's value as built-in data (:func:`encode`);
* ``["raised", name]``: an exception (``SystemExit`` included);
* ``["unplain", name]``: a value that is not built-in data (a foreign object).

It holds nothing secret: the steps are inputs, never expected values (the
verifier keeps those, :mod:`hybridflow.rewards.code_asserts`). The solution
shares this interpreter and can rewrite anything here, this harness
included; whatever it makes it write is judged in the verifier's process
against values it never saw. Capturing ``os.write`` and ``json.dumps``
before the solution runs only spares honest solutions that shadow them.
"""

import json
import os
import sys

RESULT_FD = 3


def encode(value, depth=0):
    """``value`` as a JSON tree of ``[type, data]`` pairs, for built-in types and their subclasses only.

    A subclass is read through its base type (``int.__index__``, ``dict.items``, ...),
    so a namedtuple or a ``Counter`` reports its contents, and an overridden
    ``__eq__`` or ``__repr__`` is never asked. Anything else raises TypeError.
    """
    if depth > 200:
        raise TypeError("nested deeper than 200")
    if value is None:
        return ["none"]
    for base, name, convert in _ENCODERS:
        if isinstance(value, base):
            return [name, convert(value, depth + 1)]
    raise TypeError(type(value).__name__)


def _items(base):
    return lambda value, depth: [encode(item, depth) for item in base.__iter__(value)]


_ENCODERS = (  # bool before int: a bool is an int
    (bool, "bool", lambda value, depth: value is True),
    (int, "int", lambda value, depth: hex(int.__index__(value))),  # hex: no limit on digits
    (float, "float", lambda value, depth: float.__repr__(value)),
    (complex, "complex", lambda value, depth: [float.__repr__(value.real), float.__repr__(value.imag)]),
    (str, "str", lambda value, depth: str.__str__(value)),
    ((bytes, bytearray), "bytes", lambda value, depth: bytes(value).hex()),
    (tuple, "tuple", _items(tuple)),
    (list, "list", _items(list)),
    (frozenset, "frozenset", _items(frozenset)),
    (set, "set", _items(set)),
    (dict, "dict", lambda value, depth: [[encode(k, depth), encode(v, depth)] for k, v in dict.items(value)]),
)


def _name(thing):
    try:
        return str.__str__(type(thing).__name__)
    except BaseException:  # noqa: BLE001 - a hostile metaclass; the name is only a diagnostic
        return "?"


def _run(kind, source, namespace, filename="<test>"):
    try:
        if kind == "exec":
            exec(compile(source, filename, "exec"), namespace)
            return ["ok", None]
        value = eval(compile(source, filename, "eval"), namespace)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the test failed, the report goes on
        return ["raised", _name(exc)]
    try:
        return ["value", encode(value)]
    except BaseException:  # noqa: BLE001 - whatever a foreign object's methods raise
        return ["unplain", _name(value)]


def main():
    write, dumps = os.write, json.dumps  # before the solution can shadow them
    steps = json.loads(sys.stdin.read())
    namespace = {"__name__": "__main__"}
    with open("solution.py", encoding="utf-8") as f:
        solution = f.read()
    outcomes = [_run("exec", solution, namespace, "solution.py")]
    if outcomes[0][0] == "ok":
        outcomes += [_run(kind, source, namespace) for kind, source in steps]
    report = dumps(outcomes).encode()
    while report:
        report = report[write(RESULT_FD, report) :]
    os._exit(0)  # the solution's atexit handlers and threads have nothing left to add


if __name__ == "__main__":
    main()
