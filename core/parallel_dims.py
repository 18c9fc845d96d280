"""The parallel layout of a run, owned by one object: :class:`ParallelDims`.

Every size that depends on how the ranks are split is answered here, once:
the meshes of the actor's training layout (dp x tp), of its rollout layout
(dp x tp), of the critic, the reference and the reward model (FSDP over all ranks), and how
many rows each rank holds per mini-batch and per micro-batch for each role.
The config check asks :meth:`ParallelDims.problems` for every divisibility
rule (key, value, what would work) before anything starts; the workers and
the trainer take their sizes from the same object, so no worker recomputes
one and two copies cannot disagree.

The global mini-batch (``ppo_mini_batch_size`` prompts x ``n`` samples) is the
unit of one optimizer step. Its rows are the same whatever the layout:
:meth:`RoleLayout.arrange_for_update` orders a batch so that the contiguous
dp split hands rank r its share of mini-batch 0, then of mini-batch 1, and
so on. The actor (dp = ranks / p) and the critic (dp = ranks) therefore step
on the same rows, and a different dp size changes no optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.core.data_proto import DataProto

__all__ = ["ParallelDims", "RoleLayout"]


@dataclass(frozen=True)
class RoleLayout:
    """One role's mesh and its per-rank batch sizes.

    ``dp`` x ``tp`` ranks; ``rows_per_mini_batch`` is one dp rank's share of
    a global mini-batch (0 for roles that do not train); ``micro_batch_rows``
    the rows of one forward/backward pass.
    """

    dp: int
    tp: int = 1
    rows_per_mini_batch: int = 0
    micro_batch_rows: int = 1

    @property
    def mesh(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """``(shape, dim names)`` for ``Worker.init_device_mesh``: ``(dp, tp)`` of consecutive tp groups, or 1-D
        ``(dp,)``."""
        return ((self.dp, self.tp), ("dp", "tp")) if self.tp > 1 else ((self.dp,), ("dp",))

    def arrange_for_update(self, batch: DataProto) -> DataProto:
        """``batch`` reordered (a new DataProto) so that a contiguous split over ``dp`` ranks gives each rank
        its share of every global mini-batch, in mini-batch order.

        Global mini-batch k is rows ``[k*M, (k+1)*M)`` of ``batch`` with
        ``M = dp * rows_per_mini_batch``; rank r's local mini-batch k is then
        rows ``k*M + r*m .. k*M + (r+1)*m`` (``m = rows_per_mini_batch``).
        """
        m, rows = self.rows_per_mini_batch, len(batch)
        if m < 1 or rows % (m * self.dp):
            raise ValueError(f"{rows} rows do not split into mini-batches of {self.dp} ranks x {m} rows")
        order = torch.arange(rows).view(rows // (m * self.dp), self.dp, m).transpose(0, 1).reshape(-1)
        return batch[order]


@dataclass(frozen=True)
class ParallelDims:
    """World size, tensor-parallel degrees and batch sizes of a run; see the module docstring.

    Build it with :meth:`from_config`; :meth:`problems` lists what does not
    divide. The layouts (:attr:`actor`, :attr:`rollout`, :attr:`critic`,
    :attr:`ref`) are only meaningful when there are no problems.
    """

    world_size: int
    actor_tp: int
    rollout_tp: int
    train_batch_size: int
    """Prompts per step."""
    mini_batch_size: int
    """Prompts per optimizer step."""
    n: int
    """Samples per prompt."""
    actor_micro_batch_rows: int
    critic_micro_batch_rows: int
    use_critic: bool = False
    rollout_ranks: int = 0
    """Ranks of the rollout's own pool (``trainer.placement=split``); 0: the rollout shares the training ranks."""

    @classmethod
    def from_config(cls, config: Any, *, use_critic: bool = False) -> ParallelDims:
        """The layout a ``PPOConfig``-shaped config asks for (``use_critic``: whether a critic is built)."""
        arr, trainer = config.actor_rollout_ref, config.trainer
        return cls(
            world_size=trainer.nnodes * trainer.n_gpus_per_node,
            actor_tp=arr.actor.tensor_model_parallel_size,
            rollout_tp=arr.rollout.tensor_model_parallel_size,
            train_batch_size=config.data.train_batch_size,
            mini_batch_size=arr.actor.ppo_mini_batch_size,
            n=arr.rollout.n,
            actor_micro_batch_rows=arr.actor.ppo_micro_batch_size_per_gpu,
            critic_micro_batch_rows=config.critic.ppo_micro_batch_size_per_gpu,
            use_critic=use_critic,
            rollout_ranks=trainer.rollout_ranks if trainer.placement == "split" else 0,
        )

    # ---------------------------------------------------------------- sizes
    @property
    def rows_per_step(self) -> int:
        """Rows (prompt x sample) of one step's batch."""
        return self.train_batch_size * self.n

    @property
    def rows_per_mini_batch(self) -> int:
        """Rows of one global mini-batch (one optimizer step), all ranks together."""
        return self.mini_batch_size * self.n

    @property
    def optimizer_steps_per_epoch(self) -> int:
        """Optimizer steps of one pass over a step's batch, the same for actor and critic."""
        return self.train_batch_size // self.mini_batch_size

    @property
    def actor(self) -> RoleLayout:
        """The actor's training layout: ``(ranks / p) x p``, FSDP2 over dp, tensor parallel p."""
        dp = self.world_size // self.actor_tp
        return RoleLayout(dp, self.actor_tp, self.rows_per_mini_batch // dp, self.actor_micro_batch_rows)

    @property
    def split(self) -> bool:
        """Whether the rollout has ranks of its own (``trainer.placement=split``)."""
        return self.rollout_ranks > 0

    @property
    def rollout_world_size(self) -> int:
        """Ranks that generate: the rollout's own pool when split, else the training ranks."""
        return self.rollout_ranks or self.world_size

    @property
    def rollout(self) -> RoleLayout:
        """The rollout layout: groups of q consecutive ranks (of the rollout's own pool when split) decode the same
        prompts."""
        return RoleLayout(self.rollout_world_size // self.rollout_tp, self.rollout_tp)

    @property
    def critic(self) -> RoleLayout:
        """The critic: FSDP2 over all ranks."""
        dp = self.world_size
        return RoleLayout(dp, 1, self.rows_per_mini_batch // dp, self.critic_micro_batch_rows)

    @property
    def ref(self) -> RoleLayout:
        """The reference policy: FSDP2 over all ranks, the actor's micro-batch for its forward passes."""
        return RoleLayout(self.world_size, 1, 0, self.actor_micro_batch_rows)

    @property
    def reward_model(self) -> RoleLayout:
        """The reward model: FSDP2 over all ranks, no-grad forwards only (its micro-batches are its own config's)."""
        return RoleLayout(self.world_size)

    # ----------------------------------------------------------- validation
    def problems(self) -> list[str]:
        """Every rule the layout breaks, each naming the key, its value and what would work."""
        world_key = "trainer.nnodes x trainer.n_gpus_per_node"
        if self.world_size < 1:
            return [f"{world_key} = {self.world_size}; need at least one rank"]
        out: list[str] = []
        rollout_key = "trainer.rollout_ranks" if self.split else world_key
        tp_keys = {
            "actor": ("actor_rollout_ref.actor.tensor_model_parallel_size", self.actor_tp, world_key, self.world_size),
            "rollout": (
                "actor_rollout_ref.rollout.tensor_model_parallel_size",
                self.rollout_tp,
                rollout_key,
                self.rollout_world_size,
            ),
        }
        for side, (key, size, ranks_key, ranks) in tp_keys.items():
            if size < 1:
                out.append(f"{key}={size} must be >= 1")
            elif ranks % size:
                out.append(
                    f"{ranks_key}={ranks} must be a multiple of {size} ({side} tensor-parallel "
                    f"groups of {key}={size} consecutive ranks tile the ranks); "
                    f"allowed sizes: {_divisors(ranks)}"
                )
        for key, value in (
            ("data.train_batch_size", self.train_batch_size),
            ("actor_rollout_ref.actor.ppo_mini_batch_size", self.mini_batch_size),
            ("actor_rollout_ref.rollout.n", self.n),
            ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", self.actor_micro_batch_rows),
            ("critic.ppo_micro_batch_size_per_gpu", self.critic_micro_batch_rows),
        ):
            if value < 1:
                out.append(f"{key}={value} must be >= 1")
        if out:
            return out
        _divides(
            out,
            "data.train_batch_size",
            self.train_batch_size,
            self.mini_batch_size,
            "each step is split into whole mini-batches of actor.ppo_mini_batch_size prompts",
        )
        ranks = f"trainer.nnodes x trainer.n_gpus_per_node={self.world_size}"
        rollout_ranks = f"trainer.rollout_ranks={self.rollout_ranks}" if self.split else ranks
        _divides(
            out,
            "data.train_batch_size",
            self.train_batch_size,
            self.rollout.dp,
            f"each step's prompts are split evenly over the {self.rollout.dp} rollout data-parallel ranks: "
            f"{rollout_ranks} / rollout tp {self.rollout_tp}",
        )
        roles = {"training": (self.actor.dp, f"{ranks} / actor tp {self.actor_tp}")}
        if self.use_critic:
            roles["critic"] = (self.critic.dp, f"{ranks}, FSDP over all")
        for role, (dp, source) in roles.items():
            _divides(
                out,
                "actor_rollout_ref.actor.ppo_mini_batch_size x rollout.n",
                self.rows_per_mini_batch,
                dp,
                f"each mini-batch's rows are split evenly over the {dp} {role} data-parallel ranks: {source}",
            )
        return out


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _divides(out: list[str], key: str, value: int, divisor: int, why: str) -> None:
    if value % divisor:
        out.append(f"{key}={value} must be a multiple of {divisor} ({why})")
