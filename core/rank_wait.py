"""Waiting on the ranks of a call: a failure, a timeout or a stalled rank ends the wait with an error naming it.

The driver waits on one Ray object reference per rank. Three things end a
wait before every rank has answered, each as an error that names the role,
method, rank, node and pid:

- a rank's call fails (its exception, or its process died):
  :class:`WorkerError`, at once, listing the ranks still in the call (a
  collective that timed out on some ranks names here the peer that never
  reached it);
- the call's timeout passes: :class:`WorkerTimeoutError`, naming the late ranks;
- a rank stops answering the heartbeat: :class:`WorkerStalledError`.

**The heartbeat.** Every ``interval_s`` of a wait, each process still in the
call gets a :meth:`~hybridflow.core.worker.WorkerHost.heartbeat` call on the
host's ``control`` concurrency group, a thread of its own, so a rank busy in
the call (in a collective, in generation) answers at once with the calls it
is in. A process that has not answered one for ``stall_s`` is stopped
(SIGSTOP, a debugger), swapped out, or frozen in native code that holds
Python's lock: it is named within ``interval_s + stall_s`` of the stall.
A rank that is alive but waits for a peer answers, and its collective's own
timeout (``Worker.init_process_group``) ends the call instead.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Protocol

import ray
from ray.exceptions import RayActorError, RayError

from hybridflow.core.worker_logs import NOTHING, last_words

__all__ = [
    "CONTROL_GROUP",
    "Heartbeat",
    "RankCall",
    "RankLabel",
    "ServiceWatch",
    "Watch",
    "WorkerError",
    "WorkerStalledError",
    "WorkerTimeoutError",
    "in_daemon_thread",
    "wait_ranks",
]

CONTROL_GROUP = "control"
"""The concurrency group of a host's heartbeat: one thread beside the ones that run calls."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROBE_S = 2.0  # how long a failed call's report waits to learn what the ranks still in it are doing


def describe(err: BaseException) -> str:
    """The worker's own error text (Ray's traceback included), without terminal colours."""
    return _ANSI.sub("", str(err))


@dataclass(frozen=True)
class RankLabel:
    """Who a rank is, for error messages."""

    rank: int
    node_ip: str
    node_id: str
    pid: int

    def __str__(self) -> str:
        return f"rank {self.rank} (node {self.node_ip} {self.node_id[:8]}, pid {self.pid})"


@dataclass(frozen=True)
class Heartbeat:
    """How often a wait asks the ranks still in a call whether they are alive, and how long one may stay silent."""

    interval_s: float
    stall_s: float

    @classmethod
    def from_timeouts(cls, timeouts: Any) -> Heartbeat | None:
        """The heartbeat ``trainer.timeouts`` asks for (``heartbeat_s``, ``stall_s``); None without one."""
        return None if timeouts.heartbeat_s is None else cls(timeouts.heartbeat_s, timeouts.stall_s)


@dataclass(frozen=True)
class RankCall:
    """One rank's part in a call being waited on: its result's reference, who it is, its host actor (for the
    heartbeat; None: not asked) and the call's role and method."""

    ref: Any
    label: RankLabel
    handle: Any
    role: str
    method: str

    @property
    def name(self) -> str:
        """``role.method``."""
        return f"{self.role}.{self.method}"


class WorkerError(RuntimeError):
    """A call failed on a rank; the message names role, method, rank, node and the cause."""

    def __init__(
        self,
        message: str,
        role: str,
        method: str,
        rank: int | None,
        cause: BaseException | None,
        still_in_call: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.role, self.method, self.rank, self.cause = role, method, rank, cause
        self.still_in_call = still_in_call  # the other ranks in the call when it failed, as the message lists them
        self.step: int | None = None  # the trainer's step it stopped, set by the trainer


class WorkerTimeoutError(WorkerError, TimeoutError):
    """A call did not finish within its timeout."""


class WorkerStalledError(WorkerError, TimeoutError):
    """A rank stopped answering the heartbeat during a call."""


class Watch(Protocol):
    """A participant of a wait that is not a rank (:class:`ServiceWatch`): asked to look at every wake-up."""

    def next_wake(self) -> float | None:
        """The monotonic time it must be looked at again by (None: no need)."""
        ...

    def check(self) -> None:
        """Raise a :class:`WorkerError` if it failed or stalled."""
        ...


def wait_ranks(
    calls: Sequence[RankCall],
    timeout_s: float | None = None,
    heartbeat: Heartbeat | None = None,
    watches: Sequence[Watch] = (),
) -> list[Any]:
    """Every call's value, in order, once all have finished; raises as the module docstring says.

    ``timeout_s`` bounds the whole wait (None: no bound); ``heartbeat`` None asks no rank anything; ``watches``
    are checked at every wake-up beside the ranks (a server process doing its part of the same call).
    """
    index = {call.ref: i for i, call in enumerate(calls)}
    values: dict[int, Any] = {}
    pending = [call.ref for call in calls]
    start = time.monotonic()
    deadline = None if timeout_s is None else start + timeout_s
    pings = _Pings(heartbeat, start) if heartbeat is not None else None
    while pending:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise _timed_out(calls, [calls[index[r]] for r in pending], timeout_s)
        wakes = [deadline, pings.next_wake() if pings else None, *(w.next_wake() for w in watches)]
        wakes = [t for t in wakes if t is not None]
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, min(wakes) - now) if wakes else None)
        for ref in ready:
            try:
                values[index[ref]] = ray.get(ref)
            except RayError as err:
                raise _failed(calls, index, ref, err, pending) from err
        if pings is not None and pending:
            pings.check([calls[index[r]] for r in pending])
        for watch in watches:
            watch.check()
    return [values[i] for i in range(len(calls))]


def _timed_out(calls: Sequence[RankCall], late: Sequence[RankCall], timeout_s: float | None) -> WorkerTimeoutError:
    names = ", ".join(dict.fromkeys(call.name for call in calls))
    return WorkerTimeoutError(
        f"{names} did not finish within {timeout_s:g} s on {', '.join(str(c.label) for c in late)}",
        late[0].role,
        late[0].method,
        late[0].label.rank,
        None,
    )


def _failed(
    calls: Sequence[RankCall], index: dict[Any, int], ref: Any, err: RayError, pending: list[Any]
) -> WorkerError:
    """The failure to report: a rank that died beats one whose collective failed because of it (both are ready)."""
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0) if pending else ([], [])
    for other in ready:
        try:
            ray.get(other, timeout=0)
        except RayActorError as died:
            ref, err = other, died
            break
        except RayError:
            continue
    call = calls[index[ref]]
    still = [calls[index[r]] for r in pending if r != ref]
    message = f"{call.name} failed on {call.label}: {describe(err)}"
    if isinstance(err, RayActorError):  # Ray says only that the process died: its stderr may say why
        message += _last_words_text(call.label)
    doing = tuple(_doing(still))
    if doing:
        message += "\nstill in the call when it failed (a peer that never reached a collective is among them):\n  "
        message += "\n  ".join(doing)
    return WorkerError(message, call.role, call.method, call.label.rank, err, doing)


def _last_words_text(label: RankLabel) -> str:
    """What the dead process of ``label`` last wrote to stderr, as lines to add to the error ('' when its log is
    not on this machine)."""
    words = last_words(label.node_id, label.pid)
    if words is None:
        return ""
    if words == NOTHING:
        return (
            "\nits process wrote nothing to stderr before it ended: something outside it killed it "
            "(the kernel's OOM killer, a SIGKILL)"
        )
    return "\nthe last lines its process wrote to stderr:\n  " + "\n  ".join(words.splitlines())


def _doing(calls: Sequence[RankCall]) -> list[str]:
    """One line per rank: who it is and the calls it says it is in (asked once, at most ``_PROBE_S``)."""
    asked = {
        call.label: call.handle.heartbeat.options(concurrency_group=CONTROL_GROUP).remote()
        for call in calls
        if call.handle is not None
    }
    ready, _ = ray.wait(list(asked.values()), num_returns=len(asked), timeout=_PROBE_S) if asked else ([], [])
    lines = []
    for call in calls:
        ref = asked.get(call.label)
        doing = "not asked"
        if ref is not None and ref in ready:
            try:
                doing = _calls_text(ray.get(ref, timeout=0))
            except RayError:
                doing = "gone"
        elif ref is not None:
            doing = f"no answer within {_PROBE_S:g} s"
        lines.append(f"{call.label}: {doing}")
    return lines


def _calls_text(beat: Sequence[Sequence[Any]]) -> str:
    return ", ".join(f"in {name} for {seconds:.1f} s" for name, seconds in beat) or "in no call"


class _Pings:
    """The heartbeat of one wait: a ping per process still in the call every ``interval_s``, and the stall check."""

    def __init__(self, heartbeat: Heartbeat, start: float) -> None:
        self.heartbeat = heartbeat
        self.next_round = start + heartbeat.interval_s
        self.out: dict[tuple[str, int], tuple[Any, float]] = {}  # process -> (ping ref, sent at)
        self.answers: dict[tuple[str, int], tuple[Any, float]] = {}  # process -> (its last answer, when)

    def next_wake(self) -> float:
        """When the wait must look again: the next round, or the oldest ping's stall deadline."""
        return min([self.next_round] + [sent + self.heartbeat.stall_s for _, sent in self.out.values()])

    def check(self, pending: Sequence[RankCall]) -> None:
        """Take the answers in; raise for a process whose ping is ``stall_s`` old; ping again when a round is due."""
        now = time.monotonic()
        self._collect(now)
        for call in pending:
            key = (call.label.node_id, call.label.pid)
            if key in self.out and now - self.out[key][1] >= self.heartbeat.stall_s:
                raise self._stalled(call, now)
        if now >= self.next_round:
            for call in pending:
                key = (call.label.node_id, call.label.pid)
                if call.handle is not None and key not in self.out:
                    self.out[key] = (call.handle.heartbeat.options(concurrency_group=CONTROL_GROUP).remote(), now)
            self.next_round = now + self.heartbeat.interval_s

    def _collect(self, now: float) -> None:
        if not self.out:
            return
        refs = [ref for ref, _ in self.out.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = set(ready)
        for key, (ref, _) in list(self.out.items()):
            if ref in done:
                del self.out[key]
                try:
                    self.answers[key] = (ray.get(ref, timeout=0), now)
                except RayError:  # a dead process fails its call too, and that names it
                    pass

    def _stalled(self, call: RankCall, now: float) -> WorkerStalledError:
        key = (call.label.node_id, call.label.pid)
        last = self.answers.get(key)
        heard = (
            f"its last answer, {now - last[1]:.1f} s ago: {_calls_text(last[0])}"
            if last
            else "it has not answered since the call began"
        )
        return WorkerStalledError(
            f"{call.name}: {call.label} stopped answering the heartbeat: no answer for {self.heartbeat.stall_s:g} s "
            f"(stopped, or frozen holding Python's lock); {heard}",
            call.role,
            call.method,
            call.label.rank,
            None,
        )


SERVICE_ROLE = "server"
"""The role a :class:`ServiceWatch`'s errors carry (a rank's carry its group's role)."""


class ServiceWatch:
    """A participant of a wait that is not a Ray actor: a server process the driver talks to over HTTP (a
    ``vllm serve``), doing its part of a call in a thread of the driver (``pending``). The heartbeat asks it
    ``health_url`` every ``interval_s`` on a thread of its own; a server that has not answered one for ``stall_s``
    is stopped or frozen: :meth:`check` raises :class:`WorkerStalledError` naming it, as it names a rank. Its part
    failing (``pending`` raising) or its process gone (the ping refused) raise :class:`WorkerError` at once."""

    def __init__(self, name: str, method: str, health_url: str, pending: Future, heartbeat: Heartbeat | None) -> None:
        """``name``: who the service is in messages (``rollout server (vllm serve, pid 123)``); ``method``: the
        part it does (``receive_weights``); ``pending``: that part's future (:func:`in_daemon_thread`)."""
        self.name, self.method, self.health_url = name, method, health_url
        self.pending, self.heartbeat = pending, heartbeat
        self.start = time.monotonic()
        self.next_round = self.start + (heartbeat.interval_s if heartbeat else float("inf"))
        self.ping: tuple[Future, float] | None = None  # (the ping in flight, sent at)
        self.last_answer: float | None = None

    def next_wake(self) -> float | None:
        """When the wait must look again (None: only when a rank answers)."""
        if self.heartbeat is None:
            return None
        wakes = [self.next_round, time.monotonic() + 0.2]  # also notice the pending part ending
        if self.ping is not None:
            wakes.append(self.ping[1] + self.heartbeat.stall_s)
        return min(wakes)

    def check(self) -> None:
        """Raise if the service's part failed, its process is gone, or it stopped answering; ping when due."""
        if self.pending.done() and self.pending.exception() is not None:
            err = self.pending.exception()
            raise WorkerError(f"{self.method}: {self.name} failed: {err}", SERVICE_ROLE, self.method, None, err)
        if self.heartbeat is None:
            return
        now = time.monotonic()
        if self.ping is not None:
            future, sent = self.ping
            if future.done():
                self.ping = None
                err = future.exception()
                if isinstance(err, ConnectionRefusedError) or isinstance(
                    getattr(err, "reason", None), ConnectionRefusedError
                ):
                    message = f"{self.method}: {self.name} is gone ({self.health_url}: {err})"
                    raise WorkerError(message, SERVICE_ROLE, self.method, None, err)
                if err is None:
                    self.last_answer = now
            elif now - sent >= self.heartbeat.stall_s:
                raise self._stalled(now)
        if now >= self.next_round and self.ping is None:
            # its own timeout past the stall bound: the check above names a silent server first
            timeout_s = self.heartbeat.stall_s + self.heartbeat.interval_s
            self.ping = (in_daemon_thread(_get, self.health_url, timeout_s), now)
            self.next_round = now + self.heartbeat.interval_s

    def result(self) -> Any:
        """The pending part's value, waited for under the same checks."""
        while True:
            self.check()
            wake = self.next_wake()
            try:
                return self.pending.result(timeout=None if wake is None else max(0.0, wake - time.monotonic()))
            except FutureTimeout:
                continue

    def _stalled(self, now: float) -> WorkerStalledError:
        heard = (
            f"its last answer {now - self.last_answer:.1f} s ago"
            if self.last_answer is not None
            else "it has not answered since the call began"
        )
        return WorkerStalledError(
            f"{self.method}: {self.name} stopped answering the heartbeat: no answer to {self.health_url} for "
            f"{self.heartbeat.stall_s:g} s (stopped, or frozen); {heard}",
            SERVICE_ROLE,
            self.method,
            None,
            None,
        )


def in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Future:
    """``fn(*args)`` in a daemon thread, as a future: a call into a process that never answers leaves a thread
    that does not keep the driver from exiting (a ``ThreadPoolExecutor``'s would, at interpreter exit)."""
    future: Future = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(err)

    threading.Thread(target=run, name=f"call-{getattr(fn, '__name__', 'fn')}", daemon=True).start()
    return future


def _get(url: str, timeout_s: float) -> None:
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        if answer.status != 200:
            raise RuntimeError(f"{url}: HTTP {answer.status}")
