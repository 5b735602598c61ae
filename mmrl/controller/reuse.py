"""The driver's idle worker hosts (``resources.reuse_workers``): processes kept warm between worker groups.

A host is tied to one bundle of one placement group: Ray kills the actors of a placement group when the group
is removed, and a host's CPU share, GPU and node were fixed when it started. So the unit kept is a whole
pool: when the last group on a :class:`~mmrl.controller.resource_pool.ResourcePool` with ``reuse`` shuts
down, its placement group stays, with the hosts that reset cleanly, in this module's table keyed by the
pool's shape (bundles, CPUs per bundle, GPU or not). A later pool of that shape takes the placement group
and its hosts; each of its groups then takes the idle host whose :class:`HostSpec` (bundle, share, threads,
device) it needs, and hosts it cannot use are killed when their bundle's room is needed.

An idle pool still holds its resources. A pool that finds no idle pool of its shape first removes every idle
pool (any pool, with or without ``reuse``: the resources must be there for it), and
:func:`idle_cpus` counts idle CPUs as free when the trainer sizes its workers. :func:`release_idle_workers`
frees them at once (e.g. at the end of a notebook's runs). The table belongs to one Ray session: when Ray
was restarted it is dropped (its processes died with the old session).

Hosts are never kept after a failure: a group whose call raised, died or passed its deadline kills all its
hosts when it shuts down, and a host that does not answer a ping when its pool is taken again is killed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ray
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup, remove_placement_group

# How long an idle host gets to answer when its pool is taken again (a live host answers in milliseconds).
PING_S = 20.0


@dataclass(frozen=True)
class HostSpec:
    """What fixes a rank's process: its bundle in the pool, its share of the bundle (its Ray CPU and GPU
    request, and so Ray's OMP_NUM_THREADS), its torch threads and its device setting."""

    bundle: int
    share: float
    threads: int
    device: str


# (bundles, CPUs per bundle, GPU or not)
PoolShape = tuple[int, float, bool]


@dataclass
class IdlePool:
    """A placement group no group uses, with its idle hosts."""

    pg: PlacementGroup
    cpus: float
    hosts: list[tuple[HostSpec, ActorHandle]] = field(default_factory=list)


_IDLE: dict[PoolShape, list[IdlePool]] = {}
_SESSION: list[tuple[str, str]] = []  # the Ray session _IDLE belongs to: (driver's node id, job id)


def _idle() -> dict[PoolShape, list[IdlePool]]:
    """The table, emptied first when Ray was restarted since it was filled."""
    context = ray.get_runtime_context()
    session = (context.get_node_id(), context.get_job_id())
    if _SESSION != [session]:
        _IDLE.clear()
        _SESSION[:] = [session]
    return _IDLE


def put(shape: PoolShape, pool: IdlePool) -> None:
    """Keep ``pool`` for a later pool of ``shape``."""
    _idle().setdefault(shape, []).append(pool)


def take(shape: PoolShape, want: HostSpec | None = None) -> IdlePool | None:
    """An idle pool of ``shape`` (one holding a host of spec ``want`` when there is one), its hosts checked
    alive; None when there is none."""
    pools = _idle().get(shape, [])
    if not pools:
        return None
    pool = next((p for p in pools if any(spec == want for spec, _ in p.hosts)), pools[0])
    pools.remove(pool)
    pings = [host.ping.remote() for _, host in pool.hosts]
    ready, _ = ray.wait(pings, num_returns=len(pings), timeout=PING_S)
    alive = []
    for (spec, host), ping in zip(pool.hosts, pings):
        if ping in ready and _answered(ping):
            alive.append((spec, host))
        else:
            ray.kill(host)  # died or stopped while idle
    pool.hosts = alive
    return pool


def _answered(ping: ray.ObjectRef) -> bool:
    try:
        return bool(ray.get(ping))
    except ray.exceptions.RayError:
        return False


def idle_cpus() -> float:
    """CPUs that idle pools hold (free for a new pool: it removes them)."""
    return sum(pool.cpus for pools in _idle().values() for pool in pools)


def idle_hosts() -> list[ActorHandle]:
    """Every idle host (a probe for tests: ``host.__ray_call__`` runs a function in its process)."""
    return [host for pools in _idle().values() for pool in pools for _, host in pool.hosts]


def release_idle_workers() -> int:
    """Kill every idle host and remove their placement groups; returns how many hosts were killed."""
    if not ray.is_initialized():
        return 0
    pools = [pool for pools in _idle().values() for pool in pools]
    _IDLE.clear()
    for pool in pools:
        for _, host in pool.hosts:
            ray.kill(host)
        remove_placement_group(pool.pg)
    return sum(len(pool.hosts) for pool in pools)
