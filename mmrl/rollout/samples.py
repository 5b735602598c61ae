"""Turn a Batch of prompt rows into a Batch of samples with any rollout engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mmrl.models.encoding import EncodedPrompt, PromptParts, encode_prompts, media_grids
from mmrl.protocol import Batch
from mmrl.rollout.base import RolloutEngine, SamplingParams
from mmrl.schema import decode_image, decode_video


def encode_row(processor: Any, messages: list[dict], images: list[bytes], videos: list[dict] | None,
               name: str) -> EncodedPrompt:
    """One prompt row (``<image>`` / ``<video>`` placeholders in ``messages``, PNG bytes, stored frames) ->
    its EncodedPrompt, named ``name`` in error messages."""
    return encode_prompts(processor, [row_parts(messages, images, videos, name)])[0]


def row_parts(messages: list[dict], images: list[bytes], videos: list[dict] | None, name: str) -> PromptParts:
    """One prompt row's parts (PNG bytes and stored frames decoded), for :func:`encode_prompts`."""
    return PromptParts(messages, [decode_image(b) for b in images], [decode_video(v) for v in videos or []], name)


def encode_rows(processor: Any, prompts: Batch) -> list[EncodedPrompt]:
    """One EncodedPrompt per prompt row (``messages``, ``images``, optional ``videos``), named by its ``uid``
    when the Batch has one; the processor runs once on them all where the family can."""
    prompts.require("messages", "images")
    count = len(prompts)
    names = prompts["uid"] if "uid" in prompts.objects else [f"#{i}" for i in range(count)]
    videos = prompts["videos"] if "videos" in prompts.objects else [[]] * count
    return encode_prompts(processor, [row_parts(m, i, v, str(name))
                                      for m, i, v, name in zip(prompts["messages"], prompts["images"], videos, names)])


def generate_samples(engine: RolloutEngine, processor: Any, prompts: Batch, params: SamplingParams) -> Batch:
    """Prompt rows -> their samples (:func:`sample_encoded`, version 0, with the encodings), for the stages
    that generate in one process (SFT's and the eval stage's evaluation, the judge)."""
    return sample_encoded(engine, encode_rows(processor, prompts), params, version=0, with_prompts=True)


def sample_encoded(engine: RolloutEngine, prompts: Sequence[EncodedPrompt], params: SamplingParams,
                   version: int, with_prompts: bool = False) -> Batch:
    """B encoded prompts -> B*n samples, the n samples of prompt i at rows i*n .. i*n+n-1.

    Returns responses (B*n, R), response_mask and policy_mask (B*n, R; equal: a single-turn response is the
    policy's own), rollout_log_probs (B*n, R), weight_version (B*n,) (``version``; with in-flight weight updates
    the version of each sample's first token, its oldest, and token_versions (B*n, R) each token's), prompt_tokens (B*n,),
    response_text, image_grids (per sample the prompt's images' (t, h, w) grids, one list shared by its n
    samples, for rewards that need image sizes) and vision_grids (its images' and videos' grids, the vision
    tower's work for the FLOP account). The encodings themselves (``prompt``) come back only
    ``with_prompts``: they stay on the worker that encoded them.
    """
    out = engine.generate(prompts, params)
    n = params.n
    grids = [[tuple(int(x) for x in g) for g in p.image_grid_thw] if p.image_grid_thw is not None else []
             for p in prompts]
    media = [media_grids(p) for p in prompts]
    objects = {"response_text": out.texts, "image_grids": [g for g in grids for _ in range(n)],
               "vision_grids": [g for g in media for _ in range(n)]}
    if with_prompts:
        objects["prompt"] = [p for p in prompts for _ in range(n)]
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long).repeat_interleave(n)
    tensors = {
        "responses": out.responses,
        "response_mask": out.response_mask,
        "policy_mask": out.response_mask.clone(),
        "rollout_log_probs": out.log_probs,
        "weight_version": torch.full((len(lengths),), version, dtype=torch.long),
        "prompt_tokens": lengths,
    }
    if out.versions is not None:
        tensors["token_versions"] = out.versions
        tensors["weight_version"] = out.versions[:, 0].clone()
    return Batch(tensors=tensors, objects=objects)


def real_prompts(prompts: Batch) -> int:
    """How many of a rank's prompt rows are real: the dispatcher pads a rank with copies of its last prompt
    (``is_pad``); a rank with only padding counts all its rows, so that it returns rows of the right shape."""
    real = int((~prompts["is_pad"]).sum()) if "is_pad" in prompts.tensors else len(prompts)
    return real or len(prompts)


def pad_samples(samples: Batch, real: int, rows: int, n: int) -> Batch:
    """The samples of a rank's ``real`` prompts, with copies of the last real prompt's ``n`` samples for each of its
    ``rows - real`` padding rows (the driver drops them)."""
    if real == rows:
        return samples
    last = list(range((real - 1) * n, real * n))
    return samples.select([*range(len(samples)), *last * (rows - real)])
