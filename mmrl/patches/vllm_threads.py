"""Keep the trainer's torch thread count when vLLM's CPU engine starts in the same process.

Why: vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op for the whole process (it expects to
own its process and its OpenMP threads) and may first drop torch to one thread "for serving". In mmrl's
hybrid worker the trainer shares that process, and would be left on one thread, unable to change it.

What: :func:`keep_torch_threads` records the thread count and the function around the engine's start and
puts both back afterwards. vLLM's OpenMP core binding only happens in its multiprocess executor, which
mmrl does not use. Tested in tests/integration/test_vllm_engine.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def keep_torch_threads() -> Iterator[None]:
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
