"""``core/memory.py``: a call's peak on a CPU is its own, not what the heap kept from the call before."""

import os
import subprocess
import sys

import pytest
import torch

from hybridflow.core.memory import measure


def test_a_call_after_a_large_one_measures_its_own_peak_not_the_heap_s_leftovers():
    cpu = torch.device("cpu")
    torch.ones(2**21)  # 8 MiB, mapped and unmapped: glibc then serves blocks up to that size from its heap
    kept = []
    with measure(cpu) as large:
        blocks = []
        for _ in range(128):  # 512 MiB in 4 MiB blocks, each followed by a small tensor that stays
            blocks.append(torch.ones(2**20))
            kept.append(torch.ones(256))
        del blocks  # holes between live tensors: the heap keeps their pages unless it is trimmed
    with measure(cpu) as small:
        torch.ones(16)
    assert large[0] - small[0] > 0.4, (large, small)  # GiB: the small call does not carry the large one's 0.5


HELD_AFTER_FREE = """
import sys, torch
from hybridflow.core.memory import map_large_allocations
if sys.argv[1] == "mapped":
    assert map_large_allocations(1.0)
torch.ones(2**22)  # 16 MiB, mapped and unmapped: glibc's own threshold rises to it
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 2**20
kept, blocks, before = [], [], rss()
for _ in range(64):  # 512 MiB in 8 MiB blocks, each followed by a small tensor that stays
    blocks.append(torch.ones(2**21))
    kept.append(torch.ones(256))
del blocks
print(rss() - before)
"""


def test_with_large_blocks_mapped_apart_freed_tensors_leave_the_resident_set():
    """What ``trainer.cpu_mmap_threshold_mb`` does to a rank (each case in a fresh process: the setting is for good)."""

    def held_gb(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", HELD_AFTER_FREE, mode], capture_output=True, text=True, check=True)
        return float(out.stdout.split()[-1])

    assert held_gb("glibc") > 0.4  # GiB: the heap keeps the 0.5 freed
    assert held_gb("mapped") < 0.05


ANON_HUGE_KB = """
import torch
def huge_kb():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))
before = huge_kb()
block = torch.ones(2**24)  # 64 MiB, every page touched
print(huge_kb() - before)  # the block's share: the process may hold huge pages already
"""


def _huge_pages_possible() -> bool:
    import platform

    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        return False
    libc, version = platform.libc_ver()
    return "[never]" not in mode and libc == "glibc" and tuple(map(int, version.split("."))) >= (2, 35)


def anon_huge_kb(env: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", ANON_HUGE_KB], capture_output=True, text=True, check=True, env=env)
    return int(out.stdout.split()[-1])


def test_the_huge_page_tunable_is_added_to_what_the_environment_has_and_an_explicit_setting_wins():
    from hybridflow.core.memory import huge_page_environment

    assert huge_page_environment({}) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert huge_page_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    }
    off = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2"}
    assert huge_page_environment(off) == off


@pytest.mark.skipif(not _huge_pages_possible(), reason="needs glibc 2.35+ and transparent huge pages not 'never'")
def test_with_the_tunable_a_large_tensor_lies_on_huge_pages():
    from hybridflow.core.memory import huge_page_environment

    plain = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    assert anon_huge_kb(plain | huge_page_environment(plain)) >= 32 * 1024  # half the block at least, in 2 MiB pages
    assert anon_huge_kb(plain | {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) < 4 * 1024


@pytest.mark.skipif(not _huge_pages_possible(), reason="needs glibc 2.35+ and transparent huge pages not 'never'")
def test_a_local_ray_instance_s_workers_use_huge_pages(ray_session):
    if "RAY_ADDRESS" in os.environ:
        pytest.skip("a joined cluster keeps the environment it was started with")

    @ray_session.remote(num_cpus=0.1)
    def huge_kb(source: str) -> int:  # the same script as anon_huge_kb's, run in a worker of the instance
        import contextlib
        import io

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(source, {})
        return int(printed.getvalue().split()[-1])

    assert ray_session.get(huge_kb.remote(ANON_HUGE_KB)) >= 32 * 1024
