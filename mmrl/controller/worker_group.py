"""A WorkerGroup: N Ray actors of one Worker class, called as one SPMD program."""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from typing import Any

import ray

from mmrl.controller.dispatch import DISPATCH_ATTR, DispatchSpec, collect, split_args
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
        self.ship_all_fields = False
        """Send whole Batches to DP_COMPUTE methods, ignoring their declared fields (a ``make bench`` baseline)."""
        self.count_bytes = False
        """Measure the pickled size of every call's arguments into :attr:`bytes_sent` (costs a pickling)."""
        self.bytes_sent: Counter[str] = Counter()
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
        pool.acquire()
        self._bind(worker_cls)

    def _bind(self, worker_cls: type) -> None:
        for name, fn in inspect.getmembers(worker_cls, predicate=inspect.isfunction):
            spec = getattr(fn, DISPATCH_ATTR, None)
            if spec is not None:
                setattr(self, name, functools.partial(self._call, name, spec))

    def _call(self, method: str, spec: DispatchSpec, *args: Any, **kwargs: Any) -> Any:
        per_rank, plan = split_args(spec, self.world_size, args, kwargs, self.ship_all_fields)
        if self.count_bytes:
            self.bytes_sent[method] += sum(len(ray.cloudpickle.dumps(call)) for call in per_rank)
        refs = [getattr(w, method).remote(*a, **kw) for w, (a, kw) in zip(self.workers, per_rank)]
        return collect(spec.mode, ray.get(refs), plan)

    def shutdown(self) -> None:
        """Kill the ranks and release this group's hold on the pool (a pool shared with another group is
        removed when the last of them shuts down). Calling it twice is harmless."""
        if not self.workers:
            return
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        self.pool.release()
