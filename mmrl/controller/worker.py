"""The Worker base: one rank of a WorkerGroup, with its rank environment and process group."""

from __future__ import annotations

import ctypes
import datetime
import gc
import os
import resource
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from mmrl.controller.dispatch import Dispatch, register


def resolve_device(kind: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto`` takes this worker's GPU when CUDA is visible, else the CPU."""
    if kind == "cuda" or (kind == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("resources.device=cuda but no CUDA device is visible; use resources.device=auto")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _status_mb(field: str) -> float | None:
    """A memory field of /proc/self/status (e.g. VmRSS, VmHWM) in MiB; None where /proc is missing."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return None


def rss_mb() -> float:
    """Current resident memory of this process, MiB (0 where /proc is missing)."""
    return _status_mb("VmRSS") or 0.0


def peak_rss_mb() -> float:
    """VmHWM (peak RSS, resettable through /proc/self/clear_refs) or, elsewhere, ru_maxrss; MiB."""
    peak = _status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Worker:
    """Base of every SPMD worker. Subclasses register methods with ``@register(Dispatch.X)``."""

    def __init__(self, rank: int, world_size: int, threads: int = 0, device: str = "auto") -> None:
        self.rank, self.world_size = rank, world_size
        if threads > 0:
            torch.set_num_threads(threads)
        # Ray sets CUDA_VISIBLE_DEVICES to this bundle's GPU, so the local index is 0.
        self.device = resolve_device(device, 0)

    def node_address(self) -> tuple[str, int]:
        """This node's IP and a free port, for rank 0 to host the process group's rendezvous."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def init_process_group(self, master_addr: str, master_port: int, timeout_s: float = 1800.0) -> None:
        """Join the group's process group: nccl on GPU, gloo on CPU. A collective that waits longer than
        ``timeout_s`` for a peer (dead or hung) fails instead of hanging."""
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
        )
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(
                backend, init_method=f"tcp://{master_addr}:{master_port}", rank=self.rank,
                world_size=self.world_size, timeout=datetime.timedelta(seconds=timeout_s),
            )

    @register(Dispatch.ONE_TO_ALL)
    def drop_prompts(self) -> None:
        """A new step: drop the prompt encodings this rank holds (:mod:`mmrl.workers.prompts`), if any."""
        cache = getattr(self, "prompt_cache", None)
        if cache is not None:
            cache.clear()

    @register(Dispatch.ONE_TO_ALL)
    def torch_threads(self) -> int:
        """The torch intra-op threads this rank computes with."""
        return torch.get_num_threads()

    @register(Dispatch.ONE_TO_ALL)
    def node_id(self) -> str:
        """The Ray node this rank runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    @register(Dispatch.ONE_TO_ALL)
    def peak_rss_mb(self) -> float:
        """Peak resident memory of this worker process (since start or the last reset), MiB."""
        return peak_rss_mb()

    @register(Dispatch.ONE_TO_ALL)
    def reset_peak_rss(self) -> float:
        """Start a new peak-memory window (Linux) and return the resident memory it starts from, MiB.

        Freed heap is first handed back to the OS (glibc ``malloc_trim``), so that the start is the live
        memory rather than what loading once touched.
        """
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
        return rss_mb()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; a no-op for one rank.

        The collective runs on the worker's device (nccl takes no CPU tensors: the update's metric sums and
        token counts are built on the CPU), and the result is copied back into ``tensor``.
        """
        if self.world_size > 1:
            on_device = tensor.to(self.device)
            dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
            if on_device is not tensor:
                tensor.copy_(on_device)
        return tensor
