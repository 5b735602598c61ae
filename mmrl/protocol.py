"""``Batch``: the one container that moves between the controller and the workers.

A Batch holds, for B samples:

- ``tensors``: torch tensors that all share dim 0 (size B), e.g. ``responses (B, R)``;
- ``objects``: per-sample Python objects in lists of length B (prompt encodings, ground truths, uids).
  Samples of one prompt hold the *same* object, so a prompt's media is pickled once however many
  responses point at it;
- ``meta``: batch-wide values, copied by every operation (for a user's own flags: the framework sets none).

The keys the framework uses are listed in :data:`KNOWN_KEYS` with their shapes; a worker asks for what
it needs with :meth:`Batch.require`, which names the missing key and the stage that produces it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

KNOWN_KEYS: dict[str, str] = {
    # prompts (one row per prompt before rollout, one per sample after it)
    "uid": "object: id of the prompt; the n samples of one prompt share it",
    "messages": "object: chat messages with <image> / <video> placeholders",
    "images": "object: list of PNG bytes of the prompt",
    "videos": "object: list of the prompt's videos, each {frames: PNG bytes, timestamps: seconds}",
    "answer": "object: ground truth",
    "data_source": "object: task / data set name",
    "extra": "object: dict of the row's other fields",
    "prompt": "object: EncodedPrompt (token ids, pixels, grids) of the prompt",
    # rollout
    "responses": "tensor (B, R) int64: response token ids, right-padded",
    "response_mask": "tensor (B, R) float32: the attention extent, 1 on every response token (eos and holes "
    "included), 0 on padding",
    "policy_mask": "tensor (B, R) float32: 1 on the tokens the policy sampled, 0 at holes (a tool's output, an "
    "environment's turn) and padding; a subset of response_mask, which it equals when absent (mmrl.trajectory)",
    "response_text": "object: decoded response",
    "prompt_tokens": "tensor (B,) int64: tokens of the sample's prompt (image tokens included)",
    "image_grids": "object: the prompt's image grids as the model saw them, a list of (t, h, w) per image",
    "vision_grids": "object: the (t, h, w) grids of the prompt's images, then its videos: its vision tower's items",
    "tool_grids": "object: an agent episode's tool turns' image grids, (t, h, w) each, in order",
    "weight_version": "tensor (B,) int64: the version of the policy weights that sampled the response (with "
                      "in-flight updates, its first token, the oldest)",
    "token_versions": "tensor (B, R) int64: with in-flight weight updates (rollout.partial), the version that "
                      "sampled each response token",
    "rollout_log_probs": "tensor (B, R) float32: log-probs the rollout engine reported",
    # actor / reference
    "old_log_probs": "tensor (B, R) float32: log-probs of the policy before the update",
    "ref_log_probs": "tensor (B, R) float32: log-probs of the reference policy",
    "entropy": "tensor (B, R) float32: per-token entropy of the policy",
    # driver
    "token_level_rewards": "tensor (B, R) float32: the reward stage's score, on the last policy token",
    "advantages": "tensor (B, R) float32",
    "values": "tensor (B, R) float32: the critic's V(s_t) before each response token, at rollout time",
    "returns": "tensor (B, R) float32: GAE targets of the value loss (advantages + values)",
    "correct": "tensor (B,) float32: 1 where the verifier accepted the response",
    "baseline_scores": "tensor (B,) float32: the reward of a greedy response to the sample's prompt (ReMax)",
    "win_rates": "tensor (B,) float32: the share of its group a response beats, ties counting half (SPPO)",
    # dispatch
    "is_pad": "tensor (B,) bool: True on rows DP_COMPUTE dispatch added so every rank gets as many rows; "
    "their response_mask and advantages are zero; leave them out of per-sequence counts",
}


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    objects: dict[str, list[Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = {f"tensor {k}": v.shape[0] for k, v in self.tensors.items()}
        sizes.update({f"object {k}": len(v) for k, v in self.objects.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch fields disagree on the batch size (dim 0): {sizes}")
        for key, value in self.objects.items():
            if not isinstance(value, list):
                raise TypeError(f"Batch object field {key!r} must be a list, got {type(value).__name__}")

    def __len__(self) -> int:
        for value in self.tensors.values():
            return value.shape[0]
        for value in self.objects.values():
            return len(value)
        return 0

    def keys(self) -> list[str]:
        return [*self.tensors, *self.objects]

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.objects:
            return self.objects[key]
        raise KeyError(f"Batch has no field {key!r}; it has {self.keys()}")

    def require(self, *keys: str) -> None:
        """Raise a KeyError naming every missing field and what it is."""
        missing = [k for k in keys if k not in self.tensors and k not in self.objects]
        if missing:
            described = "; ".join(f"{k} ({KNOWN_KEYS.get(k, 'custom field')})" for k in missing)
            raise KeyError(f"Batch is missing {described}; it has {self.keys()}")

    # ---- selection ----------------------------------------------------------------------------

    def select(self, indices: Sequence[int] | torch.Tensor) -> Batch:
        """The samples at ``indices``, in that order."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        positions = idx.tolist()
        return Batch(
            tensors={k: v[idx] for k, v in self.tensors.items()},
            objects={k: [v[i] for i in positions] for k, v in self.objects.items()},
            meta=dict(self.meta),
        )

    def slice(self, start: int, stop: int) -> Batch:
        return Batch(
            tensors={k: v[start:stop] for k, v in self.tensors.items()},
            objects={k: v[start:stop] for k, v in self.objects.items()},
            meta=dict(self.meta),
        )

    def split(self, sizes: Sequence[int]) -> list[Batch]:
        """Consecutive pieces of the given sizes (which must add up to ``len(self)``)."""
        if sum(sizes) != len(self) or any(s < 0 for s in sizes):
            raise ValueError(f"split sizes {list(sizes)} do not add up to the batch size {len(self)}")
        pieces, start = [], 0
        for size in sizes:
            pieces.append(self.slice(start, start + size))
            start += size
        return pieces

    def chunk(self, num_chunks: int) -> list[Batch]:
        """``num_chunks`` consecutive pieces whose sizes differ by at most one (larger ones first)."""
        return self.split(balanced_sizes(len(self), num_chunks))

    def repeat(self, times: int, interleave: bool = True) -> Batch:
        """Each sample ``times`` times: ``a a b b`` when interleaved, ``a b a b`` otherwise.

        Objects are repeated by reference, so the copies share one prompt encoding.
        """
        n = len(self)
        order = torch.arange(n).repeat_interleave(times) if interleave else torch.arange(n).repeat(times)
        return self.select(order)

    # ---- combination --------------------------------------------------------------------------

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Samples of all ``batches`` in order; all must have the same fields and trailing shapes."""
        if not batches:
            raise ValueError("Batch.concat needs at least one batch")
        first = batches[0]
        for other in batches[1:]:
            if set(other.tensors) != set(first.tensors) or set(other.objects) != set(first.objects):
                raise ValueError(f"Batch.concat: fields differ: {first.keys()} vs {other.keys()}")
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors}
        objects = {k: [x for b in batches for x in b.objects[k]] for k in first.objects}
        return Batch(tensors=tensors, objects=objects, meta=dict(first.meta))

    def union(self, other: Batch) -> Batch:
        """Fields of both; a field present in both must hold equal values."""
        if len(other) != len(self) and other.keys() and self.keys():
            raise ValueError(f"Batch.union: sizes differ ({len(self)} vs {len(other)})")
        tensors = dict(self.tensors)
        for key, value in other.tensors.items():
            if key in tensors and not torch.equal(tensors[key], value):
                raise ValueError(f"Batch.union: tensor {key!r} differs between the two batches")
            tensors[key] = value
        objects = dict(self.objects)
        for key, value in other.objects.items():
            if key in objects and objects[key] != value:
                raise ValueError(f"Batch.union: object field {key!r} differs between the two batches")
            objects[key] = value
        return Batch(tensors=tensors, objects=objects, meta={**self.meta, **other.meta})

    def select_fields(self, *keys: str, optional: Sequence[str] = ()) -> Batch:
        """A new Batch with only ``keys`` (each required) and those of ``optional`` it has; meta is kept."""
        self.require(*keys)
        wanted = [*keys, *optional]
        return Batch(
            tensors={k: v for k, v in self.tensors.items() if k in wanted},
            objects={k: v for k, v in self.objects.items() if k in wanted},
            meta=dict(self.meta),
        )

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            tensors={k: v.to(device) for k, v in self.tensors.items()},
            objects=self.objects,
            meta=dict(self.meta),
        )


def balanced_sizes(total: int, num_chunks: int) -> list[int]:
    """``total`` split into ``num_chunks`` sizes differing by at most one, larger first."""
    if num_chunks <= 0:
        raise ValueError(f"num_chunks must be positive, got {num_chunks}")
    base, extra = divmod(total, num_chunks)
    return [base + (1 if i < extra else 0) for i in range(num_chunks)]


def sample_tokens(batch: Batch) -> list[int]:
    """Per-sample token count, the weight by which DP_COMPUTE balances ranks. Returns B ints.

    The prompt's tokens, image tokens included: ``len(prompt)`` when the batch holds the encodings, else
    ``prompt_tokens`` (which rollout returns), else an estimate from the prompt rows' media and text
    (:func:`estimate_prompt_tokens`), else 1; plus ``response_mask.sum(-1)`` when the batch has responses.
    """
    count = len(batch)
    if "prompt" in batch.objects:
        weights = [len(p) for p in batch.objects["prompt"]]
    elif "prompt_tokens" in batch.tensors:
        weights = batch.tensors["prompt_tokens"].long().tolist()
    elif "messages" in batch.objects:
        videos = batch.objects.get("videos", [[]] * count)
        weights = [estimate_prompt_tokens(m, i, v) for m, i, v in
                   zip(batch.objects["messages"], batch.objects.get("images", [[]] * count), videos)]
    else:
        weights = [1] * count
    if "response_mask" in batch.tensors:
        responses = batch.tensors["response_mask"].sum(-1).round().long().tolist()
        weights = [w + r for w, r in zip(weights, responses)]
    return weights


PIXELS_PER_TOKEN = 28 * 28
"""Pixels per vision token in the estimate (14-pixel patches merged 2 x 2, as most VLMs here); only balance depends on it."""


def estimate_prompt_tokens(messages: Any, images: Any, videos: Any) -> int:
    """A prompt row's tokens before it is encoded: its text's characters / 4, plus its images' and video frames'
    pixels / :data:`PIXELS_PER_TOKEN` (video frames count half: two frames share a temporal patch). Reads
    only the image headers. None (media a rank already holds) counts 1."""
    if messages is None:
        return 1
    from PIL import Image  # here: the protocol is imported where PIL is not needed

    def pixels(data: bytes) -> int:
        width, height = Image.open(io.BytesIO(data)).size
        return width * height

    text = sum(len(m.get("content", "")) for m in messages if isinstance(m.get("content"), str))
    image_pixels = sum(pixels(b) for b in images or [])
    frame_pixels = sum(pixels(f) for v in videos or [] for f in v["frames"]) // 2
    return 1 + text // 4 + (image_pixels + frame_pixels) // PIXELS_PER_TOKEN
