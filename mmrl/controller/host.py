"""A worker host: one Ray actor process that builds a Worker of any class inside itself and runs its methods.

Starting a rank's process (Python, torch, transformers, the worker's modules) costs seconds of CPU; building a
worker in it costs little. A host outlives its worker: when a group shuts down, a healthy host tears its
worker down (:meth:`WorkerHost.reset`) and waits, idle, for the next group of the same shape
(:mod:`mmrl.controller.reuse`). :meth:`WorkerHost.reset` puts back what a fresh process would have, so that a
worker cannot tell a reused host from a new one:

- the worker object is dropped and collected (it must really be freed: a host whose worker is still
  referenced somewhere is not reused), and the default process group with every group made from it is
  destroyed, with the device meshes and DTensor shardings cached on them (the next group joins a new one,
  on a new port, and the host may hold another rank in it);
- the environment, the working directory, torch's thread count and global switches (default dtype, grad
  mode, float32 matmul precision, deterministic algorithms) are restored to what they were at the host's start;
- torch's default generators are reseeded with the seed a fresh process starts from, and Python's and
  NumPy's global generators from OS entropy, as a fresh process seeds them;
- on CUDA, the cached blocks are freed and the peak statistics reset; a host that still holds allocated
  CUDA memory is not reused.

A host that imported a module in :data:`NOT_REUSABLE` (vLLM: its in-process engine keeps process-wide state,
its own distributed groups among it, that cannot be torn down in place) is never reused.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mmrl.memory.peaks import reset_peak

# Modules whose import leaves state a worker's teardown cannot undo: a host that imported one is not reused.
NOT_REUSABLE = ("vllm",)


@dataclass(frozen=True)
class ProcessState:
    """The process-wide settings a worker may change, as a fresh host has them."""

    environ: dict[str, str]
    cwd: str
    threads: int
    seed: int
    default_dtype: torch.dtype
    grad_enabled: bool
    matmul_precision: str
    deterministic: bool

    @classmethod
    def capture(cls) -> ProcessState:
        return cls(environ=dict(os.environ), cwd=os.getcwd(), threads=torch.get_num_threads(),
                   seed=torch.initial_seed(), default_dtype=torch.get_default_dtype(),
                   grad_enabled=torch.is_grad_enabled(), matmul_precision=torch.get_float32_matmul_precision(),
                   deterministic=torch.are_deterministic_algorithms_enabled())

    def restore(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        torch.set_num_threads(self.threads)
        torch.set_default_dtype(self.default_dtype)
        torch.set_grad_enabled(self.grad_enabled)
        torch.set_float32_matmul_precision(self.matmul_precision)
        torch.use_deterministic_algorithms(self.deterministic)
        torch.manual_seed(self.seed)  # every device's default generator, as at the process's start
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()


class WorkerHost:
    """The Ray actor class of every rank (``ray.remote(WorkerHost)``): :meth:`start` builds the worker,
    :meth:`call` runs one of its methods, :meth:`reset` tears it down for the next one."""

    def __init__(self) -> None:
        self.fresh = ProcessState.capture()
        self.worker: Any = None

    def start(self, worker_cls: type, *args: Any) -> None:
        """Build ``worker_cls(*args)`` in this process (a host holds one worker at a time)."""
        assert self.worker is None, "a host holds one worker at a time"
        self.worker = worker_cls(*args)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The worker's ``method(*args, **kwargs)``, a ``mmrl.<method>`` span in a profile (:mod:`mmrl.perf.profile`)."""
        with torch.profiler.record_function(f"mmrl.{method}"):
            return getattr(self.worker, method)(*args, **kwargs)

    def ping(self) -> bool:
        """An idle host's sign of life."""
        return True

    def reset(self) -> bool:
        """Drop the worker and put the process back as a fresh host has it (see the module's docstring).
        Returns whether the host may serve another worker."""
        if callable(getattr(self.worker, "close", None)):
            self.worker.close()  # what it started outside this process (an agent's tool workers)
        dropped = weakref.ref(self.worker) if self.worker is not None else None
        self.worker = None
        if dist.is_initialized():
            dist.destroy_process_group()  # the default group and every group made from it
        forget_process_group_caches()
        for _ in range(3):  # again while a pass frees something: finalizers may release more cycles
            if not gc.collect():
                break
        # What outlives a worker (modules, their caches) is kept out of later collections: the next reset's full
        # collection, and a worker's own, scan only what was made since (one such scan took 0.2 s of CPU).
        gc.freeze()
        cuda = torch.cuda.is_initialized()
        if cuda:
            torch.cuda.synchronize()
            if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):  # cuBLAS keeps its workspaces allocated
                torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        reset_peak(torch.device("cpu"), trim=True)  # freed heap back to the OS, as a fresh process holds none
        self.fresh.restore()
        freed = dropped is None or dropped() is None
        clean = not cuda or torch.cuda.memory_allocated() == 0
        return freed and clean and not any(name in sys.modules for name in NOT_REUSABLE)


def forget_process_group_caches() -> None:
    """Drop process-wide caches that hold objects of a destroyed process group (a worker's modules are
    imported once per process, so such a cache would otherwise hand the next worker a dead group).

    DTensor's caches matter most: they are keyed by DeviceMeshes, which compare equal on every rank (a mesh's
    equality ignores which rank holds it), so after a host changes rank a cached sharding would return the
    old mesh object, with the old rank's coordinate: a parameter sharded for rank 1 would then report rank
    0's local shape and offset, and a checkpoint load would read the wrong slice.
    """
    sharding = sys.modules.get("mmrl.parallel.sharding")
    if sharding is not None:
        sharding._MESHES.clear()  # DeviceMeshes over the destroyed default group
    if "torch.distributed.tensor" in sys.modules:
        from torch.distributed.tensor import _redistribute
        from torch.distributed.tensor._collective_utils import MeshTopoInfo
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _clear_sharding_prop_cache()  # the Python and the C++ fast path's sharding propagation caches
        _redistribute._gen_transform_infos.cache_clear()
        MeshTopoInfo.build_from_mesh.cache_clear()
