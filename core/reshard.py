"""Train-to-rollout resharding (the 3D-HybridEngine's weight move). Work in progress.

:class:`TensorSlice` says which block of a full weight one rank's rollout
shard holds; the layout plan of a model family (for HF Qwen2 / Llama:
``hybridflow.workers.rollout.tp_plan``) maps each parameter to one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TensorSlice"]


@dataclass(frozen=True)
class TensorSlice:
    """The block ``[start, stop)`` of a full tensor along ``dim``; ``dim=None``: the whole tensor (replicated)."""

    dim: int | None
    start: int = 0
    stop: int = 0

    @classmethod
    def full(cls) -> TensorSlice:
        """The whole tensor (a replicated parameter)."""
        return cls(None)

    def shape(self, full_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of this block of a tensor of ``full_shape``."""
        if self.dim is None:
            return tuple(full_shape)
        out = list(full_shape)
        out[self.dim] = self.stop - self.start
        return tuple(out)

    def take(self, full):
        """This block of ``full`` (a view)."""
        if self.dim is None:
            return full
        return full.narrow(self.dim, self.start, self.stop - self.start)
