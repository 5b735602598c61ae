"""The prompt encodings a rank holds for one step, by ``uid``.

A prompt's media (``messages``, ``images`` as PNG bytes, ``videos``) cross from the driver to a worker group
once per step: the rank that first receives them encodes the prompt through the one encoding path
(:func:`mmrl.models.encoding.encode_prompt`) and keeps the encoding, so the step's later calls send only the
samples' uids, token ids, masks and scalars. The WorkerGroup keeps each group on the rank that holds it
(:mod:`mmrl.controller.dispatch`) and tells the ranks when a step starts (``forget_prompts``).

A Batch that carries its own ``prompt`` objects (encodings built by the caller, as in tests and
benchmarks) is used as it is.
"""

from __future__ import annotations

from typing import Any

from mmrl.controller.dispatch import MEDIA_KEYS
from mmrl.models.encoding import EncodedPrompt
from mmrl.protocol import Batch
from mmrl.rollout.samples import encode_row

# With ``prompts=True`` in the method's registration: what every pass that scores responses reads.
SCORED = ("responses", "response_mask")


class PromptCache:
    """This rank's encodings of the current step's prompts, by uid."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.by_uid: dict[str, EncodedPrompt] = {}

    def __len__(self) -> int:
        return len(self.by_uid)

    def clear(self) -> None:
        self.by_uid.clear()

    def attach(self, batch: Batch, keep: bool = True) -> Batch:
        """``batch`` with a ``prompt`` object per row (the same object for every row of one uid) in place of
        its media fields. Rows whose media came along are encoded (once per uid) and, with ``keep``, held for
        the step's later calls; the other rows' prompts must be held already."""
        if "prompt" in batch.objects:
            return batch
        if "uid" not in batch.objects:  # rows without ids: each its own prompt, nothing to keep
            batch = Batch(tensors=batch.tensors, objects={**batch.objects, "uid": [f"#{i}" for i in range(len(batch))]},
                          meta=batch.meta)
            keep = False
        media = {key: batch.objects.get(key) for key in MEDIA_KEYS}
        fresh: dict[str, EncodedPrompt] = {}
        encodings = []
        for row, uid in enumerate(batch["uid"]):
            prompt = self.by_uid.get(uid) or fresh.get(uid)
            if prompt is None:
                if media["messages"] is None or media["messages"][row] is None:
                    raise KeyError(f"prompt {uid!r} is not held on this rank and its media did not come with the "
                                   "call (the WorkerGroup sends them to the rank that first gets the group)")
                videos = media["videos"][row] if media["videos"] is not None else []
                prompt = fresh[uid] = encode_row(self.processor, media["messages"][row], media["images"][row],
                                                 videos, uid)
            encodings.append(prompt)
        if keep:
            self.by_uid.update(fresh)
        objects = {k: v for k, v in batch.objects.items() if k not in MEDIA_KEYS}
        return Batch(tensors=batch.tensors, objects={**objects, "prompt": encodings}, meta=batch.meta)
