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


def sum_replicated_grads(params: Sequence[nn.Parameter], all_reduce: AllReduce) -> None:
    """Sum the gradients of replicated ``params`` over ranks (one flat buffer).

    A parameter this rank did not use (the vision encoder on a text-only slice) gets a zero gradient
    first, so that every rank contributes the same buffer.
    """
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    all_reduce(flat)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def _shard_sq_norm(grads: Sequence[DTensor]) -> torch.Tensor:
    """Sum of squares of the full gradients behind DTensor ``grads`` (all on one mesh and placement)."""
    local = torch.stack([g.to_local().double().pow(2).sum() for g in grads]).sum()
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
    total = torch.zeros((), dtype=torch.float64)
    for g in plain:
        total += g.detach().double().pow(2).sum().cpu()
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
            for g in plain:
                g.mul_(scale)
            for g in sharded:
                g.to_local().mul_(scale)
    return norm
