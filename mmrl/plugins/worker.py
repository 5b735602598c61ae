"""Inside a worker process of a :class:`~mmrl.plugins.pool.PluginPool`: load specs, call them, report.

The parent sends a chunk of samples under a spec; the worker resolves the spec once with its runner's
``resolve`` (kept for later chunks), tells the parent which bulky fields the function reads (``fields_read``),
then runs the runner's ``execute``, which reports when each call starts and what it produced. The parent
enforces every limit; the worker only ignores Ctrl-C (the driver's to handle) and ends itself once the parent
is gone.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


def worker_main(fd: int, parent_pid: int, runner: str) -> None:
    """A worker's loop: read a chunk, load its spec (cached) with ``runner``'s ``resolve``, run it with its
    ``execute``, report; until told to exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it ends the workers
    conn = Connection(fd)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), name="mmrl-watch", daemon=True).start()
    module = importlib.import_module(runner)
    conn.send(("ready",))
    functions: dict[str, Callable[..., Any] | str] = {}  # spec -> its function, or why it could not be loaded
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


def _exit_with_parent(parent_pid: int) -> None:
    """End this worker once the driver is gone (a SIGKILLed driver cannot close its pool)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(0)
