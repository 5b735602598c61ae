"""A pool of worker processes that run plugins (reward functions, agent tools): no plugin can hurt the run.

Workers are given specs (strings), never function objects: each worker resolves a spec itself and keeps the
function (:mod:`mmrl.plugins.worker`). The parent sends a chunk of samples; the worker reports, per sample,
when its call starts and what it produced. Every limit (:mod:`mmrl.plugins.limits`) is therefore enforced by
the parent, from another process, so it holds even when a plugin never releases the GIL:

* a call running past ``timeout_s`` (plus a short grace) gets its worker SIGKILLed; that sample times
  out, the chunk's samples not yet started go back to the queue, and a fresh worker takes the slot;
* a worker that dies (``os._exit``, a segfault, a SIGKILL from outside) fails the sample it was
  running ("crashed", with its exit code) and is replaced;
* a worker whose resident memory passes ``max_memory_mb`` is killed ("memory").

A kill or death fails every sample in flight in that worker: the one running for a plain function,
all of the chunk's for a batched or an async one (whose samples share an event loop). A spec that
hangs or crashes its worker while loading, or whose first calls (one per worker) all time out, fails
the rest of its samples of that run at once: a broken plugin costs a step about one timeout.

Once a worker has loaded a spec it reports which fields its function reads; from then on the parent
leaves the bulky ones it does not read (images, videos, the row's columns) out of the chunks.

What a worker does with a spec is its pool's *runner*'s, a module (named when the pool is made) that
defines ``resolve(spec)`` (the function a spec names), ``execute(fn, items, timeout_s, emit)`` (call it on
the items, reporting ``("start", index)`` and ``("done", index, Outcome)`` through ``emit``),
``fields_read(fn)`` (which of the items' ``BULKY_FIELDS`` it reads) and ``NOUN`` (the kind of plugin, for
messages). :mod:`rewards.runner` is the runner of reward functions; :mod:`mmrl.agent.worker` the agent
tools'. A runner's imports should stay light: every worker imports it.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pickle
import sys
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from types import ModuleType
from typing import Any

from mmrl.plugins.limits import GRACE_S, LOAD_TIMEOUT_S, MAX_START_FAILURES, POLL_S, START_TIMEOUT_S
from mmrl.plugins.outcome import Outcome
from mmrl.plugins.process import WorkerProcess, describe_exit, shutdown

Item = tuple[int, Any]  # (the sample's index in the caller's batch, the sample: a dataclass the runner reads)
Job = tuple[str, Sequence[Item]]  # one plugin's spec and the samples it is called on


class PluginPool:
    """``num_workers`` worker processes, started on first use and replaced when they fail; ``runner``: the
    module that resolves and calls the specs in the workers (see above)."""

    def __init__(self, num_workers: int = 2, max_memory_mb: float = 4096.0, *, runner: str) -> None:
        self.num_workers, self.max_memory_mb = num_workers, max_memory_mb
        self.runner: ModuleType = importlib.import_module(runner)
        self._workers: list[_Worker] = []
        self._start_failures = 0
        self._fields: dict[str, frozenset[str]] = {}  # spec -> the fields of the samples its function reads
        self._lock = threading.Lock()  # one run() at a time: the workers' state is the call's
        # Ends the workers on close(), garbage collection or interpreter exit; holds the list, not the pool.
        self._finalizer = weakref.finalize(self, shutdown, self._workers)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def launch(self) -> None:
        """Start every missing worker process without waiting for it: the workers load while the caller does other
        work, and the first :meth:`run` waits only for what is left of their start."""
        with self._lock:
            self._fill()

    def start(self) -> float:
        """Start every missing worker now and wait until all are ready; returns the seconds it took."""
        began = time.monotonic()
        with self._lock:
            self._fill()
            while any(not w.ready for w in self._workers):
                self._step(None)
        return time.monotonic() - began

    def run(self, jobs: Sequence[Job], timeout_s: float) -> list[dict[int, Outcome]]:
        """Every job's samples through its spec: per job, the outcome of each sample by index."""
        call = _Call(jobs, timeout_s, self.num_workers)
        with self._lock:
            try:
                while call.remaining:
                    self._step(call)
            except BaseException:
                for worker in [w for w in self._workers if w.chunk is not None]:
                    self._discard(worker)  # their work belonged to the aborted call
                raise
        return call.outcomes

    def close(self) -> None:
        """End the worker processes (idempotent); the pool cannot be used afterwards."""
        self._finalizer()

    def _step(self, call: _Call | None) -> None:
        self._fill()
        if call is not None:
            call.drop_given_up()  # before workers are free: a hung function's batch waits for no restart
        for worker in list(self._workers):
            while call is not None and worker in self._workers and worker.idle:
                chunk = self._next_chunk(call)
                if chunk is None:
                    break
                self._send(worker, chunk, call)
        by_conn = {w.conn: w for w in self._workers}
        for conn in wait(list(by_conn), timeout=POLL_S):
            if not self._drain(by_conn[conn], call):
                self._on_exit(by_conn[conn], call)
        for worker in list(self._workers):
            if worker in self._workers:
                self._enforce(worker, call)

    def _next_chunk(self, call: _Call) -> _Chunk | None:
        """The first queued chunk whose function is not on hold (see :meth:`_on_hold`), taken off the queue."""
        for position, chunk in enumerate(call.queue):
            if not self._on_hold(chunk.spec, call):
                del call.queue[position]
                return chunk
        return None

    def _on_hold(self, spec: str, call: _Call) -> bool:
        """A function that timed out in this call and has not returned yet waits for its calls in flight:
        they tell a hang (all time out: the rest of its samples fail at once) from one slow sample (one
        returns: it runs on). Without the wait, a worker that replaced a killed one would start a new sample
        of a hung function while another worker's first call of it is still running."""
        return (call.timeouts[spec] > 0 and not call.returned[spec] and spec not in call.given_up
                and any(w.chunk is not None and w.chunk.spec == spec for w in self._workers))

    def _fill(self) -> None:
        if not self._finalizer.alive:
            raise RuntimeError(f"this {self.runner.NOUN} pool is closed; create a new one")
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self.runner.__name__))

    def _send(self, worker: _Worker, chunk: _Chunk, call: _Call) -> None:
        given_up = call.given_up.get(chunk.spec)
        if given_up is not None:
            for index, _ in chunk.items:
                call.record(chunk.job, index, given_up)
            return
        items = _lighten(chunk.items, self._fields.get(chunk.spec), self.runner.BULKY_FIELDS)
        try:
            payload = pickle.dumps(("chunk", chunk.spec, call.timeout_s, items), pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # a sample that does not pickle: find it by sending one at a time
            if len(chunk.items) > 1:
                call.queue.extendleft(_Chunk(chunk.job, chunk.spec, [item]) for item in reversed(chunk.items))
            else:
                message = f"the sample could not be sent to a {self.runner.NOUN} worker ({type(exc).__name__}: {exc})"
                call.record(chunk.job, chunk.items[0][0], Outcome(failure="error", message=message))
            return
        try:
            worker.conn.send_bytes(payload)
        except OSError:  # the worker died while idle: nothing of the chunk ran
            call.queue.appendleft(chunk)
            self._discard(worker)
            return
        worker.chunk, worker.pending, worker.running = chunk, {i for i, _ in chunk.items}, {}
        worker.load_deadline = time.monotonic() + max(call.timeout_s, LOAD_TIMEOUT_S)

    def _drain(self, worker: _Worker, call: _Call | None) -> bool:
        """Handle every message waiting from ``worker``; False once its end of the channel is closed."""
        try:
            while worker.conn.poll():
                self._handle(worker, worker.conn.recv(), call)
        except (EOFError, OSError):
            return False
        except Exception as exc:  # unpickling failed: nothing the worker sends should do that
            self._fail(worker, call, "crashed", f"the worker sent an unreadable message ({exc!r})")
        return True

    def _handle(self, worker: _Worker, message: tuple, call: _Call | None) -> None:
        tag, chunk = message[0], worker.chunk
        if tag == "ready":
            worker.mark_ready()
            self._start_failures = 0
        elif chunk is None or call is None:
            return
        elif tag == "loaded":
            worker.load_deadline = None
            self._fields[chunk.spec] = frozenset(message[1])
        elif tag == "start":
            worker.running[message[1]] = time.monotonic() + call.timeout_s + GRACE_S
        elif tag == "done":
            index, outcome = message[1], message[2]
            worker.pending.discard(index)
            worker.running.pop(index, None)
            call.returned[chunk.spec] += 1
            call.record(chunk.job, index, outcome)
        elif tag == "load_failed":
            for index in sorted(worker.pending):
                call.record(chunk.job, index, Outcome(failure="error", message=message[1]))
            worker.pending = set()
        if worker.chunk is not None and not worker.pending:
            worker.chunk, worker.running, worker.load_deadline = None, {}, None  # idle again

    def _enforce(self, worker: _Worker, call: _Call | None) -> None:
        now = time.monotonic()
        if worker.proc.poll() is not None:  # dead, its channel still open (a child of it holds it)
            self._on_exit(worker, call)
        elif not worker.ready:
            if now - worker.launched_at > START_TIMEOUT_S:
                self._start_failed(worker, f"did not report ready within {START_TIMEOUT_S:g} s")
        elif worker.load_deadline is not None and now > worker.load_deadline:
            self._fail(worker, call, "timeout",
                       f"loading the {self.runner.NOUN} function took over {LOAD_TIMEOUT_S:g} s")
        # Memory before the deadline: a call past both is reported for its memory, the cause a user can act on.
        elif (rss_mb := worker.rss_mb()) > self.max_memory_mb:
            self._fail(worker, call, "memory", f"its worker's memory reached {rss_mb:.0f} MB, past "
                                               f"max_memory_mb={self.max_memory_mb:g}; the worker was killed")
        elif call is not None and worker.running and min(worker.running.values()) < now:
            self._fail(worker, call, "timeout", f"did not return within {call.timeout_s:g} s; its worker process was killed")

    def _on_exit(self, worker: _Worker, call: _Call | None) -> None:
        if worker in self._workers:
            self._drain(worker, call)  # reports sent before it died, e.g. that a call started
        if worker not in self._workers:
            return
        code = worker.exit_code()
        if not worker.ready:
            self._start_failed(worker, f"exited ({describe_exit(code)}) before it was ready")
        else:
            self._fail(worker, call, "crashed", f"its worker process died ({describe_exit(code)})")

    def _fail(self, worker: _Worker, call: _Call | None, kind: str, message: str) -> None:
        """Kill ``worker``; its samples in flight get ``kind``, its unstarted ones go back to the queue."""
        self._discard(worker)
        chunk = worker.chunk
        if chunk is None or call is None:
            return
        outcome = Outcome(failure=kind, message=message)
        loading = worker.load_deadline is not None
        if loading:
            call.given_up[chunk.spec] = outcome
        # While the worker was still loading the spec (or reading the samples), they all were in flight.
        hit = set(worker.pending) if loading else set(worker.running)
        for index in sorted(hit):
            call.record(chunk.job, index, outcome)
        if kind == "timeout" and not loading:
            call.note_timeout(chunk.spec, self.num_workers, self.runner.NOUN)
        rest = [item for item in chunk.items if item[0] in worker.pending and item[0] not in hit]
        if rest:
            call.queue.appendleft(_Chunk(chunk.job, chunk.spec, rest))

    def _start_failed(self, worker: _Worker, reason: str) -> None:
        self._discard(worker)
        self._start_failures += 1
        if self._start_failures >= MAX_START_FAILURES:
            raise RuntimeError(
                f"{self.runner.NOUN} worker processes fail to start: {self._start_failures} in a row, the last "
                f"{reason}. "
                f"Their error output is above; `{sys.executable} -c 'import mmrl.plugins.worker, "
                f"{self.runner.__name__}'` reproduces an import error"
            )

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        if worker in self._workers:
            self._workers.remove(worker)


def _lighten(items: list[Item], fields: frozenset[str] | None, bulky: Sequence[str]) -> list[Item]:
    """The samples without the ``bulky`` fields (decoded images, ...) the function does not read."""
    dropped = [name for name in bulky if fields is not None and name not in fields]
    if not dropped:
        return items
    return [(index, dataclasses.replace(inp, **{name: type(getattr(inp, name))() for name in dropped}))
            for index, inp in items]


@dataclass
class _Chunk:
    job: int
    spec: str
    items: list[Item]


class _Call:
    """One run(): the chunks still to send and the outcomes so far."""

    def __init__(self, jobs: Sequence[Job], timeout_s: float, num_workers: int) -> None:
        self.timeout_s = timeout_s
        self.outcomes: list[dict[int, Outcome]] = [{} for _ in jobs]
        self.queue: deque[_Chunk] = deque()
        self.given_up: dict[str, Outcome] = {}  # spec -> why its samples fail at once in this call
        self.returned: Counter[str] = Counter()  # spec -> calls that returned (whatever they returned)
        self.timeouts: Counter[str] = Counter()
        self.remaining = 0
        for job, (spec, items) in enumerate(jobs):
            size = max(1, math.ceil(len(items) / num_workers))
            for start in range(0, len(items), size):
                self.queue.append(_Chunk(job, spec, list(items[start:start + size])))
            self.remaining += len(items)

    def note_timeout(self, spec: str, num_workers: int, noun: str) -> None:
        """A function whose first ``num_workers`` calls of this call all timed out hangs: its other samples
        fail at once, so that a step waits about one timeout for it, not one per sample."""
        self.timeouts[spec] += 1
        if self.timeouts[spec] >= num_workers and not self.returned[spec]:
            self.given_up[spec] = Outcome(
                failure="timeout", message=f"not run: this {noun} function's first {self.timeouts[spec]} calls in "
                                           "this batch all timed out, so the rest of the batch was not tried")

    def drop_given_up(self) -> None:
        """Fail the queued samples of the functions given up on at once (they need no worker)."""
        if any(chunk.spec in self.given_up for chunk in self.queue):
            for chunk in [c for c in self.queue if c.spec in self.given_up]:
                for index, _ in chunk.items:
                    self.record(chunk.job, index, self.given_up[chunk.spec])
            self.queue = deque(c for c in self.queue if c.spec not in self.given_up)

    def record(self, job: int, index: int, outcome: Outcome) -> None:
        if index not in self.outcomes[job]:
            self.outcomes[job][index] = outcome
            self.remaining -= 1


class _Worker(WorkerProcess):
    """A worker process and the chunk it is working on."""

    def __init__(self, runner: str) -> None:
        super().__init__(runner)
        self.chunk: _Chunk | None = None
        self.pending: set[int] = set()  # the chunk's samples without an outcome yet
        self.running: dict[int, float] = {}  # started samples -> the deadline of their call
        self.load_deadline: float | None = None  # set until the worker has loaded the chunk's spec

    @property
    def idle(self) -> bool:
        return self.ready and self.chunk is None
