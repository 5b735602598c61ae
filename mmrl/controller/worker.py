"""The Worker base: one rank of a WorkerGroup, with its rank environment and process group."""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from mmrl.controller.dispatch import Dispatch, register
from mmrl.memory.peaks import PEAK_KEY, group_peak_gb, peak_gb, reset_peak
from mmrl.perf.peak import Peak, measure_peak
from mmrl.perf.profile import RankProfile


def resolve_device(kind: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto`` takes this worker's GPU when CUDA is visible, else the CPU."""
    if kind == "cuda" or (kind == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("resources.device=cuda but no CUDA device is visible; use resources.device=auto")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


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
        """A new step: drop the prompt encodings this rank holds (:mod:`mmrl.workers.prompts`), if any, and open
        the step's peak-memory window (:mod:`mmrl.memory.peaks`)."""
        cache = getattr(self, "prompt_cache", None)
        if cache is not None:
            cache.clear()
        reset_peak(self.device)

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
    def start_profile(self) -> None:
        """Record this rank's work with torch's profiler until :meth:`stop_profile` (``trainer.profile_steps``)."""
        self.profile = RankProfile(self.device)
        self.profile.start()

    @register(Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> tuple[bytes, str]:
        """The recording since :meth:`start_profile`: its gzipped Chrome trace and its top operators' table."""
        return self.profile.stop()

    @register(Dispatch.ONE_TO_ALL)
    def measure_peak(self, hidden: int, intermediate: int, dtype: str) -> Peak:
        """This rank's matmul FLOP/s in ``dtype`` (:func:`mmrl.perf.peak.measure_peak`): the denominator of MFU."""
        return measure_peak(hidden, intermediate, self.device, getattr(torch, dtype))

    @register(Dispatch.ONE_TO_ALL)
    def peak_memory_gb(self) -> float:
        """This rank's peak memory in the current window (see :mod:`mmrl.memory.peaks`), GiB."""
        return peak_gb(self.device)

    @register(Dispatch.ONE_TO_ALL)
    def reset_peak_memory(self) -> float:
        """Open a new peak-memory window from the live memory (garbage collected, freed heap handed back to the
        OS first); returns that live memory, GiB."""
        return reset_peak(self.device, trim=True)

    def memory_metrics(self, group: str) -> dict[str, float]:
        """``perf/max_memory_gb/<group>``: the largest peak of this group's ranks in the current window, for a
        method's returned metrics (a collective: every rank of the group calls it)."""
        return {f"{PEAK_KEY}/{group}": group_peak_gb(self.device, self.rank, self.world_size, self.all_reduce_sum)}

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
