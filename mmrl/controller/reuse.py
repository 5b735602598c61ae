"""The driver's idle worker hosts (``resources.reuse_workers``): processes kept warm between worker groups.

A process started for one group serves a later one when the group shut down cleanly. What a host may serve
depends on its device:

- **CPU hosts float.** They run outside any placement group, pinned to their node and holding no Ray
  resources of their own: while a group runs, its pool's placement group reserves the CPUs, and each worker
  sets its own torch threads. An idle CPU host therefore holds nothing but its memory and serves any later
  pool on its node, whatever the pool's shape (ranks, CPUs per rank, threads, share). At most
  :data:`MAX_IDLE_PER_NODE` wait per node; the one idle longest is killed first.
- **GPU hosts are tied to a bundle**: Ray fixed their GPU (``CUDA_VISIBLE_DEVICES``) when they started, and
  it kills the actors of a placement group when the group is removed. So the unit kept is a whole pool: when
  the last group on a pool shuts down, its placement group stays, with the hosts that reset cleanly, keyed
  by the pool's shape (bundles, CPUs per bundle, GPU). A later pool of that shape takes it; each of its
  groups takes the idle host whose :class:`HostSpec` it needs. An idle pool still holds its resources: a
  pool that finds none of its shape removes every idle pool first, and :func:`idle_cpus` counts their CPUs
  as free when the trainer sizes its workers.

:func:`release_idle_workers` kills every idle host (e.g. at the end of a notebook's runs). The tables belong
to one Ray session: when Ray was restarted they are dropped (their processes died with the old session).

Hosts are never kept after a failure: a group whose call raised, died or passed its deadline kills all its
hosts when it shuts down, and an idle host that does not answer a ping when it is taken again is killed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ray
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup, remove_placement_group

# How long an idle host gets to answer when it is taken again (a live host answers in milliseconds).
PING_S = 20.0
# Idle CPU hosts kept per node (each holds an imported torch and transformers: a few hundred MB).
MAX_IDLE_PER_NODE = 6


@dataclass(frozen=True)
class HostSpec:
    """What fixes a bundle-tied (GPU) rank's process: its bundle in the pool, its share of the bundle (its Ray
    CPU and GPU request), its torch threads and its device setting."""

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
_FLOATING: dict[str, list[ActorHandle]] = {}  # node id -> idle CPU hosts, the longest idle first
_SESSION: list[tuple[str, str]] = []  # the Ray session the tables belong to: (driver's node id, job id)


def _idle() -> dict[PoolShape, list[IdlePool]]:
    """The table of idle GPU pools, emptied first (with the CPU hosts') when Ray was restarted since."""
    context = ray.get_runtime_context()
    session = (context.get_node_id(), context.get_job_id())
    if _SESSION != [session]:
        _IDLE.clear()
        _FLOATING.clear()
        _SESSION[:] = [session]
    return _IDLE


def _floating() -> dict[str, list[ActorHandle]]:
    _idle()
    return _FLOATING


def put_host(node: str, host: ActorHandle) -> None:
    """Keep the CPU host ``host`` idle on ``node`` (killing the one idle longest past the cap)."""
    hosts = _floating().setdefault(node, [])
    hosts.append(host)
    while len(hosts) > MAX_IDLE_PER_NODE:
        ray.kill(hosts.pop(0))


def take_host(node: str) -> ActorHandle | None:
    """An idle CPU host on ``node`` that answers a ping (the one idle shortest), or None."""
    hosts = _floating().get(node, [])
    while hosts:
        host = hosts.pop()
        ping = host.ping.remote()
        ready, _ = ray.wait([ping], timeout=PING_S)
        if ready and _answered(ping):
            return host
        ray.kill(host)  # died or stopped while idle
    return None


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
    return ([host for pools in _idle().values() for pool in pools for _, host in pool.hosts]
            + [host for hosts in _floating().values() for host in hosts])


def release_idle_pools() -> int:
    """Kill the hosts of every idle GPU pool and remove its placement group (its resources are needed);
    returns how many hosts were killed. Idle CPU hosts hold no resources and stay."""
    if not ray.is_initialized():
        return 0
    pools = [pool for pools in _idle().values() for pool in pools]
    _IDLE.clear()
    for pool in pools:
        for _, host in pool.hosts:
            ray.kill(host)
        remove_placement_group(pool.pg)
    return sum(len(pool.hosts) for pool in pools)


def release_idle_workers() -> int:
    """Kill every idle host and remove the idle placement groups; returns how many hosts were killed."""
    if not ray.is_initialized():
        return 0
    hosts = [host for hosts in _floating().values() for host in hosts]
    _FLOATING.clear()
    for host in hosts:
        ray.kill(host)
    return len(hosts) + release_idle_pools()
