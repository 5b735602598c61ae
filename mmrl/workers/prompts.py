"""The prompt encodings a rank holds for one step, by ``uid``.

A prompt's media (``messages``, ``images`` as PNG bytes, ``videos``) cross from the driver to a worker group
once per step: the rank that first receives them encodes the prompt through the one encoding path
(:func:`mmrl.models.encoding.encode_prompt`) and keeps the encoding, so the step's later calls send only the
samples' uids, token ids, masks and scalars. The WorkerGroup keeps each group on the rank that holds it
(:mod:`mmrl.controller.dispatch`) and tells the ranks when a step starts (``forget_prompts``).

A sample may have its own scoring context (an agent episode's prompt with the media its tools returned,
:meth:`mmrl.agent.episode.Episode.scoring_context`): the rank that generated the sample holds it under the
sample's ``context_key`` (:meth:`PromptCache.hold`), and the step's later calls find it by that key. Another
group's rank (a critic's, the async mode's trainer) gets the context itself with the key, once per step.

A Batch that carries its own ``prompt`` objects (encodings built by the caller, as in tests and
benchmarks) is used as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mmrl.controller.dispatch import CONTEXT, CONTEXT_KEY
from mmrl.models.encoding import EncodedPrompt, PromptParts, encode_prompts
from mmrl.models.media import MEDIA_KEYS
from mmrl.protocol import Batch
from mmrl.rollout.samples import row_parts

# With ``prompts=True`` in the method's registration: what every pass that scores responses reads.
SCORED = ("responses", "response_mask")


class PromptCache:
    """This rank's encodings of the current step's prompts, by uid (and samples' own contexts, by key).

    ``prepare``: what a data row's messages become before they are encoded (the agent's tools in the system
    message); None: encoded as they are.
    """

    def __init__(self, processor: Any, prepare: Callable[[list[dict]], list[dict]] | None = None) -> None:
        self.processor = processor
        self.prepare = prepare
        self.by_uid: dict[str, EncodedPrompt] = {}

    def __len__(self) -> int:
        return len(self.by_uid)

    def clear(self) -> None:
        self.by_uid.clear()

    def hold(self, keys: Sequence[str], contexts: Sequence[EncodedPrompt]) -> None:
        """Keep samples' own scoring contexts for the step's later calls, each under its ``context_key``."""
        self.by_uid.update(zip(keys, contexts, strict=True))

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
        contexts = batch.objects.get(CONTEXT_KEY) or [None] * len(batch)
        shipped = batch.objects.get(CONTEXT) or [None] * len(batch)
        fresh = self.encode_new(batch["uid"], media, contexts)
        encodings = []
        for row, uid in enumerate(batch["uid"]):
            key = contexts[row]
            if key is not None:
                context = self.by_uid.get(key) or fresh.get(key) or shipped[row]
                if context is None:
                    raise KeyError(f"sample {key!r} (prompt {uid!r}) has its own context, and it is neither held on "
                                   "this rank nor sent with the call (the generating rank returns it with "
                                   "share_contexts)")
                fresh[key] = context
                encodings.append(context)
            else:
                encodings.append(self.by_uid.get(uid) or fresh[uid])
        if keep:
            self.by_uid.update(fresh)
        objects = {k: v for k, v in batch.objects.items() if k not in (*MEDIA_KEYS, CONTEXT_KEY, CONTEXT)}
        return Batch(tensors=batch.tensors, objects={**objects, "prompt": encodings}, meta=batch.meta)

    def encode_new(self, uids: list[str], media: dict[str, list | None], contexts: list[str | None]
                   ) -> dict[str, EncodedPrompt]:
        """The encodings of the rows' prompts this rank does not hold (once per uid), in one processor call
        where the family can (:func:`mmrl.models.encoding.encode_prompts`)."""
        todo: dict[str, PromptParts] = {}
        for row, uid in enumerate(uids):
            if contexts[row] is not None or uid in self.by_uid or uid in todo:
                continue
            if media["messages"] is None or media["messages"][row] is None:
                raise KeyError(f"prompt {uid!r} is not held on this rank and its media did not come with the "
                               "call (the WorkerGroup sends them to the rank that first gets the group)")
            videos = media["videos"][row] if media["videos"] is not None else []
            messages = media["messages"][row]
            messages = self.prepare(messages) if self.prepare is not None else messages
            todo[uid] = row_parts(messages, media["images"][row], videos, uid)
        return dict(zip(todo, encode_prompts(self.processor, list(todo.values())), strict=True))
