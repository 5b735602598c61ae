"""CPU worker processes keep the heap memory they free, so that the next step's tensors of the same sizes reuse it.

glibc's malloc serves a block over its mmap threshold (which adapts up to 32 MiB on 64-bit) with a fresh
``mmap`` and unmaps it on ``free``, and it returns the top of the heap to the OS once more than the trim threshold
is free there. A training step on a CPU allocates and frees many blocks of the same large sizes (an update's
(tokens, intermediate) activations: 16,000 x 512 float32 is 33 MB), so with the defaults each of them is faulted
in again, page by page, every time. :data:`ALLOCATOR_ENV` serves large blocks from the heap and keeps what is
freed there. Measured on bench-peer's 64 x 8 x 32 GRPO step (2 cores), the same command twice each way: 179 and
189 samples/s with glibc's defaults, 258 and 265 with these settings in the workers' environment.

glibc reads them when a process starts, so they reach the Ray workers through the session's runtime environment
(:func:`mmrl.controller.session.ensure_ray`), on CPU only: a GPU worker's tensors live in the CUDA caching
allocator, and its host memory (staging a checkpoint) should go back to the OS. The cost on a CPU: a process's
resident memory stays at its high-water mark instead of shrinking when it frees
(:func:`mmrl.memory.peaks.reset_peak` with ``trim`` still hands the free heap back, between runs).
"""

from __future__ import annotations

import os
import sys

ALLOCATOR_ENV = {
    "MALLOC_MMAP_MAX_": "0",  # no block gets its own mmap: large ones come from the heap too
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),  # free heap is never handed back on free
    "MALLOC_TOP_PAD_": str(256 << 20),  # the heap grows 256 MiB beyond each request that extends it
}


def allocator_env(device_type: str) -> dict[str, str]:
    """The environment variables a worker process on ``device_type`` ("cpu", "cuda") starts with."""
    return dict(ALLOCATOR_ENV) if device_type == "cpu" else {}


def reexec_with_allocator_env(module: str, argv: list[str]) -> None:
    """Restart this process as ``python -m module argv`` with :data:`ALLOCATOR_ENV` unless it already has it: a
    benchmark that runs a peer in its own process gives the peer the allocator mmrl's CPU workers have."""
    if all(os.environ.get(key) == value for key, value in ALLOCATOR_ENV.items()):
        return
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], {**os.environ, **ALLOCATOR_ENV})
