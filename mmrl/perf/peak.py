"""The machine's matmul peak, measured in the run that reports MFU against it.

A datasheet peak means little on a shared CPU (its cores, its clock, its threads) and a GPU's depends on the
dtype, so each rank measures what its device does with the run's threads and dtype: a large square matmul (the
denominator of MFU) and one of the model's own shapes (tokens x hidden @ hidden x intermediate: what the dense
layers can reach). The operands come from a private generator, so measuring moves no random stream of the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

LARGE = {"cpu": 2048, "cuda": 8192}
"""The large matmul's side per device type: big enough to reach the device's peak, small enough to take well
under a second."""


@dataclass(frozen=True)
class Peak:
    """FLOP/s of one device: ``large`` (a LARGE x LARGE square matmul) and ``model`` (the model's shape)."""

    large: float
    model: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(m: int, k: int, n: int, device: torch.device, dtype: torch.dtype, seconds: float = 0.25) -> float:
    """The best FLOP/s of (m, k) @ (k, n) over repeats filling about ``seconds`` (after one warm-up product)."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, generator=generator, device=device).to(dtype)
    b = torch.randn(k, n, generator=generator, device=device).to(dtype)
    torch.mm(a, b)
    _sync(device)
    best, spent = 0.0, 0.0
    while spent < seconds:
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        took = time.perf_counter() - start
        spent += took
        best = max(best, 2 * m * k * n / took)
    return best


def measure_peak(hidden: int, intermediate: int, device: torch.device, dtype: torch.dtype,
                 tokens: int = 1024) -> Peak:
    """This device's :class:`Peak` in ``dtype`` with the process's torch threads; ``hidden`` and
    ``intermediate``: the language model's widths, ``tokens`` the rows of its shape."""
    side = LARGE.get(device.type, LARGE["cpu"])
    return Peak(large=matmul_rate(side, side, side, device, dtype),
                model=matmul_rate(tokens, hidden, intermediate, device, dtype))
