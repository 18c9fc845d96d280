"""Peak memory of one call on one rank: CUDA's allocator on a GPU, the process's resident set on a CPU.

:func:`measure` is what the worker host wraps every data-parallel call in
(``core/worker.py``), so each stage reports the most memory it held:

* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``
  (tensors only; the caching allocator's reserve and the CUDA context are not counted);
* CPU: the process's peak resident set (``VmHWM`` of ``/proc/self/status``),
  reset before the call by writing 5 to ``/proc/self/clear_refs``, after
  glibc's heap has given its free pages back (``malloc_trim(0)``: otherwise
  a stage's figure is the largest earlier stage's, whose freed memory the
  heap keeps, and the process holds it for good). Colocated roles share the
  process, so this is everything the rank holds, not just the call's own
  tensors. Where the kernel refuses the reset, the figure is the peak since
  the process started (still an upper bound).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch

__all__ = [
    "MEMORY_PEAK_GB",
    "huge_page_environment",
    "map_large_allocations",
    "measure",
    "peak_gb",
    "reset_peak",
    "trim_heap",
]

MEMORY_PEAK_GB = "memory/peak_gb"
"""The metric a measured call's output carries (``meta_info["metrics"]`` of a DataProto, or a metrics dict)."""


def reset_peak(device: torch.device) -> None:
    """Start a new peak for ``device`` (CUDA statistics, or the process's resident-set high-water mark)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    trim_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux, or not allowed: the peak since start-up stands


def trim_heap() -> None:
    """Give the pages glibc's heap holds free back to the system (``malloc_trim(0)``: microseconds with nothing to
    give back, tens of ms for GBs). Host memory only: CUDA's allocator is not touched. Nothing where there is no
    glibc."""
    trim = _libc("malloc_trim")
    if trim is not None:
        trim(0)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def map_large_allocations(threshold_mb: float) -> bool:
    """Have glibc's malloc map every block of at least ``threshold_mb`` MiB on its own and unmap it when freed
    (``mallopt(M_MMAP_THRESHOLD)``, which also stops glibc moving the threshold). glibc's own threshold rises to
    the largest block freed so far (up to 32 MiB), so a process that frees large tensors takes later ones from its
    heap, and the pages a stage frees stay resident until a trim: the resident set of a CPU rank then runs ahead
    of what it holds (``trainer.cpu_mmap_threshold_mb`` says by how much). False where there is no glibc, or it
    refuses the value (over 32 MiB)."""
    mallopt = _libc("mallopt")
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, int(threshold_mb * 2**20)))


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb"
"""glibc's tunable (2.35+) that has malloc ask for transparent huge pages (``madvise``) for its heap and mapped
blocks; other glibc versions ignore it, as does a kernel whose THP is ``never``."""


def huge_page_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ``'s ``GLIBC_TUNABLES`` with ``glibc.malloc.hugetlb=1`` added, unless it sets that tunable
    already (``=0`` turns it off); for the processes a local Ray instance starts, which inherit it.

    Why: a CPU rank's large tensors are fresh pages at every stage (the measured calls trim the heap, and blocks
    over ``trainer.cpu_mmap_threshold_mb`` are mapped on their own), faulted in one page at a time: a ~3M model's
    128-token update took 2.71 s with 4 KiB pages, 2.28 s with 2 MiB ones (docs/benchmarks.md, "Scaling")."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(part.split("=")[0] == HUGE_PAGES_TUNABLE for part in tunables.split(":")):
        return {"GLIBC_TUNABLES": tunables}
    return {"GLIBC_TUNABLES": ":".join(filter(None, [tunables, f"{HUGE_PAGES_TUNABLE}=1"]))}


@functools.cache
def _libc(name: str) -> Callable[[int], int] | Callable[[int, int], int] | None:
    """glibc's function ``name``, resolved once (None where there is no glibc)."""
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def peak_gb(device: torch.device) -> float:
    """The peak since :func:`reset_peak`, in GiB (0.0 where it cannot be read)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20  # kB
    except OSError:
        pass
    return 0.0


@contextmanager
def measure(device: torch.device) -> Iterator[list[float]]:
    """``with measure(device) as peak: ...``; afterwards ``peak[0]`` is the call's peak in GiB."""
    out: list[float] = []
    reset_peak(device)
    try:
        yield out
    finally:
        out.append(peak_gb(device))
