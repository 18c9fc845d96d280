"""Where a step's rollout comes from (``trainer.rollout_mode``) and how weights reach the rollout
(``trainer.placement``).

The driver's step is the same seven stages in every mode; only stage 1
changes source. :class:`SyncRollout` draws the step's prompts and generates
them now. :class:`PipelinedRollout` keeps ``ahead`` batches submitted before
they are needed, to a rollout on ranks of its own, and hands out the oldest::

    step s:  [take batch s] [old_log_prob ref reward adv update] [submit batch s+1+ahead] [sync v(s+1)]
    rollout: ......decodes batches s+1 .. s+ahead meanwhile (one continuous batch, workers/rollout/stream.py)

Batch j is submitted once the trainer holds version j - ahead, and named to enter
the decoder with that version's weights (the sync carries its name; the first
batches are named together before any step), so none of its tokens is older
than that: staleness <= ``ahead`` (``trainer.max_staleness`` for ``async``, 1
for ``one_step_off``), checked on every batch. Batch j holds version j: with
``trainer.async_weight_swap=batch`` those weights enter once it has finished.

:class:`GroupWeightSync` moves the weights after each update when the rollout
is a group of its own (``core/weight_transfer.py``); colocated, the actor
reshards into its rollout layout itself (:class:`NoWeightSync`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from hybridflow.configs.roles import RolloutPlacement
from hybridflow.core import DataProto
from hybridflow.core.keys import (
    METRICS,
    N_SAMPLES,
    RESPONSE_MASK,
    ROLLOUT_VERSIONS,
    SEED,
    STREAM_REQUEST,
    WEIGHT_SYNC_PREFIX,
    WEIGHT_VERSION,
)
from hybridflow.core.rank_wait import in_daemon_thread
from hybridflow.core.worker_group import gather

logger = logging.getLogger(__name__)

__all__ = [
    "GroupWeightSync",
    "NoWeightSync",
    "PipelinedRollout",
    "ServerWeightSync",
    "SyncRollout",
    "rollout_source",
    "Rollout",
    "with_prompt_columns",
]

CALL_KEYS = (SEED, STREAM_REQUEST)
"""``meta_info`` keys of one rollout request; they leave its batch (the rollout batches of one step differ in them,
and ``concat`` wants equal ``meta_info``)."""

Draw = Callable[[int], DataProto]
"""``draw(index)``: the prompts of rollout batch ``index`` (uids, ``n``, seed), from the loader's current position."""


class NoWeightSync:
    """Colocated: the actor moves its weights into its own rollout layout in ``update_actor``."""

    def __call__(self) -> dict[str, float]:
        """Nothing to do; no metrics."""
        return {}


class GroupWeightSync:
    """The trainer's weights to the rollout group after each update (and once at start), in memory."""

    def __init__(self, actor: Any, rollout: Any) -> None:
        self.actor, self.rollout = actor, rollout
        host, port = actor.hosts.free_port()
        members = 1 + rollout.world_size
        joins = [group.join_weight_transfer.options(blocking=False)(host, port, members) for group in (actor, rollout)]
        gather(*joins)

    def __call__(self, admit: list[int] | tuple[int, ...] = ()) -> dict[str, float]:
        """Send the current weights (both groups take part), the stream requests ``admit`` names entering the
        rollout with them; ``weight_sync/*`` of the sender, the time the driver waited (``timing_s/weight_sync``)
        and the slowest receiver's seconds."""
        start = time.perf_counter()
        send = self.actor.send_weights.options(blocking=False)()
        receive = self.rollout.receive_weights.options(blocking=False)(list(admit))
        sent, received = gather(send, receive)  # a receiver that stalls is named, not waited for by the sender
        sent = sent[0]
        out = dict(sent)
        out["weight_sync/receive_seconds"] = max(r["weight_sync/seconds"] for r in received)
        out["timing_s/weight_sync"] = time.perf_counter() - start
        return out


class ServerWeightSync:
    """The trainer's weights to a ``vllm serve`` process after each update (and once at start), in memory: the
    same transfer, received by vLLM's weight-transfer routes (``workers/rollout/vllm_server.py``).

    Every wait is the groups' wait: the actor's ranks under their heartbeat and ``trainer.timeouts``, the server
    beside them under the same heartbeat (its ``/health``: a stopped or frozen server is named within
    ``heartbeat_s + stall_s``, :class:`~hybridflow.core.rank_wait.ServiceWatch`); the server's HTTP calls run
    in daemon threads, so a server that never answers does not hold the driver."""

    def __init__(self, actor: Any, server: Any) -> None:
        self.actor, self.server = actor, server
        host, port = actor.hosts.free_port()
        members = 1 + server.config.actor_rollout_ref.rollout.tensor_model_parallel_size
        joined = in_daemon_thread(server.join_weight_transfer, host, port, members)  # both ends wait for the group
        self._together(
            actor.join_weight_transfer.options(blocking=False)(host, port, members), joined, "join_weight_transfer"
        )

    def __call__(self) -> dict[str, float]:
        """Send the current weights while the server receives them, then commit them under their version."""
        start = time.perf_counter()
        receiving = in_daemon_thread(self.server.receive_weights)
        send = self.actor.send_weights.options(blocking=False)()
        sent, received = self._together(send, receiving, "receive_weights")
        out = {**sent[0], **received}
        committing = in_daemon_thread(self.server.commit_weights, int(out["weight_sync/version"]))
        self.server.watch(committing, "commit_weights", send.heartbeat).result()
        out["timing_s/weight_sync"] = time.perf_counter() - start
        return out

    def _together(self, ranks: Any, server_part: Any, method: str) -> tuple[Any, Any]:
        """Wait for the actor's ranks and the server's part (its ``method``, running) of one step as one wait."""
        watch = self.server.watch(server_part, method, ranks.heartbeat)  # the actor group's bound holds the server
        (from_ranks,) = gather(ranks, watches=[watch])
        return from_ranks, watch.result()


@dataclass(frozen=True)
class Rollout:
    """The rollout as the driver sees it, one object whatever its placement (``configs/roles.py``):

    * ``generator``: what generates and answers ``tokenizer_info`` (the actor's group colocated, the rollout's
      own group, or the server process);
    * ``server``: the process agent loops call over HTTP (``SERVER`` only);
    * :meth:`weight_sync`: how new weights reach it after every update.
    """

    placement: RolloutPlacement
    generator: Any
    server: Any = None

    def tokenizer_info(self) -> dict[str, Any]:
        """The pad id, first EOS id and all EOS ids the rollout generates with."""
        info = self.generator.tokenizer_info()
        return info if isinstance(info, dict) else info[0]  # a worker group answers per rank, alike

    def weight_sync(self, actor: Any) -> NoWeightSync | GroupWeightSync | ServerWeightSync:
        """The trainer-to-rollout sync of this placement (colocated, the actor loads its own engine)."""
        if self.placement is RolloutPlacement.SERVER:
            return ServerWeightSync(actor, self.server)
        if self.placement is RolloutPlacement.GROUP:
            return GroupWeightSync(actor, self.generator)
        return NoWeightSync()


@dataclass
class _Submitted:
    prompts: DataProto
    future: Any
    loader_state: dict[str, int]  # the loader's position before this batch was drawn
    index: int


def take_metrics(batch: DataProto, prefix: str) -> dict[str, Any]:
    """The metrics under ``prefix`` the ranks reported with ``batch`` (``meta_info["metrics"]``: a list per key
    when several ranks reported it), taken out of it; the metrics entry goes once nothing is left in it."""
    found = batch.meta_info.get(METRICS, {})
    taken = {key: found.pop(key) for key in [k for k in found if k.startswith(prefix)]}
    if METRICS in batch.meta_info and not found:
        batch.meta_info.pop(METRICS)
    return taken


def weight_sync_metrics(batch: DataProto) -> dict[str, float]:
    """The ``weight_sync/*`` metrics the rollout's ranks reported with ``batch`` (taken out of it), the largest
    over ranks: every rank pushes the whole model, and the step waits for the slowest."""
    return {key: float(max(_as_list(v))) for key, v in take_metrics(batch, WEIGHT_SYNC_PREFIX).items()}


REDUCE_OVER_RANKS = {"rollout/generated_tokens": sum, "rollout/generate_s": max, "rollout/latency_s": max}
"""How an engine metric of several ranks becomes one: tokens add up, the step waits for the slowest rank's
generation; any other (a share, a rate) is the ranks' mean."""


def engine_metrics(batch: DataProto) -> dict[str, float]:
    """The ``rollout/*`` metrics the engines of the rollout's ranks reported with ``batch`` (taken out of it),
    one value each (:data:`REDUCE_OVER_RANKS`)."""
    taken = take_metrics(batch, "rollout/")
    return {key: float(REDUCE_OVER_RANKS.get(key, np.mean)(_as_list(v))) for key, v in taken.items()}


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


class SyncRollout:
    """Each step draws its prompts and generates them now.

    :param generate: the trainer's ``generate`` (prompts -> rollout with the prompts' columns).
    :param split: the rollout has ranks of its own, so the trainer's ranks idle while it generates.
    :param allow_stale: a rollout from other weights than the trainer's only warns (``rollout.allow_stale_weights``).
    """

    def __init__(
        self,
        draw: Draw,
        generate: Callable[[DataProto], DataProto],
        loader: Any,
        split: bool,
        allow_stale: bool = False,
    ) -> None:
        self.draw, self.generate, self.loader, self.split = draw, generate, loader, split
        self.allow_stale = allow_stale
        self.drawn = 0
        self.last_end: float | None = None

    def send_weights(self, version: int, sync: Callable[[], dict[str, float]]) -> dict[str, float]:
        """Weight version ``version`` (a run's first, or an update's) to the rollout; the sync's metrics."""
        return sync()

    def next(self, version: int) -> tuple[DataProto, DataProto, dict[str, float]]:
        """The prompts of the next batch, their rollout (sampled with weight version ``version``: checked) and
        the idle metrics."""
        prompts = self.draw(self.drawn)
        self.drawn += 1
        start = time.perf_counter()
        batch = self.generate(prompts)
        end = time.perf_counter()
        drop_call_keys(batch)
        check_version(batch, version, self.allow_stale)
        metrics = weight_sync_metrics(batch)  # a push the rollout took before generating (colocated vLLM)
        if self.split:  # the trainer waited the whole generation; the rollout, since the last one ended
            metrics["timing_s/trainer_idle"] = end - start
            if self.last_end is not None:
                metrics["timing_s/rollout_idle"] = start - self.last_end
        self.last_end = end
        return prompts, batch, metrics

    def position(self) -> tuple[dict[str, int], int]:
        """The loader's position and the rollout batch index after the batches trained so far (nothing is drawn
        ahead)."""
        return self.loader.state_dict(), self.drawn


class PipelinedRollout:
    """Batches submitted ``ahead`` steps early to the rollout group's stream (see the module docstring).

    :param steps: the run's steps; no more batches are kept submitted than steps remain (the others would be
        generated and never trained).
    """

    def __init__(self, draw: Draw, rollout: Any, loader: Any, ahead: int, steps: int) -> None:
        self.draw, self.rollout, self.loader, self.ahead = draw, rollout, loader, ahead
        self.steps = steps
        self.pending: deque[_Submitted] = deque()
        self.drawn = 0

    def send_weights(self, version: int, sync: Callable[..., dict[str, float]]) -> dict[str, float]:
        """Submit the batches weight version ``version`` lets in (a run's first: all of them ahead), then that
        version's weights, which they enter the decoder with, together; the sync's metrics."""
        return sync(admit=self.submit_ahead(version))

    def submit_ahead(self, version: int, one_to_take: bool = False) -> list[int]:
        """Submit batches until the newest is ``version + ahead`` (batch j waits for trainer version j - ahead),
        none past what the remaining steps train (and, ``one_to_take``, at least one); their indices. A step that
        takes several batches (an after-reward hook drawing more prompts) runs its batch indices ahead of the
        versions: its extra batches are submitted when taken, from the current weights."""
        submitted = []
        while (one_to_take and not self.pending) or (
            self.drawn <= version + self.ahead and len(self.pending) < self.steps - version
        ):
            state = self.loader.state_dict()
            prompts = self.draw(self.drawn)
            prompts.meta_info[STREAM_REQUEST] = self.drawn
            future = self.rollout.generate_stream.options(blocking=False)(prompts)
            self.pending.append(_Submitted(prompts, future, state, self.drawn))
            submitted.append(self.drawn)
            self.drawn += 1
        return submitted

    def next(self, version: int) -> tuple[DataProto, DataProto, dict[str, float]]:
        """The oldest submitted batch's prompts and rollout (waited for), with staleness and idle metrics."""
        extra = self.submit_ahead(version, one_to_take=True)  # a step taking more than one batch
        if extra:
            self.rollout.admit_requests(extra)
        submitted = self.pending.popleft()
        start = time.perf_counter()
        out = submitted.future.get()
        waited = time.perf_counter() - start
        prompts = submitted.prompts
        batch = with_prompt_columns(out, prompts)
        drop_call_keys(batch)
        metrics = staleness(batch, version, self.ahead)
        idle = batch.meta_info.get(METRICS, {}).pop("rollout/stream_idle_s", [0.0])
        metrics["timing_s/rollout_idle"] = float(np.mean(idle))
        metrics["timing_s/trainer_idle"] = waited
        return prompts, batch, metrics

    def position(self) -> tuple[dict[str, int], int]:
        """The loader's position and the rollout batch index after the batches trained so far: a resume draws
        the in-flight ones again."""
        if self.pending:
            return self.pending[0].loader_state, self.pending[0].index
        return self.loader.state_dict(), self.drawn


def drop_call_keys(batch: DataProto) -> None:
    """Remove the ``CALL_KEYS`` of the request that produced ``batch`` from its ``meta_info``."""
    for key in CALL_KEYS:
        batch.meta_info.pop(key, None)


def with_prompt_columns(rollout: DataProto, prompts: DataProto) -> DataProto:
    """``rollout`` (``n`` rows per prompt, adjacent) with the prompts' non-tensor columns (data source, ground
    truth, uid, ...) repeated beside them: the workers get the token columns only and never ship those back."""
    columns = prompts.select(batch_keys=[], meta_info_keys=[]).repeat(prompts.meta_info[N_SAMPLES], interleave=True)
    return rollout.union(columns)


def rollout_source(config: Any, draw: Draw, generate: Callable, rollout: Any, loader: Any, split: bool, *, steps: int):
    """The source ``trainer.rollout_mode`` names: sync, or pipelined ``trainer.batches_ahead()`` batches ahead
    (``steps``: the run's)."""
    mode = config.trainer.rollout_mode
    if mode == "sync":
        return SyncRollout(draw, generate, loader, split, config.actor_rollout_ref.rollout.allow_stale_weights)
    return PipelinedRollout(draw, rollout, loader, ahead=config.trainer.batches_ahead(), steps=steps)


def check_version(batch: DataProto, version: int, allow_stale: bool) -> None:
    """Fail (or warn, with ``allow_stale``) when a synchronous rollout did not sample with the trainer's
    current weights: the actor makes one update per step, so its version is the step count."""
    sampled = batch.meta_info.get(WEIGHT_VERSION)
    if sampled == version:
        return
    message = (
        f"step {version + 1}: the rollout sampled with weight version {sampled}, but the actor has made "
        f"{version} updates; the train-to-rollout weight sync did not run"
    )
    if not allow_stale:
        raise RuntimeError(message + " (set actor_rollout_ref.rollout.allow_stale_weights=true to only warn)")
    logger.warning(message)


def staleness(batch: DataProto, version: int, bound: int) -> dict[str, float]:
    """``async/staleness_mean`` / ``_max``: trainer version minus each response token's; more than ``bound`` is a
    bug."""
    versions = batch.batch[ROLLOUT_VERSIONS]
    valid = batch.batch[RESPONSE_MASK].bool() & (versions >= 0)
    behind = (version - versions[valid]).float()
    worst = float(behind.max()) if len(behind) else 0.0
    if worst > bound:
        raise RuntimeError(f"a sample is {worst:.0f} weight versions behind the trainer; the bound is {bound}")
    return {"async/staleness_mean": float(behind.mean()) if len(behind) else 0.0, "async/staleness_max": worst}
