"""Per-part layouts of a vision-language model over one worker group (FSDP2 or replication).

A VLM has two parts that want different layouts: the vision encoder (small, often frozen) and the
language model (most of the parameters). Each part gets a :class:`~mmrl.config.PartConfig`:

===========  =====================================================================================
replicate    a full copy on every rank; gradients summed over ranks by hand (:mod:`mmrl.parallel.grads`)
fsdp         FSDP2 ``fully_shard`` over all ranks: each block (vision block / decoder layer) is one unit
hsdp         FSDP2 on a 2-D mesh: sharded within groups of ``shard_size`` ranks, replicated across them
===========  =====================================================================================

The root module (a :class:`~mmrl.models.forward.PolicyForward` or
:class:`~mmrl.models.forward.ValueModel`) is sharded last, with the LLM's strategy; it owns the
embeddings, the final norm and the head, and ignores a replicated vision encoder.

Activation checkpointing (``activation_checkpointing`` of each part, :mod:`mmrl.parallel.checkpointing`) is
applied to the part's blocks before they are sharded.

Gradients: FSDP2 averages by default; here every loss is already normalised by the global token count,
so FSDP's divide factor is set to 1 and gradients are *summed*, like the replicated parts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from mmrl.config import PartConfig
from mmrl.models.families import family_of
from mmrl.parallel.checkpointing import apply_activation_checkpointing

_MESHES: dict[tuple[str, tuple[int, ...]], DeviceMesh] = {}


def device_mesh(spec: PartConfig, world_size: int, device: torch.device) -> DeviceMesh:
    """A 1-D mesh over all ranks (fsdp) or a 2-D (replicate, shard) mesh (hsdp); cached per shape.

    Every rank must call this in the same order (creating a mesh creates process groups).
    """
    shard = world_size if spec.strategy == "fsdp" else spec.shard_size
    if shard < 1 or world_size % shard:
        raise ValueError(f"hsdp shard_size={spec.shard_size} must divide the world size {world_size}")
    shape = (world_size,) if spec.strategy == "fsdp" else (world_size // shard, shard)
    key = (device.type, shape)
    if key not in _MESHES:
        names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
        _MESHES[key] = init_device_mesh(device.type, shape, mesh_dim_names=names)
    return _MESHES[key]


@dataclass
class Layout:
    """What sharding did to a root module: its sharded and replicated trainable parameters."""

    root: nn.Module
    vision: PartConfig
    llm: PartConfig
    sharded: list[nn.Parameter] = field(default_factory=list)
    replicated: list[nn.Parameter] = field(default_factory=list)

    @property
    def is_sharded(self) -> bool:
        """Whether any part is laid out by FSDP (then no rank holds the full weights)."""
        return self.vision.strategy != "replicate" or self.llm.strategy != "replicate"

    def trainable(self) -> list[nn.Parameter]:
        return [*self.sharded, *self.replicated]


def model_blocks(root: nn.Module) -> tuple[nn.Module, list[nn.Module], list[nn.Module]]:
    """(the vision tower, its blocks, the LLM's decoder layers) of ``root``, as its family's groups declare them
    (:mod:`mmrl.models.families.groups`)."""
    family = family_of(root.core.config)
    return (family.vision(root.core), list(family.vision_blocks(root.core)),
            list(family.decoder_layers(root.core)))


def shard_parts(root: nn.Module, vision: PartConfig, llm: PartConfig, world_size: int, device: torch.device) -> Layout:
    """Apply ``vision`` and ``llm`` layouts to ``root`` in place.

    ``root`` is a :class:`~mmrl.models.forward.PolicyForward` or :class:`~mmrl.models.forward.ValueModel`
    (its ``.core`` is the VLM, its ``.always_run_vision`` is set here).

    Must run on every rank with the same arguments. A frozen part keeps ``requires_grad=False`` and so
    gets no gradients and no optimizer state. A part's activation checkpointing is set before it is sharded.
    """
    visual, blocks, layers = model_blocks(root)
    for part, spec, units in (("vision", vision, blocks), ("llm", llm, layers)):
        if spec.activation_checkpointing:
            apply_activation_checkpointing(units, part)
    if vision.strategy != "replicate":
        mesh = device_mesh(vision, world_size, device)
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(visual, mesh=mesh)
    if llm.strategy != "replicate":
        mesh = device_mesh(llm, world_size, device)
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        ignored = set(visual.parameters()) if vision.strategy == "replicate" else None
        fully_shard(root, mesh=mesh, ignored_params=ignored)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    root.always_run_vision = vision.strategy != "replicate"
    layout = Layout(root=root, vision=vision, llm=llm)
    for p in root.parameters():
        if p.requires_grad:
            (layout.sharded if isinstance(p, DTensor) else layout.replicated).append(p)
    return layout


def full_state(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every parameter of ``module``, one at a time.

    A sharded parameter is all-gathered (a collective: every rank must iterate in step); a replicated
    one is yielded as is (no copy). Holding only one gathered tensor at a time bounds the peak.
    """
    for name, param in module.named_parameters():
        tensor = param.full_tensor() if isinstance(param, DTensor) else param
        yield name, tensor.detach()
