"""ResourcePool: bundles reserved as one Ray placement group per node.

``ResourcePool(process_on_nodes=[4, 4], use_gpu=True)`` asks for two nodes
with four bundles (one rank each) on each. Each node's bundles form one
``STRICT_PACK`` placement group pinned to a distinct node, and ranks are
numbered node by node, nodes ordered by (IP address, node id), so rank order is
the same on every run. Nodes where no placement group holds bundles yet are
taken first: a second pool (the split rollout's) lands on nodes of its own
where there are any.

Ray leaves an actor that asks for missing resources pending forever without a
word. The pool checks first: an ask no node can meet is an error at once, and
a placement group still unplaced after ``ready_timeout_s`` (resources held by
someone else) is an error naming what was asked and what is free.
"""

from __future__ import annotations

import ipaddress
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

__all__ = ["ResourcePool", "ResourceUnavailableError", "Bundle", "DEFAULT_CPUS_PER_CPU_BUNDLE"]

logger = logging.getLogger(__name__)

NODE_ID_LABEL = "ray.io/node-id"

DEFAULT_CPUS_PER_CPU_BUNDLE = 0.25
"""A CPU-only rank asks for a quarter CPU, so a 2-core machine hosts groups of
more ranks than cores (each rank runs one torch thread)."""


class ResourceUnavailableError(RuntimeError):
    """The cluster cannot (or not in time) provide the bundles a pool asked for."""


@dataclass(frozen=True)
class Bundle:
    """Where rank ``rank`` of a pool runs: a placement group and a bundle index in it."""

    rank: int
    placement_group: PlacementGroup
    bundle_index: int
    node_id: str
    node_ip: str
    local_rank: int
    local_world_size: int


def _remove_and_wait(pgs: Sequence[PlacementGroup], timeout_s: float) -> None:
    for pg in pgs:
        remove_placement_group(pg)
    deadline = time.monotonic() + timeout_s
    while any(placement_group_table(pg).get("state") != "REMOVED" for pg in pgs):
        if time.monotonic() > deadline:
            logger.warning("placement groups not removed after %.0f s; continuing", timeout_s)
            return
        time.sleep(0.05)


def _node_sort_key(node: dict) -> tuple:
    ip = node["NodeManagerAddress"]
    try:
        parsed: tuple = (0, int(ipaddress.ip_address(ip)))
    except ValueError:
        parsed = (1, ip)
    return (*parsed, node["NodeID"])


def _nodes_with_placement_groups() -> set[str]:
    """The ids of the nodes where a placement group (of this run or another job) holds bundles now."""
    return {
        node
        for table in placement_group_table().values()
        if table["state"] in ("CREATED", "PREPARED")
        for node in table["bundles_to_node_id"].values()
    }


class ResourcePool:
    """Bundles on nodes, one Ray placement group per node.

    Args:
        process_on_nodes: ranks (bundles) wanted on each node, e.g. ``[8, 8]``.
        use_gpu: one GPU per bundle when True, CPU-only bundles otherwise.
        max_colocate_count: how many separate Ray actors may share a bundle
            (each then asks for ``1 / max_colocate_count`` of it). Roles fused
            by colocation share one actor and need no extra count.
        cpus_per_bundle: CPUs per bundle; default 1 with GPUs,
            :data:`DEFAULT_CPUS_PER_CPU_BUNDLE` without.
        ready_timeout_s: how long to wait for placement before failing.
        name: prefix of the placement group names.
    """

    def __init__(
        self,
        process_on_nodes: Sequence[int],
        use_gpu: bool = False,
        max_colocate_count: int = 1,
        cpus_per_bundle: float | None = None,
        ready_timeout_s: float = 30.0,
        name: str = "hybridflow",
    ) -> None:
        if not process_on_nodes or any(int(n) <= 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must be positive counts, got {list(process_on_nodes)}")
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count}")
        self.process_on_nodes = [int(n) for n in process_on_nodes]
        self.use_gpu = use_gpu
        self.max_colocate_count = max_colocate_count
        self.cpus_per_bundle = float(
            cpus_per_bundle if cpus_per_bundle is not None else (1.0 if use_gpu else DEFAULT_CPUS_PER_CPU_BUNDLE)
        )
        self.ready_timeout_s = ready_timeout_s
        self.name = name
        self._bundles: list[Bundle] | None = None
        self._groups = 0

    @property
    def world_size(self) -> int:
        """Total number of bundles (ranks)."""
        return sum(self.process_on_nodes)

    def bundle_resources(self) -> dict[str, float]:
        """Resources of one bundle."""
        res = {"CPU": self.cpus_per_bundle}
        if self.use_gpu:
            res["GPU"] = 1.0
        return res

    def actor_resources(self) -> dict[str, float]:
        """Resources one actor asks for inside a bundle (``num_cpus``, ``num_gpus``)."""
        share = 1.0 / self.max_colocate_count
        return {"num_cpus": self.cpus_per_bundle * share, "num_gpus": share if self.use_gpu else 0.0}

    def bundles(self) -> list[Bundle]:
        """Reserve (once) and return the bundles in rank order."""
        if self._bundles is None:
            self._bundles = self._reserve()
        return self._bundles

    def claim(self) -> None:
        """Count one more group of actors on the bundles; error past ``max_colocate_count``.

        Without this check Ray would leave the extra actors pending forever.
        """
        if self._groups >= self.max_colocate_count:
            raise ResourceUnavailableError(
                f"ResourcePool already hosts {self._groups} worker group(s) and max_colocate_count="
                f"{self.max_colocate_count}; shut one down, raise max_colocate_count, or fuse the roles into one "
                "ColocatedWorkerGroup (fused roles share one actor)"
            )
        self._groups += 1

    def unclaim(self) -> None:
        """A group claimed with :meth:`claim` has shut down."""
        self._groups = max(0, self._groups - 1)

    def release(self, timeout_s: float = 10.0) -> None:
        """Remove the placement groups (Ray kills actors still in them).

        Waits (at most ``timeout_s``) until Ray reports them removed, so the
        resources are free for the next pool when this returns.
        """
        if self._bundles is None:
            return
        pgs = list({b.placement_group.id: b.placement_group for b in self._bundles}.values())
        self._bundles = None
        self._groups = 0
        _remove_and_wait(pgs, timeout_s)

    # ---------------------------------------------------------------- private
    def _describe_ask(self) -> str:
        res = ", ".join(f"{k}={v:g}" for k, v in self.bundle_resources().items())
        return f"{len(self.process_on_nodes)} node(s) with {self.process_on_nodes} bundles of {{{res}}}"

    def _assign_nodes(self) -> list[dict]:
        # nodes no placement group holds anything on come first, so a second pool of the run (the split
        # rollout's) gets nodes of its own where the cluster has them, and shares a node only where it must
        held = _nodes_with_placement_groups()
        nodes = sorted(
            (n for n in ray.nodes() if n.get("Alive")), key=lambda n: (n["NodeID"] in held, _node_sort_key(n))
        )
        per_bundle = self.bundle_resources()
        chosen: list[dict] = []
        for count in self.process_on_nodes:
            need = {k: v * count for k, v in per_bundle.items()}
            fit = next(
                (
                    n
                    for n in nodes
                    if n not in chosen and all(n["Resources"].get(k, 0.0) >= v - 1e-9 for k, v in need.items())
                ),
                None,
            )
            if fit is None:
                totals = "; ".join(
                    f"{n['NodeManagerAddress']} ({n['NodeID'][:8]}): CPU={n['Resources'].get('CPU', 0):g}, "
                    f"GPU={n['Resources'].get('GPU', 0):g}"
                    for n in nodes
                )
                raise ResourceUnavailableError(
                    f"ResourcePool asked for {self._describe_ask()}, one node each, but no remaining node has "
                    f"{ {k: round(v, 3) for k, v in need.items()} } in total. "
                    f"Nodes in the cluster: {totals or 'none'}. "
                    "Lower process_on_nodes / cpus_per_bundle, set use_gpu=False, or add nodes."
                )
            chosen.append(fit)
        return chosen

    def _reserve(self) -> list[Bundle]:
        nodes = self._assign_nodes()
        pgs = []
        tag = uuid.uuid4().hex[:8]  # placement group names must be unique in the cluster
        for i, (node, count) in enumerate(zip(nodes, self.process_on_nodes)):
            pgs.append(
                placement_group(
                    [self.bundle_resources()] * count,
                    strategy="STRICT_PACK",
                    name=f"{self.name}_{tag}_node{i}_{node['NodeID'][:8]}",
                    bundle_label_selector=[{NODE_ID_LABEL: node["NodeID"]}] * count,
                )
            )
        ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.ready_timeout_s)
        if len(ready) < len(pgs):
            _remove_and_wait(pgs, 10.0)
            raise ResourceUnavailableError(
                f"ResourcePool asked for {self._describe_ask()}; after {self.ready_timeout_s:g} s only {len(ready)} of "
                f"{len(pgs)} placement groups were placed. Free now: {ray.available_resources()}. Other groups or "
                "pools hold the rest: shut them down (RayWorkerGroup.shutdown, ResourcePool.release) or ask for less."
            )
        bundles = []
        rank = 0
        for pg, node, count in zip(pgs, nodes, self.process_on_nodes):
            for j in range(count):
                bundles.append(Bundle(rank, pg, j, node["NodeID"], node["NodeManagerAddress"], j, count))
                rank += 1
        logger.info("reserved %s", self._describe_ask())
        return bundles
