"""A resource pool: one Ray placement group whose bundles host the ranks of a WorkerGroup."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import ray
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from mmrl.controller import reuse
from mmrl.controller.host import WorkerHost
from mmrl.controller.reuse import HostSpec, IdlePool, PoolShape

RemoteHost = ray.remote(WorkerHost)
# Shares of one bundle add up to 1 (e.g. three colocated groups take 1/3 each): a float sum may exceed it by this.
SHARE_SLACK = 1e-9
NODE_WAIT_S = 10.0  # how long a placed group's bundle may show no node in Ray's table


@dataclass
class ResourcePool:
    """``world_size`` bundles of ``cpus_per_worker`` CPUs (and one GPU each when ``use_gpu``).

    Worker groups placed on the pool :meth:`acquire` it and :meth:`release` it when they shut down; the
    placement group is removed when the last one releases it. With ``reuse``, the hosts the groups gave back
    stay idle for later pools (:mod:`mmrl.controller.reuse`): on CPU, outside the placement group, for any
    pool on their node; on GPU, with the placement group, for the next pool of the same shape.
    """

    world_size: int
    cpus_per_worker: float = 1.0
    use_gpu: bool = False
    name: str = "pool"
    reuse: bool = False
    """Keep the healthy processes of the groups that shut down, idle, for later groups of the same shape
    (``resources.reuse_workers``); also take such processes from earlier pools."""
    _pg: PlacementGroup | None = field(default=None, init=False, repr=False)
    _users: int = field(default=0, init=False, repr=False)
    _idle: list[tuple[HostSpec, ActorHandle]] = field(default_factory=list, init=False, repr=False)
    _taken: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    """bundle -> the share of it that live and idle hosts hold."""

    @property
    def shape(self) -> PoolShape:
        return (self.world_size, float(self.cpus_per_worker), self.use_gpu)

    @property
    def floating(self) -> bool:
        """Whether this pool's hosts run outside its placement group (reused CPU hosts: see
        :mod:`mmrl.controller.reuse`), the placement group only reserving their CPUs."""
        return self.reuse and not self.use_gpu

    def threads(self, spec: HostSpec) -> int:
        """The torch threads of a rank of spec ``spec``: its own setting, else as many as its CPUs (at least
        one), as Ray's OMP_NUM_THREADS gives a process it starts for them."""
        return spec.threads or max(1, int(self.cpus_per_worker * spec.share))

    def placement_group(self, want: HostSpec | None = None) -> PlacementGroup:
        """This pool's placement group: an idle one of the same shape (with ``reuse``; preferring one that
        holds a host of spec ``want``), else a new one, for which every idle pool is removed first."""
        if self._pg is None:
            idle = reuse.take(self.shape, want) if self.reuse and not self.floating else None
            if idle is not None:
                self._pg, self._idle = idle.pg, idle.hosts
                for spec, _ in idle.hosts:
                    self._taken[spec.bundle] = self._taken.get(spec.bundle, 0.0) + spec.share
            else:
                reuse.release_idle_pools()
                self._pg = self._new_placement_group()
        return self._pg

    def _new_placement_group(self) -> PlacementGroup:
        bundle = {"CPU": self.cpus_per_worker, **({"GPU": 1.0} if self.use_gpu else {})}
        pg = placement_group([dict(bundle) for _ in range(self.world_size)], strategy="PACK")
        ready, _ = ray.wait([pg.ready()], timeout=120)
        if not ready:
            raise RuntimeError(
                f"resource pool {self.name!r}: Ray could not place {self.world_size} workers of {bundle} "
                f"within 120 s (cluster resources: {ray.cluster_resources()}); lower resources.num_workers"
            )
        return pg

    def node(self, bundle: int) -> str:
        """The id of the node that holds ``bundle`` of this pool's placement group. Just after the group is ready
        Ray's table may still give an empty id for it (seen on a loaded machine): it is read again until it names
        a node, for up to NODE_WAIT_S."""
        deadline = time.monotonic() + NODE_WAIT_S
        while True:
            node = ray.util.placement_group_table(self.placement_group())["bundles_to_node_id"].get(bundle, "")
            if node or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not node:
            raise RuntimeError(f"resource pool {self.name!r}: Ray's placement group table names no node for bundle "
                               f"{bundle} {NODE_WAIT_S:g} s after the group was placed")
        return node

    def scheduling(self, rank: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(
            placement_group=self.placement_group(), placement_group_bundle_index=rank
        )

    def host(self, spec: HostSpec) -> ActorHandle:
        """A host process for a rank of spec ``spec`` on bundle ``spec.bundle``: an idle one of that spec,
        else a new one (idle hosts of other specs on that bundle are killed when it has no room left).
        A floating pool's host is any idle CPU host on the bundle's node, else a new one there."""
        self.placement_group(spec)
        if self.floating:
            node = self.node(spec.bundle)
            return reuse.take_host(node) or RemoteHost.options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
        match = next((i for i, (s, _) in enumerate(self._idle) if s == spec), None)
        if match is not None:
            return self._idle.pop(match)[1]
        in_the_way = [i for i, (s, _) in enumerate(self._idle) if s.bundle == spec.bundle]
        while in_the_way and self._taken.get(spec.bundle, 0.0) + spec.share > 1.0 + SHARE_SLACK:
            self.give_back(*self._idle.pop(in_the_way.pop()), keep=False)
        self._taken[spec.bundle] = self._taken.get(spec.bundle, 0.0) + spec.share
        return RemoteHost.options(
            num_cpus=self.cpus_per_worker * spec.share,
            num_gpus=spec.share if self.use_gpu else 0,
            scheduling_strategy=self.scheduling(spec.bundle),
        ).remote()

    def give_back(self, spec: HostSpec, host: ActorHandle, keep: bool) -> None:
        """A group is done with ``host``: idle (on its node when floating, else on this pool) when ``keep``
        (and ``reuse``), else killed."""
        if self.floating:
            if keep:
                reuse.put_host(self.node(spec.bundle), host)
            else:
                ray.kill(host)
            return
        if keep and self.reuse:
            self._idle.append((spec, host))
            return
        ray.kill(host)
        self._taken[spec.bundle] -= spec.share

    def acquire(self) -> None:
        """A worker group now runs on this pool."""
        self._users += 1

    def release(self) -> None:
        """A worker group is done with this pool; the last one to leave removes the placement group (or,
        with ``reuse`` and idle hosts left, hands both to :mod:`mmrl.controller.reuse`)."""
        self._users = max(self._users - 1, 0)
        if self._users > 0 or self._pg is None:
            return
        if self.reuse and self._idle:
            reuse.put(self.shape, IdlePool(self._pg, self.cpus_per_worker * self.world_size, self._idle))
        else:
            for spec, host in self._idle:
                ray.kill(host)
            remove_placement_group(self._pg)
        self._pg, self._idle, self._taken = None, [], {}
