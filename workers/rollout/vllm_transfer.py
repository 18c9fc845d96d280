"""hybridflow's weight transfer as a vLLM weight-transfer backend
(``--weight-transfer-config '{"backend": "hybridflow"}'``).

vLLM 0.32 syncs an RL trainer's weights into a running engine through a pluggable *weight-transfer
engine* and four calls, the same offline (``LLM``) and online (``vllm serve``'s RL routes, with
``VLLM_SERVER_DEV_MODE=1``): ``init_weight_transfer_engine``, then per sync ``start_weight_update``,
``update_weights``, ``finish_weight_update``. Its own backends are NCCL and CUDA IPC, neither of which
runs on a CPU. This one is the transfer the split placement already uses (``core/weight_transfer.py``:
a gloo group on CPU, nccl on CUDA, one broadcast per bucket of a shared manifest, a version header
first), with each vLLM worker a receiving member::

    trainer rank 0 (member 0)  --broadcast per bucket-->  vLLM worker tp rank r (member first_member + r)
                                                           model.load_weights((name, full tensor)) per weight,
                                                           inside vLLM's layerwise reload (start / finish)

vLLM finds the backend through its ``vllm.general_plugins`` entry point (``setup.cfg``), which it
loads in every process it starts; :func:`register` adds it to ``WeightTransferEngineFactory``.
Nothing here is imported unless vLLM runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from hybridflow.core.weight_transfer import WeightTransfer

__all__ = ["BACKEND", "HybridflowInitInfo", "HybridflowUpdateInfo", "HybridflowWeightTransferEngine", "register"]

logger = logging.getLogger(__name__)

BACKEND = "hybridflow"
"""The backend name for ``WeightTransferConfig(backend=...)`` / ``--weight-transfer-config``."""


@dataclass
class HybridflowInitInfo(WeightTransferInitInfo):
    """Where the transfer group meets: the TCP store the trainer's rank 0 hosts, the group's size, the member
    index of this engine's tp rank 0 (rank r joins as ``first_member + r``), and the bound of the join and of each
    broadcast (``trainer.timeouts.weight_sync_s``)."""

    host: str
    port: int
    members: int
    first_member: int = 1
    timeout_s: float = 600.0


@dataclass
class HybridflowUpdateInfo(WeightTransferUpdateInfo):
    """One sync: the bucket size both ends cut the manifest into (``rollout.reshard_bucket_mb``)."""

    bucket_bytes: int


class HybridflowWeightTransferEngine(WeightTransferEngine[HybridflowInitInfo, HybridflowUpdateInfo]):
    """Receives :class:`~hybridflow.core.weight_transfer.WeightTransfer` syncs into a vLLM worker's model."""

    init_info_cls = HybridflowInitInfo
    update_info_cls = HybridflowUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.transfer: WeightTransfer | None = None
        self.last_version: int | None = None

    def init_transfer_engine(self, init_info: HybridflowInitInfo) -> None:
        """Join the transfer group (waits for the trainer's rank 0 and the other members) and read its manifest."""
        member = init_info.first_member + self.parallel_config.rank
        self.transfer = WeightTransfer(
            init_info.host, init_info.port, member, init_info.members, self.device, timeout_s=init_info.timeout_s
        )
        self.transfer.read_manifest()
        logger.info("joined the hybridflow weight transfer as member %d of %d", member, init_info.members)

    def start_weight_update(self) -> None:
        """Layerwise reload from here: each layer is re-processed for its kernels once its weights are in."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload  # noqa: PLC0415

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: HybridflowUpdateInfo) -> None:
        """Receive one transfer (blocks until the trainer has broadcast every bucket), each weight through the
        model's own ``load_weights``."""
        from hybridflow.workers.rollout.vllm_engine import vllm_weight_name  # noqa: PLC0415

        if self.transfer is None:
            raise RuntimeError("init_weight_transfer_engine was not called")
        incoming = self.transfer.incoming(update_info.bucket_bytes)
        with torch.no_grad():
            for name, tensor in incoming:
                target = vllm_weight_name(name)
                if target is not None:
                    self.model.load_weights([(target, tensor)])
        stats = incoming.stats()
        self.last_version = stats.version
        logger.info("received weight version %d: %.1f MiB in %.3f s", stats.version, stats.bytes / 2**20, stats.seconds)

    def finish_weight_update(self) -> None:
        """Finish the layerwise reload, then re-pack a tied LM head (see ``vllm_engine.refresh_tied_head``)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload  # noqa: PLC0415

        from hybridflow.workers.rollout.vllm_engine import refresh_tied_head  # noqa: PLC0415

        finalize_layerwise_reload(self.model, self.model_config)
        refresh_tied_head(self.model)

    def shutdown(self) -> None:
        """Let go of the transfer group."""
        if self.transfer is not None:
            self.transfer.close()
            self.transfer = None


def register() -> None:
    """vLLM's ``vllm.general_plugins`` hook: add the ``hybridflow`` backend (vLLM may call it more than once)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory  # noqa: PLC0415

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "HybridflowWeightTransferEngine")
    except ValueError:  # already registered in this process
        pass
