"""A resource pool: one Ray placement group whose bundles host the ranks of a WorkerGroup."""

from __future__ import annotations

from dataclasses import dataclass, field

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@dataclass
class ResourcePool:
    """``world_size`` bundles of ``cpus_per_worker`` CPUs (and one GPU each when ``use_gpu``).

    Worker groups placed on the pool :meth:`acquire` it and :meth:`release` it when they shut down; the
    placement group is removed when the last one releases it.
    """

    world_size: int
    cpus_per_worker: float = 1.0
    use_gpu: bool = False
    name: str = "pool"
    _pg: PlacementGroup | None = field(default=None, init=False, repr=False)
    _users: int = field(default=0, init=False, repr=False)

    def placement_group(self) -> PlacementGroup:
        if self._pg is None:
            bundle = {"CPU": self.cpus_per_worker, **({"GPU": 1.0} if self.use_gpu else {})}
            self._pg = placement_group([dict(bundle) for _ in range(self.world_size)], strategy="PACK")
            ready, _ = ray.wait([self._pg.ready()], timeout=120)
            if not ready:
                raise RuntimeError(
                    f"resource pool {self.name!r}: Ray could not place {self.world_size} workers of {bundle} "
                    f"within 120 s (cluster resources: {ray.cluster_resources()}); lower resources.num_workers"
                )
        return self._pg

    def scheduling(self, rank: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(
            placement_group=self.placement_group(), placement_group_bundle_index=rank
        )

    def acquire(self) -> None:
        """A worker group now runs on this pool."""
        self._users += 1

    def release(self) -> None:
        """A worker group is done with this pool; the last one to leave removes the placement group."""
        self._users = max(self._users - 1, 0)
        if self._users == 0 and self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None
