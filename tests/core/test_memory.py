"""``core/memory.py``: a call's peak on a CPU is its own, not what the heap kept from the call before."""

import subprocess
import sys

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
