"""Shared fixtures. Tests import the package as ``hybridflow.*``."""

from __future__ import annotations

import os

# One torch thread per process is fastest on the 2-core machines this suite
# targets, and keeps Ray workers from oversubscribing the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
