"""A pool of worker processes that run reward functions, so that no plugin can hurt the run.

Workers are given specs (strings), never function objects: each worker resolves a spec itself and
keeps the function. The parent sends a chunk of samples; the worker reports, per sample, when its call
starts and what it produced (:func:`execute`). Every limit is therefore enforced by the parent, from
another process, so it holds even when a plugin never releases the GIL:

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

Workers are fresh interpreters, never forks of the driver (it has Ray and torch threads), nor
multiprocessing spawns (they re-import the driver's ``__main__``, torch and all): a worker runs one
line that imports this module, whose imports are light.

What a worker does with a spec is its pool's *runner*'s, a module (named when the pool is made) that
defines ``resolve(spec)`` (the function a spec names), ``execute(fn, items, timeout_s, emit)`` (call it on
the items, reporting through ``emit`` as :func:`execute` does), ``fields_read(fn)`` (which of the items'
``BULKY_FIELDS`` it reads) and ``NOUN`` (the kind of plugin, for messages). This module is the runner of
reward functions; :mod:`mmrl.agent.worker` is the agent tools'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from types import ModuleType
from typing import Any

import psutil

from rewards.registry import resolve
from rewards.types import (CallPlan, Outcome, RewardFn, RewardInput, bind, describe_fn, is_result_list, plan_call,
                           to_plain)

POLL_S = 0.02  # how often the parent checks deadlines and memory while a call runs
START_TIMEOUT_S = 60.0  # for a fresh worker to report ready
LOAD_TIMEOUT_S = 60.0  # at least, for a worker to load a spec (a plugin's imports are not the reward call)
MAX_START_FAILURES = 3  # workers in a row that die or hang before ready: the environment is broken
GRACE_S = 0.25  # past timeout_s before a call is killed: an async function's own timeout reports first
BULKY_FIELDS = ("images", "videos", "extra")  # not sent to a function known not to take them
NOUN = "reward"  # what a spec names, in messages: "reward worker", "reward function"

Item = tuple[int, RewardInput]  # (the sample's index in the caller's batch, the sample)
Job = tuple[str, Sequence[Item]]  # one reward function's spec and the samples it scores
Emit = Callable[[tuple], None]  # gets ("start", index) before a call takes a sample, ("done", index, Outcome) after

_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from rewards.pool import worker_main; worker_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])")


class PluginPool:
    """``num_workers`` worker processes, started on first use and replaced when they fail; ``runner``: the
    module that resolves and calls the specs in the workers (see above)."""

    def __init__(self, num_workers: int = 2, max_memory_mb: float = 4096.0, runner: str = __name__) -> None:
        self.num_workers, self.max_memory_mb = num_workers, max_memory_mb
        self.runner: ModuleType = importlib.import_module(runner)
        self._workers: list[_Worker] = []
        self._start_failures = 0
        self._fields: dict[str, frozenset[str]] = {}  # spec -> the RewardInput fields its function reads
        self._lock = threading.Lock()  # one run() at a time: the workers' state is the call's
        # Ends the workers on close(), garbage collection or interpreter exit; holds the list, not the pool.
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

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
                f"Their error output is above; `{sys.executable} -c 'import rewards.pool'` reproduces an "
                "import error"
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


class _Worker:
    """The parent's handle on one worker process and the chunk it is working on."""

    def __init__(self, runner: str) -> None:
        ours, theirs = Pipe()
        paths = json.dumps([p for p in sys.path if isinstance(p, str)])
        argv = [sys.executable, "-c", _BOOT, paths, str(theirs.fileno()), str(os.getpid()), runner]
        self.proc = subprocess.Popen(argv,
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn: Connection = ours
        self.launched_at = time.monotonic()
        self.ready = False
        self._process: psutil.Process | None = None
        self.chunk: _Chunk | None = None
        self.pending: set[int] = set()  # the chunk's samples without an outcome yet
        self.running: dict[int, float] = {}  # started samples -> the deadline of their call
        self.load_deadline: float | None = None  # set until the worker has loaded the chunk's spec

    @property
    def idle(self) -> bool:
        return self.ready and self.chunk is None

    def mark_ready(self) -> None:
        self.ready = True
        try:
            self._process = psutil.Process(self.proc.pid)
        except psutil.Error:
            self._process = None

    def rss_mb(self) -> float:
        try:
            return self._process.memory_info().rss / 2**20 if self._process is not None else 0.0
        except psutil.Error:  # it just died: the channel reports that
            return 0.0

    def exit_code(self) -> int | None:
        try:
            return self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


def describe_exit(code: int | None) -> str:
    """An exit status as a reader wants it: "exit code 1", "killed by SIGSEGV"."""
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


RewardPool = PluginPool  # the reward stage's pool: this module is its runner


def _shutdown(workers: list[_Worker]) -> None:
    """Ask idle workers to exit, then kill whatever is left (a hung one cannot answer)."""
    for worker in workers:
        try:
            worker.conn.send_bytes(pickle.dumps(("exit",)))
        except OSError:
            pass
    deadline = time.monotonic() + 1.0
    for worker in workers:
        try:
            worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        worker.kill()
    workers.clear()


# --- calling a function on samples: in a worker process, or inline in the driver -----------------------


def run_inline(fn: RewardFn, items: Sequence[Item], timeout_s: float) -> dict[int, Outcome]:
    """:func:`execute` in this thread: protects from exceptions and bad values only. A call that returns
    late is a timeout, but nothing stops one that never returns, or a crash, or its memory."""
    done: dict[int, Outcome] = {}
    execute(fn, items, timeout_s, lambda event: done.update({event[1]: event[2]}) if event[0] == "done" else None)
    return done


def execute(fn: RewardFn, items: Sequence[Item], timeout_s: float, emit: Emit) -> None:
    """Call ``fn`` on every sample of ``items``, reporting each through ``emit``; never raises.

    A plain function takes the samples one by one, a batched one in a single call, an async one
    concurrently on one event loop. A call taking longer than ``timeout_s`` is a timeout even if it
    returns (an async call is cancelled); one that never returns is the caller's to stop.
    """
    owner = describe_fn(fn)
    try:
        plan = plan_call(fn)
    except TypeError as exc:
        for index, _ in items:
            emit(("done", index, raised(exc)))
        return
    if plan.batched:
        _execute_batched(fn, plan, owner, items, timeout_s, emit)
    elif plan.is_async:
        asyncio.run(_execute_async(fn, plan, owner, items, timeout_s, emit))
    else:
        for index, inp in items:
            emit(("start", index))
            start = time.monotonic()
            try:
                result = fn(**bind(plan, inp, owner))
                if inspect.isawaitable(result):  # e.g. a sync wrapper returning a coroutine
                    result = asyncio.run(_within(result, timeout_s))
                outcome = _returned(result, start, timeout_s)
            except BaseException as exc:  # the plugin's failure is this sample's, whatever it is
                outcome = raised(exc)
            emit(("done", index, outcome))


def _execute_batched(fn: RewardFn, plan: CallPlan, owner: str, items: Sequence[Item], timeout_s: float,
                     emit: Emit) -> None:
    indices, calls = [], []
    for index, inp in items:
        emit(("start", index))
        try:
            calls.append(bind(plan, inp, owner))
            indices.append(index)
        except TypeError as exc:
            emit(("done", index, raised(exc)))
    if not indices:
        return
    start = time.monotonic()
    try:
        results = fn(**{name: [kwargs[name] for kwargs in calls] for name in calls[0]})
        if inspect.isawaitable(results):
            results = asyncio.run(_within(results, timeout_s))
        if results is _TIMED_OUT or time.monotonic() - start > timeout_s:
            outcomes = [timed_out(timeout_s)] * len(indices)
        elif not is_result_list(results) or len(results) != len(indices):
            got = f"{len(results)} results" if is_result_list(results) else f"a {type(results).__name__}"
            message = (f"batched reward function returned {got} for {len(indices)} samples; "
                       "return a list with one result per sample")
            outcomes = [Outcome(failure="bad_type", message=message)] * len(indices)
        else:
            outcomes = [Outcome(value=to_plain(result)) for result in results]
    except BaseException as exc:
        outcomes = [raised(exc)] * len(indices)
    for index, outcome in zip(indices, outcomes):
        emit(("done", index, outcome))


async def _execute_async(fn: RewardFn, plan: CallPlan, owner: str, items: Sequence[Item], timeout_s: float,
                         emit: Emit) -> None:
    async def one(index: int, inp: RewardInput) -> None:
        emit(("start", index))
        start = time.monotonic()
        try:
            outcome = _returned(await _within(fn(**bind(plan, inp, owner)), timeout_s), start, timeout_s)
        except BaseException as exc:
            outcome = raised(exc)
        emit(("done", index, outcome))

    await asyncio.gather(*(one(index, inp) for index, inp in items))


_TIMED_OUT = object()


async def _within(awaitable: Any, timeout_s: float) -> Any:
    """The awaitable's result, or _TIMED_OUT (after cancelling it) past ``timeout_s``.

    Unlike asyncio.wait_for, a TimeoutError the plugin raises itself stays an error.
    """
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()
        return _TIMED_OUT
    return task.result()


def _returned(result: object, start: float, timeout_s: float) -> Outcome:
    if result is _TIMED_OUT or time.monotonic() - start > timeout_s:
        return timed_out(timeout_s)
    return Outcome(value=to_plain(result))


def timed_out(timeout_s: float) -> Outcome:
    return Outcome(failure="timeout", message=f"did not return within {timeout_s:g} s")


def raised(exc: BaseException) -> Outcome:
    """The outcome of a call that raised ``exc``, its message naming where in the plugin it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return Outcome(failure="error", message=f"{type(exc).__name__}: {exc}{where}")


# --- the worker process -------------------------------------------------------------------------------


def worker_main(fd: int, parent_pid: int, runner: str = __name__) -> None:
    """A worker's loop: read a chunk, load its spec (cached) with ``runner``'s ``resolve``, run it with its
    ``execute``, report; until told to exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it ends the workers
    conn = Connection(fd)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), name="mmrl-watch", daemon=True).start()
    module = importlib.import_module(runner)
    conn.send(("ready",))
    functions: dict[str, RewardFn | str] = {}  # spec -> its function, or why it could not be loaded
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        except Exception as exc:
            conn.send(("load_failed", f"the worker could not read the samples ({type(exc).__name__}: {exc})"))
            continue
        if message[0] == "exit":
            return
        _, spec, timeout_s, items = message
        if spec not in functions:
            try:
                functions[spec] = module.resolve(spec)
            except BaseException as exc:  # a plugin's import may raise anything, SystemExit included
                functions[spec] = f"could not load {module.NOUN} {spec!r}: {type(exc).__name__}: {exc}"
        fn = functions[spec]
        if isinstance(fn, str):
            conn.send(("load_failed", fn))
            continue
        conn.send(("loaded", module.fields_read(fn)))
        module.execute(fn, items, timeout_s, conn.send)


def fields_read(fn: RewardFn) -> tuple[str, ...]:
    """The RewardInput fields a call of ``fn`` reads: those it takes, and ``extra`` for its row columns."""
    try:
        plan = plan_call(fn)
    except TypeError:
        return BULKY_FIELDS  # it will fail on its own; send everything
    return plan.fields + (("extra",) if plan.columns else ())


def _exit_with_parent(parent_pid: int) -> None:
    """End this worker once the driver is gone (a SIGKILLed driver cannot close its pool)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(0)
