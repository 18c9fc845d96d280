"""``core/memory.py``: a call's peak on a CPU is its own, not what the heap kept from the call before."""

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
