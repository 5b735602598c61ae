"""Turn a Batch of prompt rows into a Batch of samples with any rollout engine."""

from __future__ import annotations

from typing import Any

from mmrl.models.encoding import EncodedPrompt, encode_prompt
from mmrl.protocol import Batch
from mmrl.rollout.base import RolloutEngine, SamplingParams
from mmrl.schema import decode_image, decode_video


def encode_rows(processor: Any, prompts: Batch) -> list[EncodedPrompt]:
    """One EncodedPrompt per prompt row (``messages`` with ``<image>`` / ``<video>`` placeholders, ``images``
    as PNG bytes, ``videos`` as stored frames), named by its ``uid`` when the Batch has one."""
    prompts.require("messages", "images")
    count = len(prompts)
    names = prompts["uid"] if "uid" in prompts.objects else [f"#{i}" for i in range(count)]
    videos = prompts["videos"] if "videos" in prompts.objects else [[]] * count
    return [
        encode_prompt(processor, messages, [decode_image(b) for b in images], [decode_video(v) for v in clips],
                      name=str(name))
        for messages, images, clips, name in zip(prompts["messages"], prompts["images"], videos, names)
    ]


def generate_samples(engine: RolloutEngine, processor: Any, prompts: Batch, params: SamplingParams) -> Batch:
    """prompts (B rows) -> B*n samples, the n samples of prompt i at rows i*n .. i*n+n-1.

    Returns prompt (the EncodedPrompt, one object shared by its n samples), responses (B*n, R),
    response_mask (B*n, R), rollout_log_probs (B*n, R) and response_text.
    """
    encoded = encode_rows(processor, prompts)
    out = engine.generate(encoded, params)
    return Batch(
        tensors={
            "responses": out.responses,
            "response_mask": out.response_mask,
            "rollout_log_probs": out.log_probs,
        },
        objects={"prompt": [p for p in encoded for _ in range(params.n)], "response_text": out.texts},
    )
