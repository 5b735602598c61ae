"""Gradient synchronisation and clipping across a mix of replicated and FSDP-sharded parameters.

FSDP2 reduces the gradients of sharded parameters itself (reduce-scatter, plus an all-reduce across the
replica groups of hsdp). Replicated parameters are summed here in one flat buffer. The global gradient
norm adds the replicated gradients (identical on every rank after the sum) to the squared norms of the
local gradient shards, summed over each mesh's shard dimension.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

AllReduce = Callable[[torch.Tensor], torch.Tensor]
"""A sum over the data-parallel ranks: sums the tensor in place and returns it (the identity on one rank)."""


BUCKET_BYTES = 64 * 2**20
"""Replicated gradients are summed in flat buffers of at most this size (a larger gradient alone, in place), so
the sum holds one bucket more, not a second copy of every gradient."""
NORM_CHUNK = 1 << 22
"""Elements squared in float64 at a time by the gradient norm (32 MiB), not a float64 copy of a whole gradient."""


def sum_replicated_grads(params: Sequence[nn.Parameter], all_reduce: AllReduce) -> None:
    """Sum the gradients of replicated ``params`` over ranks, in buckets of at most BUCKET_BYTES (every rank
    forms the same buckets: the parameters, their order and shapes are the same).

    A parameter this rank did not use (the vision encoder on a text-only slice) gets a zero gradient
    first, so that every rank contributes the same buffers.
    """
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for bucket in buckets([p.grad for p in params], BUCKET_BYTES):
        if len(bucket) == 1 and bucket[0].is_contiguous():
            all_reduce(bucket[0])  # in place
            continue
        flat = all_reduce(torch.cat([g.reshape(-1) for g in bucket]))
        torch._foreach_copy_(bucket, [part.view_as(g) for part, g in zip(flat.split([g.numel() for g in bucket]),
                                                                          bucket)])


def buckets(tensors: Sequence[torch.Tensor], max_bytes: int) -> list[list[torch.Tensor]]:
    """``tensors`` in order, cut into runs of at most ``max_bytes`` (a larger tensor forms a run of its own)."""
    runs: list[list[torch.Tensor]] = []
    size = max_bytes
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if size + nbytes > max_bytes:
            runs.append([])
            size = 0
        runs[-1].append(t)
        size += nbytes
    return runs


def sq_norm(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of squares of ``tensor``, float64 (a (), on its device), NORM_CHUNK elements at a time."""
    total = torch.zeros((), dtype=torch.float64, device=tensor.device)
    for chunk in tensor.detach().reshape(-1).split(NORM_CHUNK):
        total += chunk.double().pow_(2).sum()
    return total


def plain_sq_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sum of squares of all ``grads`` (a float64 ()): each tensor's norm in one fused call per device and
    dtype (torch's foreach kernels accumulate in float32 or wider), squared and summed in float64; a gradient of
    more than NORM_CHUNK elements goes by :func:`sq_norm`."""
    small = [g for g in grads if g.numel() <= NORM_CHUNK]
    total = torch.zeros((), dtype=torch.float64, device=grads[0].device if grads else "cpu")
    for g in grads:
        if g.numel() > NORM_CHUNK:
            total += sq_norm(g).to(total.device)
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in small:
        by_kind.setdefault((g.device, g.dtype), []).append(g)
    for group in by_kind.values():
        norms = torch.stack(torch._foreach_norm(group, 2)).double()
        total += norms.pow(2).sum().to(total.device)
    return total


def _shard_sq_norm(grads: Sequence[DTensor]) -> torch.Tensor:
    """Sum of squares of the full gradients behind DTensor ``grads`` (all on one mesh and placement)."""
    local = torch.stack([sq_norm(g.to_local()) for g in grads]).sum()
    mesh = grads[0].device_mesh
    for dim, placement in enumerate(grads[0].placements):
        if placement.is_shard():
            dist.all_reduce(local, group=mesh.get_group(dim))
    return local


def clip_grad_norm(params: Sequence[nn.Parameter], max_norm: float) -> float:
    """Scale all gradients so that their global L2 norm is at most ``max_norm``; returns the pre-clip norm.

    Call after the gradients are synchronised. Every rank must call it (it runs collectives).
    """
    plain = [p.grad for p in params if p.grad is not None and not isinstance(p.grad, DTensor)]
    sharded = [p.grad for p in params if isinstance(p.grad, DTensor)]
    total = plain_sq_norm(plain).cpu()
    # Grouped in parameter order, which every rank shares, so the collectives line up.
    groups: dict[tuple, list[DTensor]] = {}
    for g in sharded:
        mesh = g.device_mesh
        groups.setdefault((tuple(mesh.mesh.flatten().tolist()), mesh.mesh_dim_names, tuple(g.placements)), []).append(g)
    for grads in groups.values():
        total += _shard_sq_norm(grads).cpu()
    norm = math.sqrt(float(total))
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        with torch.no_grad():
            if plain:
                torch._foreach_mul_(plain, scale)
            for g in sharded:
                g.to_local().mul_(scale)
    return norm
