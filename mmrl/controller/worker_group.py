"""A WorkerGroup: N Ray actors of one Worker class, called as one SPMD program."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import ray

from mmrl.controller.dispatch import DISPATCH_ATTR, Dispatch, collect, split_args
from mmrl.controller.resource_pool import ResourcePool


class WorkerGroup:
    """Spawns ``pool.world_size`` ranks of ``worker_cls`` and binds its registered methods.

    ``group.method(batch)`` splits the call by the method's dispatch mode, runs it on every rank, waits,
    and collects the results (see :mod:`mmrl.controller.dispatch`).
    """

    def __init__(
        self, worker_cls: type, pool: ResourcePool, threads: int = 0, device: str = "auto", share: float = 1.0
    ) -> None:
        """``share``: the fraction of each bundle a rank takes; colocated groups on one pool take 0.5 each."""
        self.pool = pool
        self.world_size = pool.world_size
        remote_cls = ray.remote(worker_cls)
        self.workers = [
            remote_cls.options(
                num_cpus=pool.cpus_per_worker * share,
                num_gpus=share if pool.use_gpu else 0,
                scheduling_strategy=pool.scheduling(rank),
                name=None,
            ).remote(rank, self.world_size, threads, device)
            for rank in range(self.world_size)
        ]
        master_addr, master_port = ray.get(self.workers[0].node_address.remote())
        ray.get([w.init_process_group.remote(master_addr, master_port) for w in self.workers])
        self._bind(worker_cls)

    def _bind(self, worker_cls: type) -> None:
        for name, fn in inspect.getmembers(worker_cls, predicate=inspect.isfunction):
            mode = getattr(fn, DISPATCH_ATTR, None)
            if mode is not None:
                setattr(self, name, functools.partial(self._call, name, mode))

    def _call(self, method: str, mode: Dispatch, *args: Any, **kwargs: Any) -> Any:
        per_rank, plan = split_args(mode, self.world_size, args, kwargs)
        refs = [getattr(w, method).remote(*a, **kw) for w, (a, kw) in zip(self.workers, per_rank)]
        return collect(mode, ray.get(refs), plan)

    def shutdown(self) -> None:
        """Kill the ranks and release the pool (a pool shared with another group goes when both are done)."""
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        self.pool.release()
