"""Colocated roles: two worker classes in one process per bundle, one handle per role."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from hybridflow.core import (
    DP_COMPUTE_PROTO,
    ONE_TO_ALL,
    ColocatedWorkerGroup,
    DataProto,
    ResourcePool,
    RoleSpec,
    Worker,
    register,
)

pytestmark = pytest.mark.timeout(180)


class ActorRole(Worker):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale
        self.init_process_group()

    @register(dispatch=ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch=ONE_TO_ALL)
    def name(self) -> str:
        return "actor"

    @register(dispatch=DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"old_log_probs": data.batch["x"] * self.scale})


class RefRole(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.init_process_group()  # already initialized by the actor role: reused

    @register(dispatch=ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch=ONE_TO_ALL)
    def name(self) -> str:
        return "ref"

    @register(dispatch=DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"ref_log_probs": -data.batch["x"]})

    @register(dispatch=ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        t = torch.tensor([float(self.rank)])
        dist.all_reduce(t)
        return t.item()


def test_two_roles_share_one_process_each_with_its_handle(ray_session) -> None:
    pool = ResourcePool([2])
    roles = {"actor": RoleSpec(ActorRole, kwargs={"scale": 0.5}), "ref": RoleSpec(RefRole)}
    try:
        with ColocatedWorkerGroup(pool, roles) as wg:
            actor_pids, ref_pids = wg.actor.pid(), wg.ref.pid()
            assert actor_pids == ref_pids and len(set(actor_pids)) == 2  # same process per rank, 2 ranks
            assert [label.pid for label in wg.actor.labels] == actor_pids
            # Same method name on both roles: each handle reaches its own class.
            assert wg.actor.name() == ["actor", "actor"] and wg.ref.name() == ["ref", "ref"]
            data = DataProto.from_dict({"x": torch.arange(5, dtype=torch.float32)})
            assert wg.actor.compute_log_prob(data).batch["old_log_probs"].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
            assert wg["ref"].compute_ref_log_prob(data).batch["ref_log_probs"].tolist() == [0.0, -1.0, -2.0, -3.0, -4.0]
            assert wg.ref.all_reduce_rank() == [1.0, 1.0]  # shared process group: 0 + 1
            with pytest.raises(AttributeError, match=r"no role 'critic'.*\['actor', 'ref'\]"):
                wg.critic
            with pytest.raises(AttributeError, match="no @register-ed method 'compute_ref_log_prob'"):
                wg.actor.compute_ref_log_prob
    finally:
        pool.release()


def test_role_names_are_checked() -> None:
    with pytest.raises(ValueError, match="role name 'shutdown'"):
        ColocatedWorkerGroup(ResourcePool([1]), {"shutdown": RoleSpec(RefRole)})
    with pytest.raises(TypeError, match="must be a RoleSpec"):
        ColocatedWorkerGroup(ResourcePool([1]), {"ref": RefRole})  # type: ignore[dict-item]
