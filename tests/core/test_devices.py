"""``trainer.device=auto`` (core/devices.py): the device torch finds on this machine, said in one line."""

import pytest
import torch

from hybridflow.core.devices import resolve_device


def test_auto_is_the_cpu_on_a_machine_without_gpus_and_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_device("auto") == (
        "cpu",
        "trainer.device=auto: cpu (no GPU visible to torch on this machine; trainer=gpu forces cuda)",
    )


def test_auto_is_cuda_where_torch_sees_gpus(monkeypatch):
    # torch's answer stands in for a GPU machine's (unit test: no GPU here)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert resolve_device("auto") == ("cuda", "trainer.device=auto: cuda (8 GPU(s) visible to torch on this machine)")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_named_device_is_kept_without_a_line(monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: device == "cpu")  # the machine does not decide
    assert resolve_device(device) == (device, "")
