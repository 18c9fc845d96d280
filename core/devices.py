"""``trainer.device=auto``: the device a run trains on, found on the machine that starts it.

veRL's scripts assume GPUs and hybridflow's tiny default job runs on CPUs; ``auto`` lets either run as written
where it is started. It is resolved once, by the command that reads the config, before anything checks or
builds from it: everything past that point sees ``cpu`` or ``cuda``.
"""

from __future__ import annotations

__all__ = ["AUTO", "DEVICES", "resolve_device"]

AUTO = "auto"
DEVICES = ("cpu", "cuda")
"""What a run trains on: ``cpu`` (gloo between ranks) or ``cuda`` (nccl)."""


def resolve_device(asked: str) -> tuple[str, str]:
    """``(device, why)``: ``asked`` itself when it names a device; for ``auto``, ``cuda`` when torch sees a GPU
    on this machine, else ``cpu``, with the line a run prints to say which it took. (The workers of a Ray
    cluster started elsewhere may have what this machine lacks: name the device there.)"""
    if asked != AUTO:
        return asked, ""
    import torch  # noqa: PLC0415 - only an auto device needs it, and a bad config is refused without it

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        return "cuda", f"trainer.device=auto: cuda ({gpus} GPU(s) visible to torch on this machine)"
    return "cpu", "trainer.device=auto: cpu (no GPU visible to torch on this machine; trainer=gpu forces cuda)"
