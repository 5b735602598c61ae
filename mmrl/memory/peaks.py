"""The peak memory of this process over a window: the ``perf/max_memory_gb`` metric (verl's name).

=======  ==========================================  ================================================
device   peak                                        reset (the start of a window)
=======  ==========================================  ================================================
cuda     ``torch.cuda.max_memory_allocated``         ``torch.cuda.reset_peak_memory_stats``
cpu      VmHWM of /proc/self/status (peak RSS)       write "5" to /proc/self/clear_refs (VmHWM := RSS)
=======  ==========================================  ================================================

On the GPU it counts what torch's caching allocator handed out on this process's device; memory outside it
(the CUDA context, NCCL buffers, an engine's own memory pool) is not counted. On the CPU it is the resident
memory of the whole process, whatever allocated it. Where /proc/self/clear_refs cannot be written (not
Linux, or a sandbox that refuses it) the window cannot be reset: the peak is then ``ru_maxrss`` of
``resource.getrusage``, the process's peak since it started, and a window's peak is at least that of every
window before it.

Values are GiB (2**30 bytes), the unit verl's ``*_gb`` metrics use. The trainer opens a window on every rank
of every worker group at the start of each step and logs ``perf/max_memory_gb/<group>`` (the largest peak of
the group's ranks) and ``perf/max_memory_gb`` (the largest over the groups).
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys
from collections.abc import Callable
from pathlib import Path

import torch

GIB = 2**30
PEAK_KEY = "perf/max_memory_gb"
_resettable = {"cpu": False}  # whether the last CPU window could be reset (clear_refs written)


def _status_kib(field: str) -> int | None:
    """A memory field of /proc/self/status (e.g. VmRSS, VmHWM) in KiB; None where /proc is missing."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return None


def live_gb(device: torch.device) -> float:
    """Memory held now: CUDA's allocated bytes on ``device``, or this process's resident set (0 without /proc)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / GIB
    return (_status_kib("VmRSS") or 0) * 1024 / GIB


def reset_peak(device: torch.device, trim: bool = False) -> float:
    """Start a new window on ``device``; returns the memory it starts from (:func:`live_gb`), GiB.

    ``trim``: first collect garbage and (CPU, glibc) hand freed heap back to the OS (``malloc_trim``), so that
    the window starts from the live memory rather than from what the process once touched (a benchmark's
    start; a training step does not trim, so that it does not fault the same pages in again every step).
    """
    if trim:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return live_gb(device)
    if trim:
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass  # not glibc: the start includes freed heap
    try:
        Path("/proc/self/clear_refs").write_text("5")
        _resettable["cpu"] = True
    except OSError:
        _resettable["cpu"] = False
    return live_gb(device)


def peak_gb(device: torch.device) -> float:
    """The peak of the current window on ``device`` (since :func:`reset_peak`, or since the process started
    where no window could be reset), GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    hwm = _status_kib("VmHWM") if _resettable["cpu"] else None
    if hwm is not None:
        return hwm * 1024 / GIB
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return maxrss * (1 if sys.platform == "darwin" else 1024) / GIB


def group_peak_gb(device: torch.device, rank: int, world_size: int,
                  all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """The largest :func:`peak_gb` of a group's ranks, on every rank (a collective: every rank calls it).
    ``all_reduce`` sums over the ranks: each rank fills its own slot of a zero vector."""
    slots = torch.zeros(world_size, dtype=torch.float64)
    slots[rank] = peak_gb(device)
    return float(all_reduce(slots).max())
