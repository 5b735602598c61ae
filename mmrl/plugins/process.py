"""One worker process of a :class:`~mmrl.plugins.pool.PluginPool`, seen from the parent.

Workers are fresh interpreters, never forks of the driver (it has Ray and torch threads), nor multiprocessing
spawns (they re-import the driver's ``__main__``, torch and all): a worker runs one line that imports
:mod:`mmrl.plugins.worker` and the pool's runner, with the parent's ``sys.path``, and talks to the parent
through one pipe.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from multiprocessing import Pipe
from multiprocessing.connection import Connection

import psutil

_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from mmrl.plugins.worker import worker_main; "
         "worker_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])")


class WorkerProcess:
    """The parent's handle on one worker process running ``runner`` (a module name)."""

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


def shutdown(workers: list[WorkerProcess]) -> None:
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
