"""How the async mode's weights travel from the trainer's ranks to the rollout pool (``rollout.weight_transport``).

A transport has two ends. :meth:`WeightTransport.send` runs on every trainer rank after an update, with the
actor's full tensors by Hugging Face name (the ranks gather them first: a collective); :meth:`receive` runs on
a rollout rank before each generation batch and returns the newest version when it is newer than the one the
rank holds. The transport object is built on the driver and handed to both groups, so it must pickle.

- ``object_store`` (built): rank 0 puts the tensors in Ray's object store once and hands the reference to a
  :class:`WeightStore` actor; a rollout rank asks the store for the newest (version, reference) and reads the
  tensors from the object store. On CPU, and across nodes, this is the plain path.
- ``nccl`` (the seam, not built: refused at config load): on GPUs the trainer's rank 0 would broadcast each
  tensor to the rollout ranks over a NCCL group of their own (or hand out CUDA-IPC handles on one node), the
  store keeping only the version; ``send`` and ``receive`` keep their signatures.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch

TRANSPORTS = ("object_store", "nccl")


class WeightStore:
    """The newest published weights: (version, [object ref]), as a Ray actor (``ray.remote(WeightStore)``).
    The reference is wrapped in a list so that Ray hands it on instead of resolving it."""

    def __init__(self) -> None:
        self.version, self.ref = -1, None

    def publish(self, version: int, ref: list) -> None:
        if version > self.version:
            self.version, self.ref = version, ref

    def latest(self) -> tuple[int, list | None]:
        return self.version, self.ref


class WeightTransport(Protocol):
    def send(self, version: int, weights: Iterable[tuple[str, torch.Tensor]], rank: int) -> None:
        """On every trainer rank: publish ``weights`` (full tensors) as ``version``."""

    def receive(self, held: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        """On a rollout rank holding version ``held``: (version, full tensors by name) when a newer one is
        published, else None."""


class ObjectStoreTransport:
    """``rollout.weight_transport=object_store``: through Ray's object store and a :class:`WeightStore` actor."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def send(self, version: int, weights: Iterable[tuple[str, torch.Tensor]], rank: int) -> None:
        import ray

        state = {name: tensor.detach().cpu() for name, tensor in weights}
        if rank == 0:
            ray.get(self.store.publish.remote(version, [ray.put(state)]))

    def receive(self, held: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        import ray

        version, ref = ray.get(self.store.latest.remote())
        if ref is None or version <= held:
            return None
        return version, ray.get(ref[0])


def build_transport(name: str) -> WeightTransport:
    """The run's transport, on the driver (Ray initialised)."""
    if name == "object_store":
        import ray

        return ObjectStoreTransport(ray.remote(WeightStore).options(num_cpus=0).remote())
    if name == "nccl":
        raise NotImplementedError("rollout.weight_transport=nccl: the NCCL/CUDA-IPC broadcast to the rollout pool "
                                  "is a seam, not built (mmrl/trainer/weight_transport.py); use object_store")
    raise ValueError(f"rollout.weight_transport={name!r}: choose one of {', '.join(TRANSPORTS)}")
