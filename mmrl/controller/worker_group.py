"""A WorkerGroup: N Ray actors of one Worker class, called as one SPMD program.

Each rank's actor is a :class:`~mmrl.controller.host.WorkerHost` that builds the worker inside itself; on a
pool with ``reuse`` (``resources.reuse_workers``) a healthy group's hosts outlive it, for later groups
(:mod:`mmrl.controller.reuse`).

Every call has a deadline (``timeout_s``). A rank whose process died (killed, out of memory, its node
lost) or a call past its deadline raises :class:`WorkerFailure`, which the driver recovers from by
rebuilding the groups from a checkpoint; an ordinary exception inside a worker method is re-raised as is.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections import Counter
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import NodeDiedError, OutOfMemoryError, RayActorError, RayTaskError, WorkerCrashedError

from mmrl.controller.dispatch import CONTEXT_KEY, DISPATCH_ATTR, DispatchSpec, collect, split_args
from mmrl.controller.resource_pool import ResourcePool
from mmrl.controller.reuse import HostSpec
from mmrl.protocol import Batch

# Errors that mean a rank's process is gone: the call can never complete.
DEATH = (RayActorError, OutOfMemoryError, WorkerCrashedError, NodeDiedError)
# After one rank raises, how long the others get to show whether a peer died (a collective broken by a
# dead peer fails on the survivors too, often before Ray reports the death).
GRACE_S = 15.0
# Starting a rank (a process that imports torch and transformers, then joins the process group) can take longer
# than a short step deadline on a loaded machine: the start gets at least this long.
STARTUP_S = 300.0
# How long a rank gets to tear its worker down for reuse (collect, destroy its process group); past it, killed.
RESET_S = 60.0


class WorkerFailure(RuntimeError):
    """A rank died or a call hung past its deadline: the group is unusable and must be rebuilt."""


class WorkerGroup:
    """Spawns ``pool.world_size`` ranks of ``worker_cls`` and binds its registered methods.

    ``group.method(batch)`` splits the call by the method's dispatch mode, runs it on every rank, waits,
    and collects the results (see :mod:`mmrl.controller.dispatch`).
    """

    def __init__(
        self,
        worker_cls: type,
        pool: ResourcePool,
        threads: int = 0,
        device: str = "auto",
        share: float = 1.0,
        timeout_s: float = 1800.0,
    ) -> None:
        """``share``: the fraction of each bundle a rank takes; colocated groups on one pool take 0.5 each.
        ``timeout_s``: the deadline of every call, and of every collective inside one."""
        self.pool = pool
        self.world_size = pool.world_size
        self.name = worker_cls.__name__
        self.timeout_s = timeout_s
        self.group_by_prompt = True
        """Keep a prompt's samples on the rank that encoded it (False: scatter them by tokens, the layout
        before prompts stayed on one rank; a ``make bench`` baseline)."""
        self.count_bytes = False
        """Measure the pickled size of every call's arguments into :attr:`bytes_sent` and of its results into
        :attr:`bytes_received` (costs a pickling)."""
        self.bytes_sent: Counter[str] = Counter()
        self.bytes_received: Counter[str] = Counter()
        self.placement: dict[str, int] = {}
        """uid -> the rank that holds the prompt's encoding this step (see :meth:`forget_prompts`)."""
        self.held: list[set[str]] = [set() for _ in range(pool.world_size)]
        self.specs = [HostSpec(rank, share, threads, device) for rank in range(self.world_size)]
        self.healthy = True
        """False once a call raised, died or passed its deadline: the ranks are then never reused."""
        self.workers: list[ActorHandle] = []
        """One :class:`~mmrl.controller.host.WorkerHost` actor per rank, in rank order."""
        self._released = False
        pool.acquire()
        try:
            for spec in self.specs:
                self.workers.append(pool.host(spec))
            self._start(worker_cls, device, max(timeout_s, STARTUP_S))
        except BaseException:
            self.healthy = False
            self.shutdown()
            raise
        self._bind(worker_cls)

    def _start(self, worker_cls: type, device: str, start_s: float) -> None:
        """Build the worker on every rank and join the ranks into one process group (on a new port)."""
        self._gather("start", [w.start.remote(worker_cls, rank, self.world_size, self.pool.threads(spec), device)
                               for rank, (w, spec) in enumerate(zip(self.workers, self.specs))], start_s)
        master_addr, master_port = self._gather("node_address", [self.workers[0].call.remote("node_address")],
                                                start_s)[0]
        self._gather("init_process_group", [w.call.remote("init_process_group", master_addr, master_port,
                                                          self.timeout_s) for w in self.workers], start_s)

    def _bind(self, worker_cls: type) -> None:
        self.methods: dict[str, DispatchSpec] = {}
        for name, fn in inspect.getmembers(worker_cls, predicate=inspect.isfunction):
            spec = getattr(fn, DISPATCH_ATTR, None)
            if spec is not None:
                self.methods[name] = spec
                if hasattr(WorkerGroup, name):  # a bound method must not hide the group's own
                    raise TypeError(f"{worker_cls.__name__}.{name} would hide WorkerGroup.{name}: rename the method")
                setattr(self, name, functools.partial(self._call, name, spec))

    def _call(self, method: str, spec: DispatchSpec, *args: Any, **kwargs: Any) -> Any:
        return self._submit(method, spec, *args, **kwargs).result()

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Pending:
        """Start a registered method on every rank and return at once: ``.result()`` waits for it (with the
        group's deadline, counted from that call) and collects as ``group.method(...)`` does. The ranks run the
        calls of one caller in the order they were made."""
        if method not in self.methods:
            raise AttributeError(f"{self.name} has no registered method {method!r}; registered: "
                                 f"{', '.join(sorted(self.methods))}")
        return self._submit(method, self.methods[method], *args, **kwargs)

    def _submit(self, method: str, spec: DispatchSpec, *args: Any, **kwargs: Any) -> Pending:
        grouped = spec.prompts and self.group_by_prompt
        per_rank, plan = split_args(spec, self.world_size, args, kwargs,
                                    self.placement if grouped else None, self.held if grouped else None,
                                    by_group=self.group_by_prompt)
        if grouped and plan is not None and plan.ranks and spec.keep_prompts:
            self.placement.update(plan.ranks)
            for rank, ((part, *_), _kw) in enumerate(per_rank):
                self.held[rank].update(held_keys(part))
        if self.count_bytes:
            self.bytes_sent[method] += sum(len(ray.cloudpickle.dumps(call)) for call in per_rank)
        refs = [w.call.remote(method, *a, **kw) for w, (a, kw) in zip(self.workers, per_rank)]
        return Pending(self, method, spec, refs, plan)

    def forget_prompts(self) -> None:
        """A new step: every rank drops the prompt encodings it holds, and groups may go anywhere again."""
        self.placement.clear()
        self.held = [set() for _ in range(self.world_size)]
        self._gather("drop_prompts", [w.call.remote("drop_prompts") for w in self.workers])

    def _gather(self, method: str, refs: list[ray.ObjectRef], timeout_s: float | None = None) -> list[Any]:
        """Every rank's result, in rank order; raises WorkerFailure when a rank died or the deadline
        (``timeout_s``, default the group's) passed. Any error marks the group unhealthy."""
        try:
            return self._wait(method, refs, timeout_s or self.timeout_s)
        except BaseException:
            self.healthy = False  # a rank may be dead, hung, or still inside a call: none is reused
            raise

    def _wait(self, method: str, refs: list[ray.ObjectRef], timeout_s: float) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        pending, error = list(refs), None
        while pending:
            wait_s = deadline - time.monotonic() if error is None else min(GRACE_S, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(wait_s, 0))
            if not ready:
                if error is not None:
                    raise error  # the others are stuck behind the failed rank, none died: a plain error
                late = [refs.index(r) for r in pending]
                raise WorkerFailure(f"{self.name}.{method} did not finish within {timeout_s:g} s "
                                    f"(trainer.step_timeout_s={self.timeout_s:g}) on ranks {late}: treating them as hung")
            try:
                ray.get(ready[0])
            except DEATH as err:
                rank = refs.index(ready[0])
                raise WorkerFailure(f"{self.name} rank {rank} died during {method}: {type(err).__name__}") from err
            except RayTaskError as err:
                error = error or err  # wait a little: if a peer died, this is the aftermath, not the cause
        if error is not None:
            raise error
        return ray.get(refs)

    def shutdown(self) -> None:
        """Stop the ranks and release this group's hold on the pool (a pool shared with another group is
        removed when the last of them shuts down). On a pool with ``reuse``, the ranks of a healthy group
        tear their workers down and stay, idle, for a later group; otherwise they are killed. Calling it
        twice is harmless."""
        if self._released:
            return
        self._released = True
        hosts, self.workers = self.workers, []
        keep = self._reset(hosts) if self.pool.reuse and self.healthy else [False] * len(hosts)
        for spec, host, kept in zip(self.specs, hosts, keep):
            self.pool.give_back(spec, host, kept)
        self.pool.release()

    def _reset(self, hosts: list[ActorHandle]) -> list[bool]:
        """Which hosts tore their worker down cleanly within RESET_S (see :meth:`WorkerHost.reset`)."""
        refs = [host.reset.remote() for host in hosts]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=RESET_S)
        return [ref in ready and _reset_ok(ref) for ref in refs]


class Pending:
    """A call in flight on every rank of a group (:meth:`WorkerGroup.submit`)."""

    def __init__(self, group: WorkerGroup, method: str, spec: DispatchSpec, refs: list[ray.ObjectRef],
                 plan: Any) -> None:
        self.group, self.method, self.spec, self.refs, self.plan = group, method, spec, refs, plan

    def done(self) -> bool:
        """Whether every rank has finished (without waiting)."""
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def result(self) -> Any:
        """The collected result; raises WorkerFailure as a direct call does."""
        group = self.group
        results = group._gather(self.method, self.refs)
        if self.spec.prompts and self.spec.keep_prompts and group.group_by_prompt:
            # Samples with their own contexts (agent episodes): the rank that generated them holds them.
            for rank, result in enumerate(results):
                if isinstance(result, Batch) and CONTEXT_KEY in result.objects:
                    group.held[rank].update(key for key in result[CONTEXT_KEY] if key is not None)
        if group.count_bytes:
            group.bytes_received[self.method] += sum(len(ray.cloudpickle.dumps(r)) for r in results)
        return collect(self.spec.mode, results, self.plan)


def held_keys(part: Batch) -> list[str]:
    """What a rank holds once it has taken ``part``: its prompts' uids, and the keys of the contexts it got."""
    keys = list(part["uid"])
    if CONTEXT_KEY in part.objects:
        keys += [key for key in part[CONTEXT_KEY] if key is not None]
    return keys


def _reset_ok(ref: ray.ObjectRef) -> bool:
    try:
        return bool(ray.get(ref))
    except ray.exceptions.RayError:
        return False
