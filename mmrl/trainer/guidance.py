"""Off-policy guidance (``trainer.guide_unsolved``, in the style of LUFFY): a group whose every sample is wrong
gets one known-good response in place of its last sample, so that it carries a signal.

**The guide** is the row's ``extra["guide"]`` when the data gives one (a stronger model's response, say), else
its answer in the trained format (:func:`mmrl.answer_format.format_answer`), each followed by the end-of-turn
token, as SFT's targets are. The reward stage scores it as any sample; a guide the verifier does not accept is
not used (``guide/rejected``), nor one longer than the step's responses (``guide/too_long``).

**Its importance weight.** The guide was not drawn from the policy, and the probability its source gave it is
unknown. Its tokens enter the policy loss with the trainer's own old log-probs as their behaviour log-probs:
``w = pi_old(y) / mu(y)`` is taken to be 1, so the guide's term is the clipped surrogate at ratio 1, a gradient of
``A * grad log pi(y)`` (SFT on the guide, scaled by its group advantage, its step bounded by the clip). This is
LUFFY's mixed-policy objective without its policy shaping (``pi / (pi + gamma)``), which is not built. The
guided rows' ``rollout_log_probs`` are set to the old log-probs once those are computed (:func:`fill_behaviour`),
so that the rollout correction gives them weight 1 and the rollout/trainer agreement metric skips them.

The policy's own accuracy (``train/acc``) and the pass rates are those of its samples, before guidance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mmrl.answer_format import format_answer
from mmrl.protocol import Batch

GUIDED = "guided"
# The per-token fields a generated sample carries, each (B, R).
TOKEN_FIELDS = ("responses", "response_mask", "policy_mask", "rollout_log_probs")


def guide_text(answer: str, extra: dict[str, Any]) -> str:
    """The known-good response of a row: its ``extra["guide"]``, else its answer in the trained format."""
    guide = extra.get("guide") if isinstance(extra, dict) else None
    return str(guide) if guide else format_answer(answer)


def all_wrong_groups(uids: list[str], correct: torch.Tensor) -> list[list[int]]:
    """The rows of each group (samples sharing a uid, at least two) whose every sample is wrong, in order."""
    groups: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        groups.setdefault(str(uid), []).append(row)
    return [rows for rows in groups.values() if len(rows) > 1 and not bool((correct[rows] > 0.5).any())]


class Guidance:
    """Puts a known-good response into each all-wrong group of a scored batch (see the module docstring).

    ``encode``: text -> its token ids (T,) int64, the end-of-turn token included.
    """

    def __init__(self, encode: Callable[[str], torch.Tensor]) -> None:
        self.encode = encode

    def apply(self, batch: Batch, scores: torch.Tensor, correct: torch.Tensor,
              score: Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]
              ) -> tuple[Batch, torch.Tensor, torch.Tensor, dict[str, float]]:
        """A scored batch of B samples (``scores``, ``correct``: (B,)) -> the batch with the last sample of each
        all-wrong group replaced by its guide where the verifier accepts it, with ``guided`` (B,) float32 (1 on a
        guide); the scores and verdicts (B,) updated to match; the guidance metrics. ``score(rows)`` gives
        (scores (K,), correct (K,)) of K samples."""
        rows, texts, ids, too_long = [], [], [], 0
        width = batch["responses"].shape[1]
        for members in all_wrong_groups(list(batch["uid"]), correct):
            row = members[-1]
            text = guide_text(batch["answer"][row], batch["extra"][row])
            encoded = self.encode(text)
            if len(encoded) > width:
                too_long += 1
                continue
            rows, texts, ids = [*rows, row], [*texts, text], [*ids, encoded]
        guided, scores, correct = torch.zeros(len(batch)), scores.clone(), correct.clone()
        keep: list[int] = []
        if rows:
            candidate = replaced(batch.select(rows), texts, ids)
            guide_scores, verdicts = score(candidate)
            keep = [i for i, ok in enumerate(verdicts.tolist()) if ok > 0.5]
            batch = write_rows(batch, candidate, [rows[i] for i in keep], keep)
            for i in keep:
                guided[rows[i]] = 1.0
                scores[rows[i]], correct[rows[i]] = guide_scores[i], verdicts[i]
        batch.tensors[GUIDED] = guided
        count = max(len(set(map(str, batch["uid"]))), 1)
        return batch, scores, correct, {"guide/groups": len(keep) / count, "guide/rejected": float(len(rows) - len(keep)),
                                        "guide/too_long": float(too_long)}


def replaced(rows: Batch, texts: list[str], ids: list[torch.Tensor]) -> Batch:
    """``rows`` (K samples) with their responses replaced by ``ids`` (K tensors (T_k,)): every per-token field
    rewritten (the guide's tokens all the policy's, its behaviour log-probs 0 until :func:`fill_behaviour`) and
    ``response_text`` set to ``texts``."""
    tensors = {key: value.clone() for key, value in rows.tensors.items()}
    for key in TOKEN_FIELDS:
        if key in tensors:
            tensors[key].zero_()
    for k, target in enumerate(ids):
        tensors["responses"][k, : len(target)] = target
        tensors["response_mask"][k, : len(target)] = 1.0
        if "policy_mask" in tensors:
            tensors["policy_mask"][k, : len(target)] = 1.0
    return Batch(tensors=tensors, objects={**rows.objects, "response_text": list(texts)}, meta=rows.meta)


def write_rows(batch: Batch, source: Batch, rows: list[int], picks: list[int]) -> Batch:
    """``batch`` with its rows ``rows`` taken from ``source``'s rows ``picks`` (the per-token fields and the
    response text)."""
    if not rows:
        return batch
    tensors = dict(batch.tensors)
    index = torch.tensor(rows)
    for key in TOKEN_FIELDS:
        if key in tensors:
            tensors[key] = tensors[key].clone()
            tensors[key][index] = source[key][torch.tensor(picks)].to(tensors[key].dtype)
    texts = list(batch["response_text"])
    for row, pick in zip(rows, picks):
        texts[row] = source["response_text"][pick]
    return Batch(tensors=tensors, objects={**batch.objects, "response_text": texts}, meta=batch.meta)


def fill_behaviour(batch: Batch) -> None:
    """The guided rows' behaviour log-probs are the trainer's old log-probs (weight 1: see the module docstring)."""
    if GUIDED not in batch.tensors or "old_log_probs" not in batch.tensors:
        return
    rows = batch[GUIDED] > 0.5
    if bool(rows.any()):
        batch.tensors["rollout_log_probs"] = batch["rollout_log_probs"].clone()
        batch.tensors["rollout_log_probs"][rows] = batch["old_log_probs"][rows].to(batch["rollout_log_probs"].dtype)
