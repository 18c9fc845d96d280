"""Running untrusted Python (model outputs) in a separate, isolated process tree.

Used by the code verifier (``rewards/``) and the Python tool (``agents/``): :func:`run_python` in
:mod:`.runner`, the launcher script in :mod:`.launcher`, the memory guard in :mod:`.memory`."""

from hybridflow.sandbox.runner import SandboxLimits, SandboxResult, SandboxUnavailableError, run_python

__all__ = ["SandboxLimits", "SandboxResult", "SandboxUnavailableError", "run_python"]
