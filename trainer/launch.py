"""What every training command does around its job: ``hybridflow-train`` and ``hybridflow-train-rm`` alike.

One owner each for the command's shell: the overrides refused before Hydra (:func:`refuse_overrides`), the exit
codes (:func:`run_command`: a bad config 2, Ctrl-C 130, a worker's failure 1, each a message without a
traceback), Ray started and stopped (:func:`ray_running`), the ranks reserved or refused as a config error
(:func:`reserve_ranks`), the worker groups' threads and timeouts (:func:`group_options`), the step counter
(:class:`Progress`) and the summary table (:func:`summary_table`). A command's module keeps what is its own:
its config, its data and its training loop.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from hybridflow.core.rank_wait import WorkerError
from hybridflow.trainer.config_checks import ConfigError

logger = logging.getLogger(__name__)


def refuse_overrides(command: str, problems: Sequence[str]) -> None:
    """Exit 2 naming each bad command-line override (Hydra would refuse it too, with a traceback-like page)."""
    if problems:
        print(f"{command}: invalid override:\n  - " + "\n  - ".join(problems), file=sys.stderr, flush=True)
        sys.exit(2)


def run_command(command: str, job: Callable[[], float]) -> float:
    """Run a single (not a sweep's) job and turn its three expected endings into exit codes with a message and no
    traceback: an invalid config or data file 2 (the run directory Hydra made goes too when nothing was written
    into it), Ctrl-C 130 (the job logged the step it reached), a worker's failure, timeout or stall 1 (the error
    names the rank and the call; the job logged its last checkpoint). Anything else raises."""
    from hybridflow.trainer.run_dir import remove_unused_run_dir

    try:
        return job()
    except ConfigError as err:
        print(f"{command}: {err}", file=sys.stderr, flush=True)
        remove_unused_run_dir()
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except WorkerError as err:
        print(f"{command}: {err}", file=sys.stderr, flush=True)
        sys.exit(1)


@contextmanager
def ray_running(address: str | None) -> Iterator[None]:
    """Ray connected (``address``: a cluster's, or None for a local instance) for the block; stopped on the way
    out, also when the block fails, if this call started it (a Ray instance we did not start keeps running).

    For the block the processes the run starts (Ray's, a vLLM server) get ``OMP_NUM_THREADS=1`` where the user set
    none (each rank sets its own); it leaves with the block, so the next run in this process (a sweep's next job)
    still reads the user's own setting when it decides its threads (``settle_cpu_threads``)."""
    import ray

    from hybridflow.core import init_ray, shutdown

    started = not ray.is_initialized()
    omp_default = "OMP_NUM_THREADS" not in os.environ
    if omp_default:
        os.environ["OMP_NUM_THREADS"] = "1"
    try:
        init_ray(address=address)
        try:
            yield
        finally:
            if started:
                shutdown()
    finally:
        if omp_default:
            os.environ.pop("OMP_NUM_THREADS", None)


def reserve_ranks(process_on_nodes: list[int], *, use_gpu: bool, refusal: str, name: str = "hybridflow"):
    """A :class:`~hybridflow.core.ResourcePool` of ``process_on_nodes`` ranks per node, reserved here (the groups
    start on it), so that ranks the cluster cannot hold are a :class:`ConfigError`: ``refusal`` (which keys to
    change), then the cluster's nodes."""
    from hybridflow.core import ResourcePool
    from hybridflow.core.resource_pool import ResourceUnavailableError

    pool = ResourcePool(process_on_nodes=process_on_nodes, use_gpu=use_gpu, name=name)
    try:
        pool.bundles()
    except ResourceUnavailableError as err:
        cluster = str(err).split("Nodes in the cluster: ", 1)[-1].split(". Lower", 1)[0]
        raise ConfigError(f"invalid config:\n  - {refusal} (the cluster: {cluster})") from None
    return pool


def group_options(config: Any, **settings: Any):
    """A worker group's options from the config: its ranks' torch threads and ``trainer.timeouts`` (the RL
    trainer's config or the reward-model trainer's: both have these keys)."""
    from hybridflow.core import GroupOptions, Heartbeat

    timeouts = config.trainer.timeouts
    if config.trainer.device == "cpu" and config.trainer.cpu_threads_per_rank is None:
        raise ValueError(
            "trainer.cpu_threads_per_rank is auto (null) and not settled: config_checks.settle_cpu_threads(trainer) "
            "decides it before Ray starts (build_and_fit does)"
        )
    return GroupOptions(
        cpu_torch_threads=config.trainer.cpu_threads_per_rank,
        cpu_mmap_threshold_mb=config.trainer.cpu_mmap_threshold_mb,
        call_timeout_s=timeouts.call_s,
        collective_timeout_s=timeouts.collective_s,
        heartbeat=Heartbeat.from_timeouts(timeouts),
        **settings,
    )


def summary_table(title: str, rows: Sequence[tuple[str, str]]) -> str:
    """The lines a command prints at the end of a run: a title, a rule, one aligned ``key  value`` per row."""
    width = max(len(k) for k, _ in rows)
    return "\n".join(["", title, "-" * (width + 20), *(f"{k.ljust(width)}  {v}" for k, v in rows)])


class Progress:
    """The step counter: a tqdm bar on a terminal; in a redirected log one plain line per tenth of the run.

    Used as a context manager: while the bar is shown, the root logger's console lines go through
    ``tqdm.write`` (``logging_redirect_tqdm``), which prints each above the bar instead of into its line.
    """

    def __init__(self, total: int, initial: int = 0) -> None:
        self.total, self.step = total, initial
        self.bar = (
            tqdm(total=total, initial=initial, desc="training", unit="step", dynamic_ncols=True)
            if sys.stderr.isatty()
            else None
        )
        self.every = max(1, total // 10)
        self._redirect = ExitStack()

    def __enter__(self) -> Progress:
        if self.bar is not None:
            self._redirect.enter_context(logging_redirect_tqdm())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, **values: float) -> None:
        """One more step done; ``values`` are shown beside the count."""
        self.step += 1
        shown = {k: f"{v:.3f}" for k, v in values.items()}
        if self.bar is not None:
            self.bar.set_postfix(**shown)
            self.bar.update(1)
        elif self.step % self.every == 0 or self.step == self.total:
            logger.info(
                "training: step %d/%d %s", self.step, self.total, " ".join(f"{k}={v}" for k, v in shown.items())
            )

    def close(self) -> None:
        """Finish the bar and give the console back to the log handlers (nothing to do for plain lines)."""
        if self.bar is not None:
            self.bar.close()
        self._redirect.close()
