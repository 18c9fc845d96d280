"""The ``code`` verifier and its sandbox: good programs pass, hostile ones score 0 and change nothing."""

import ast
import json
import os
import socket
import tempfile
import threading
import time

import pytest

import hybridflow
from hybridflow.rewards.code import code_score, extract_code
from hybridflow.sandbox import memory as sandbox_memory
from hybridflow.sandbox.runner import RESULT_FD, SandboxLimits, run_python

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.serial,
]  # serial: it counts and measures the sandbox users' processes

LIMITS = {"timeout_s": 2.0, "cpu_s": 1, "memory_mb": 256}
SUM_TESTS = json.dumps({"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]})
FOUR = json.dumps({"inputs": [""], "outputs": ["4"]})


def fenced(code):
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


def sandbox_processes():
    """Pids of live processes owned by a sandbox uid (>= 200000)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid >= 200_000:
                pids.append(pid)
        except FileNotFoundError:
            pass
    return pids


@pytest.fixture
def sandbox_tmp(tmp_path, monkeypatch):
    """Sandbox directories go under a fresh folder, so the test can see they were removed."""
    folder = tmp_path / "sandboxes"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_extract_code():
    assert extract_code("a\n```python\nx=1\n```\nb\n```python\nx=2\n```") == "x=2\n"
    assert extract_code("```\nprint(1)\n```") == "print(1)\n"
    assert extract_code("print(3)") == "print(3)"


def test_io_tests_pass_and_fail(sandbox_tmp):
    good = fenced("a, b = map(int, input().split())\nprint(a + b)")
    wrong = fenced("a, b = map(int, input().split())\nprint(a - b)")
    assert code_score("code", good, SUM_TESTS, None, **LIMITS) == 1.0
    assert code_score("code", wrong, SUM_TESTS, None, **LIMITS) == 0.0
    assert list(sandbox_tmp.iterdir()) == []


def test_assert_tests(sandbox_tmp):
    tests = json.dumps({"asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]})
    assert code_score("code", fenced("def add(a, b):\n    return a + b"), tests, None, **LIMITS) == 1.0
    assert code_score("code", fenced("def add(a, b):\n    return a * b"), tests, None, **LIMITS) == 0.0
    # leaving before the asserts run passes nothing
    assert code_score("code", fenced("import sys\nsys.exit(0)"), tests, None, **LIMITS) == 0.0
    assert code_score("code", fenced("import os\nos._exit(0)"), tests, None, **LIMITS) == 0.0
    # printing a report of its own does not help: stdout is not read, the verdict is made outside
    fake = 'print(\'[["ok", null], ["value", ["int", "0x3"]], ["value", ["int", "0x0"]]]\')\nimport os\nos._exit(0)'
    assert code_score("code", fenced(fake), tests, None, **LIMITS) == 0.0


def test_environment_is_scrubbed(monkeypatch, sandbox_tmp):
    monkeypatch.setenv("HYBRIDFLOW_TEST_SECRET", "hunter2")
    steal = fenced("import os\nprint(os.environ.get('HYBRIDFLOW_TEST_SECRET'))")
    assert code_score("code", steal, json.dumps({"inputs": [""], "outputs": ["hunter2"]}), None, **LIMITS) == 0.0
    result = run_python("import os\nprint(sorted(os.environ))")
    assert ast.literal_eval(result.stdout) == [
        "HOME",
        "LANG",
        "PATH",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONHASHSEED",
        "TMPDIR",
    ]


def test_no_network(sandbox_tmp):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        local = fenced(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint(4)")
        outside = fenced("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint(4)")
        assert code_score("code", local, FOUR, None, **LIMITS) == 0.0
        assert code_score("code", outside, FOUR, None, **LIMITS) == 0.0
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever reached the trainer's socket
    finally:
        server.close()


def test_writes_outside_its_directory_fail(tmp_path, sandbox_tmp):
    targets = [
        str(tmp_path / "escaped.txt"),
        os.path.join(os.path.dirname(hybridflow.__file__), "escaped_by_sandbox.txt"),
    ]
    for target in targets:
        code = fenced(f"open({target!r}, 'w').write('x')\nprint(4)")
        assert code_score("code", code, FOUR, None, **LIMITS) == 0.0
        assert not os.path.exists(target)
    # writing inside its own directory works
    assert (
        code_score("code", fenced("open('f.txt', 'w').write('4')\nprint(open('f.txt').read())"), FOUR, None, **LIMITS)
        == 1.0
    )


HOSTILE = {
    "infinite loop": "print(4, flush=True)\nwhile True:\n    pass",
    "sleep forever": "import time\nprint(4, flush=True)\ntime.sleep(10**6)",
    "fork bomb": (
        "import os\nprint(4, flush=True)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    ),
    "huge allocation": "x = bytearray(8 * 1024**3)\nprint(4)",
    "huge file": "open('big', 'wb').write(b'x' * (64 * 1024**2))\nprint(4)",
    "background child": "import os, time\nif os.fork() == 0:\n    time.sleep(10**6)\nprint(4)\nos._exit(1)",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_programs_score_zero_within_the_timeout(name, sandbox_tmp):
    cwd, pid = os.getcwd(), os.getpid()
    start = time.monotonic()
    assert code_score("code", fenced(HOSTILE[name]), FOUR, None, **LIMITS) == 0.0
    assert time.monotonic() - start < LIMITS["timeout_s"] + 3.0
    # the caller is untouched: same process and directory, nothing left running or on disk
    assert (os.getcwd(), os.getpid()) == (cwd, pid)
    deadline = time.monotonic() + 5
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == []
    assert list(sandbox_tmp.iterdir()) == []


def test_host_files_are_not_there(sandbox_tmp):
    """The root is a minimal one: the trainer's code and data (world-readable here) are not in it."""
    readable = hybridflow.__file__
    assert os.stat(readable).st_mode & 0o004  # the sandbox uid could read it, if it were there
    size = len(open(readable).read())
    program = fenced(f"print(len(open({readable!r}).read()))")
    assert code_score("code", program, json.dumps({"inputs": [""], "outputs": [str(size)]}), None, **LIMITS) == 0.0
    listing = run_python("import os\nprint(tuple(sorted(os.listdir(d)) for d in ('/', '/tmp', '/dev')))")
    top, tmp, dev = ast.literal_eval(listing.stdout)
    assert not {"work", "home", "mnt", "opt", "srv", "var"} & set(top)
    assert tmp == ["sandbox"] and dev == ["full", "null", "random", "urandom", "zero"]


def test_other_processes_are_not_there(sandbox_tmp):
    """Its /proc lists its own pid namespace only: the launcher's init (1) and the program (2)."""
    result = run_python(
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getpid())\n"
        "try:\n    os.kill(1, 9)\nexcept PermissionError:\n    print('init is out of reach')"
    )
    assert result.stdout.splitlines() == ["[1, 2] 2", "init is out of reach"]


def test_result_channel_is_separate_from_stdout(sandbox_tmp):
    program = f"import os\nprint('x' * (5 << 20))\nos.write({RESULT_FD}, b'the report')"
    result = run_python(program, capture_stdout=False, result_channel=True)
    assert result.ok and result.results == b"the report" and result.stdout == ""
    without = run_python(f"import os\ntry:\n    os.write({RESULT_FD}, b'x')\nexcept OSError as e:\n    print(e.errno)")
    assert without.stdout == "9\n" and without.results == b""  # EBADF: no channel unless asked


def test_io_output_larger_than_the_default_cap(sandbox_tmp):
    """An expected output over 1 MiB is read back in full (before, stdout was cut at 1 MiB: a correct answer failed)."""
    tests = json.dumps({"inputs": [""], "outputs": ["ab" * (3 << 20)]})
    assert code_score("code", fenced("print('ab' * (3 << 20))"), tests, None, **LIMITS) == 1.0
    assert code_score("code", fenced("print('ab' * (3 << 20) + 'c')"), tests, None, **LIMITS) == 0.0


_FORK_HOGS = """
import os, time
ready_r, ready_w = os.pipe()
for _ in range(15):
    if os.fork() == 0:
        block = bytearray(300 << 20)
        block[::4096] = b"x" * len(block[::4096])  # touch every page
        os.write(ready_w, b"1")
        time.sleep(60)
        os._exit(0)
os.close(ready_w)
held = 0
while held < 15 and os.read(ready_r, 1):
    held += 1
print(held, flush=True)
time.sleep(60)
"""


def anonymous_memory_of_sandboxes():
    """Proportional anonymous memory (Pss_Anon) of every process owned by a sandbox uid, in MiB."""
    total_kb = 0
    for pid in sandbox_processes():
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total_kb += sum(int(line.split()[1]) for line in f if line.startswith("Pss_Anon:"))
        except OSError:  # exited meanwhile
            pass
    return total_kb / 1024


@pytest.mark.parametrize("guard", ["the machine's", "watchdog"])
def test_aggregate_memory_bound(guard, monkeypatch, sandbox_tmp):
    """15 forks touching 300 MiB each (4.5 GiB; before, all of it was held) stay under a 512 MiB bound."""
    if guard == "watchdog":
        monkeypatch.setattr(sandbox_memory, "_cgroup_parent", lambda: None)
    limits = SandboxLimits(wall_s=4.0, cpu_s=10, memory_mb=512, total_memory_mb=512)
    peak, done = [0.0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], anonymous_memory_of_sandboxes())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = run_python(_FORK_HOGS, limits=limits)
    finally:
        done.set()
        watcher.join()
    assert result.memory_exceeded and not result.ok, result
    assert result.stdout.strip() in ("", "0", "1"), result  # at most one child got to hold its 300 MiB
    # the kernel charges a cgroup exactly; the watchdog reads every 20 ms, and may overshoot by what
    # the tree allocates meanwhile: about 30 MiB on a quiet machine, 150 (662 MiB) seen in make test's
    # serial phase (1 run of 14 here); a hog touches its 300 MiB in tens of ms, so one hog is the
    # bound's slack. Our own reading sums processes one after the other, so it can count a hog just
    # before it is killed and, a moment later, its successor grown into the room it left (549 MiB seen
    # on CI): one hog more for that. Held in aggregate, the tree would reach 4.5 GiB.
    overshoot = 0 if result.memory_guard.startswith("cgroup") else 300
    assert result.memory_peak_mb is not None and result.memory_peak_mb <= 512 + overshoot, result
    assert 0 < peak[0] <= 512 + overshoot + 300, peak
    if guard == "watchdog":
        assert result.memory_guard == "watchdog" and result.wall_s < limits.wall_s, result  # killed, not timed out
    # a program within the bound is left alone
    fits = run_python(  # it holds its block a moment, so the watchdog's 20 ms readings see it
        "import time\nblock = bytearray(200 << 20)\nblock[::4096] = b'x' * len(block[::4096])\n"
        "time.sleep(0.2)\nprint('ok')",
        limits=limits,
    )
    assert fits.ok and fits.stdout == "ok\n" and not fits.memory_exceeded and fits.memory_peak_mb >= 200, fits


def test_limits_are_reported(sandbox_tmp):
    result = run_python("import time\ntime.sleep(5)", limits=SandboxLimits(wall_s=0.5))
    assert result.timed_out and not result.ok and result.isolated
    result = run_python("print(input()[::-1])", "abc\n")
    assert result.ok and result.stdout == "cba\n"


def test_bad_ground_truth_raises():
    with pytest.raises(ValueError, match="no test cases"):
        code_score("code", "print(1)", json.dumps({"asserts": []}), None)
    with pytest.raises(ValueError, match="inputs"):
        code_score("code", "print(1)", json.dumps({"tests": []}), None)


def test_code_through_the_reward_pool(sandbox_tmp):
    from hybridflow.rewards.manager import RewardManager

    responses = [fenced("print(2 + 2)"), fenced(HOSTILE["infinite loop"]), fenced(HOSTILE["fork bomb"])]
    with RewardManager(
        route={"c": "code"}, verifier_kwargs={"code": LIMITS}, num_workers=1, timeout_s=20, worker_preload=()
    ) as manager:
        scores, _, outcomes = manager.score_texts(["c"] * 3, responses, [FOUR] * 3)
    assert scores == [1.0, 0.0, 0.0]
    assert [o.status for o in outcomes] == ["ok"] * 3


def test_killing_the_pool_worker_takes_the_sandbox_down(sandbox_tmp):
    """The pool's timeout is shorter than the sandbox's: the worker is killed mid-run, and its sandbox with it."""
    from hybridflow.rewards.manager import RewardManager

    slow = {**LIMITS, "timeout_s": 30.0}
    with RewardManager(
        route={"c": "code"}, verifier_kwargs={"code": slow}, num_workers=1, timeout_s=1.5, worker_preload=()
    ) as manager:
        manager.score_texts(["c"], [fenced("print(4)")], [FOUR])  # warm the worker
        scores, _, outcomes = manager.score_texts(["c"], [fenced(HOSTILE["sleep forever"])], [FOUR])
    assert scores == [0.0] and outcomes[0].status == "timeout"
    deadline = time.monotonic() + 5
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == []
    # the pool's workers keep their temporary folders under ours; the killed one's sandbox directory went with it
    assert list(sandbox_tmp.iterdir()) == []


def test_launcher_refuses_without_namespaces(monkeypatch, capsys):
    """Where namespaces cannot be made, the launcher exits with a clear message (unless allowed)."""
    from hybridflow.sandbox import launcher as sandbox_launcher

    monkeypatch.setattr(sandbox_launcher, "_unshare_namespaces", lambda: False)
    monkeypatch.setattr(sandbox_launcher.os, "fork", lambda: pytest.fail("must not start the program"))
    config = {"dir": "/nonexistent", "uid": None, "allow_unisolated": False}
    monkeypatch.setattr(sandbox_launcher.sys, "argv", ["launcher", json.dumps(config)])
    with pytest.raises(SystemExit) as exit_info:
        sandbox_launcher.main()
    assert exit_info.value.code == sandbox_launcher.EXIT_UNAVAILABLE
    assert "cannot create network/pid/mount namespaces" in capsys.readouterr().err


def test_run_python_raises_when_the_launcher_refuses(tmp_path, monkeypatch, sandbox_tmp):
    from hybridflow.sandbox import launcher as sandbox_launcher
    from hybridflow.sandbox import runner as sandbox
    from hybridflow.sandbox.runner import SandboxUnavailableError

    refusing = tmp_path / "refusing_launcher.py"
    refusing.write_text(  # the launcher's word goes to its status channel, as the real one's
        "import json, os, sys\nconfig = json.loads(sys.argv[1])\n"
        f"os.write(config['status_fd'], ({sandbox_launcher.UNAVAILABLE_MARK!r} + ': no namespaces here; "
        "allow an unisolated sandbox').encode())\n"
        f"sys.exit({sandbox_launcher.EXIT_UNAVAILABLE})\n"
    )
    monkeypatch.setattr(sandbox, "_LAUNCHER", str(refusing))
    with pytest.raises(SandboxUnavailableError, match="no namespaces here"):
        run_python("print(1)")
    assert list(sandbox_tmp.iterdir()) == []


def test_a_program_cannot_forge_the_launchers_word(sandbox_tmp):
    """The launcher's markers on the program's stderr (and its exit status 71) are the program's output only:
    not "the sandbox is unavailable" (which the python tool would report as an infrastructure error), and
    not "this run was unisolated"."""
    from hybridflow.sandbox import launcher as sandbox_launcher

    forged = run_python(
        "import sys\n"
        f"sys.stderr.write({sandbox_launcher.UNISOLATED_MARK!r} + '\\n')\n"
        f"sys.stderr.write({sandbox_launcher.UNAVAILABLE_MARK!r} + ': cannot create namespaces\\n')\n"
        f"sys.exit({sandbox_launcher.EXIT_UNAVAILABLE})\n"
    )
    assert forged.returncode == sandbox_launcher.EXIT_UNAVAILABLE and forged.isolated
    assert forged.stderr.startswith(sandbox_launcher.UNISOLATED_MARK)  # kept as the program wrote it
    assert list(sandbox_tmp.iterdir()) == []


SYSV = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
IPC_CREAT, KEY_SHM, KEY_MSG = 0o1000, 0x5EED01, 0x5EED02
mode = sys.argv[1] if len(sys.argv) > 1 else MODE
if mode == "leave":
    shm = libc.shmget(KEY_SHM, 1 << 20, IPC_CREAT | 0o666)
    address = libc.shmat(shm, None, 0)
    ctypes.memmove(address, b"the answer is 42", 16)
    msg = libc.msgget(KEY_MSG, IPC_CREAT | 0o666)
    print("left", shm >= 0, msg >= 0)
else:
    print("found", libc.shmget(KEY_SHM, 0, 0) >= 0, libc.msgget(KEY_MSG, 0) >= 0)
"""


def _host_sysv_keys(kind: str) -> set[int]:
    """The keys of the host's System V objects of ``kind`` (shm, msg), as /proc lists them."""
    lines = open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]
    return {int(line.split()[0]) for line in lines}


def test_system_v_ipc_left_by_one_run_reaches_neither_a_later_run_nor_the_host(sandbox_tmp):
    """An earlier run's shared-memory segment held a forged answer for a later one: each run now has its own IPC
    namespace, which dies with it."""
    left = run_python(SYSV.replace("MODE", '"leave"'))
    assert left.ok and left.isolated and left.stdout.split() == ["left", "True", "True"], left.stderr
    found = run_python(SYSV.replace("MODE", '"look"'))
    assert found.ok and found.stdout.split() == ["found", "False", "False"], found.stdout
    assert not {0x5EED01, 0x5EED02} & (_host_sysv_keys("shm") | _host_sysv_keys("msg"))
