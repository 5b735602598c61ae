"""Off-policy guidance (``trainer.guide_unsolved``, in the style of LUFFY): a group whose every sample is wrong
gets one known-good response in place of its last sample, so that it carries a signal.

**The guide** is the row's ``extra["guide"]`` when the data gives one (a stronger model's response, say), else
its answer in the trained format (:func:`mmrl.answer_format.format_answer`), each followed by the end-of-turn
token, as SFT's targets are. With agent rollouts the guide is a whole episode: ``extra["guide"]`` may list the
texts of its policy turns (the zoom task's: the ``zoom_in`` call on the question's cell, then the answer), which
the rank that holds the prompt runs through its real tools (:meth:`mmrl.agent.rollout.AgentRollout.guide`), so
the tool turns are the tools' own outputs and stay holes. The reward stage scores it as any sample; a guide the
verifier does not accept is not used (``guide/rejected``), nor one longer than the step's responses or cut by
an episode budget (``guide/too_long``).

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
from mmrl.models.media import MEDIA_KEYS
from mmrl.protocol import Batch

GUIDED = "guided"
# The per-token fields a generated sample carries, each (B, R).
TOKEN_FIELDS = ("responses", "response_mask", "policy_mask", "rollout_log_probs")
# What a guide replaces in its row beyond the per-token fields: an agent episode's counts, record, context and
# tool images.
SAMPLE_TENSORS = ("num_turns", "num_tool_calls", "weight_version")
SAMPLE_OBJECTS = ("response_text", "episode", "context_key", "context", "tool_grids")


def guide_turns(answer: str, extra: dict[str, Any]) -> list[str]:
    """The texts of a row's known-good policy turns: its ``extra["guide"]`` (a text, or a list of them: an agent
    episode's turns), else its answer in the trained format."""
    guide = extra.get("guide") if isinstance(extra, dict) else None
    if not guide:
        return [format_answer(answer)]
    return [str(turn) for turn in guide] if isinstance(guide, (list, tuple)) else [str(guide)]


def all_wrong_groups(uids: list[str], correct: torch.Tensor) -> list[list[int]]:
    """The rows of each group (samples sharing a uid, at least two) whose every sample is wrong, in order."""
    groups: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        groups.setdefault(str(uid), []).append(row)
    return [rows for rows in groups.values() if len(rows) > 1 and not bool((correct[rows] > 0.5).any())]


class Guidance:
    """Puts a known-good response into each all-wrong group of a scored batch (see the module docstring).

    ``encode``: text -> its token ids (T,) int64, the end-of-turn token included (single-turn guides).
    ``episodes``: with agent rollouts, rows (``uid``, the prompt's media, ``guide_turns``) -> their guide episodes'
    samples with ``guide_complete`` (the worker group's ``guide_episodes``); None: single-turn guides.
    """

    def __init__(self, encode: Callable[[str], torch.Tensor], episodes: Callable[[Batch], Batch] | None = None) -> None:
        self.encode, self.episodes = encode, episodes

    def apply(self, batch: Batch, scores: torch.Tensor, correct: torch.Tensor,
              score: Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]
              ) -> tuple[Batch, torch.Tensor, torch.Tensor, dict[str, float]]:
        """A scored batch of B samples (``scores``, ``correct``: (B,)) -> the batch with the last sample of each
        all-wrong group replaced by its guide where the verifier accepts it, with ``guided`` (B,) float32 (1 on a
        guide); the scores and verdicts (B,) updated to match; the guidance metrics. ``score(rows)`` gives
        (scores (K,), correct (K,)) of K samples."""
        rows = [members[-1] for members in all_wrong_groups(list(batch["uid"]), correct)]
        turns = [guide_turns(batch["answer"][row], batch["extra"][row]) for row in rows]
        candidate, fits = (self.run_episodes if self.episodes is not None else self.single_turn)(batch, rows, turns)
        guided, scores, correct = torch.zeros(len(batch)), scores.clone(), correct.clone()
        keep: list[int] = []
        if fits:
            picked = candidate.select(fits)
            guide_scores, verdicts = score(picked)
            accepted = [i for i, ok in enumerate(verdicts.tolist()) if ok > 0.5]
            keep = [fits[i] for i in accepted]
            batch = write_rows(batch, picked, [rows[k] for k in keep], accepted)
            for i, k in zip(accepted, keep):
                guided[rows[k]] = 1.0
                scores[rows[k]], correct[rows[k]] = guide_scores[i], verdicts[i]
        batch.tensors[GUIDED] = guided
        count = max(len(set(map(str, batch["uid"]))), 1)
        return batch, scores, correct, {"guide/groups": len(keep) / count,
                                        "guide/rejected": float(len(fits) - len(keep)),
                                        "guide/too_long": float(len(rows) - len(fits))}

    def single_turn(self, batch: Batch, rows: list[int], turns: list[list[str]]) -> tuple[Batch, list[int]]:
        """The rows' guides as one-turn responses, and the indices (into ``rows``) of those that fit the step's
        response width. Raises ValueError for a guide of several turns."""
        width = batch["responses"].shape[1]
        for row, texts in zip(rows, turns):
            if len(texts) != 1:
                raise ValueError(f"row {batch['uid'][row]}: extra['guide'] lists {len(texts)} turns, but the run's "
                                 "rollouts are single-turn; give one text, or enable rollout.agent")
        ids = [self.encode(texts[0]) for texts in turns]
        fits = [k for k, encoded in enumerate(ids) if len(encoded) <= width]
        if not rows:
            return batch, fits
        return replaced(batch.select(rows), [t[0] for t in turns], ids, width), fits

    def run_episodes(self, batch: Batch, rows: list[int], turns: list[list[str]]) -> tuple[Batch, list[int]]:
        """The rows' guide episodes (run where their prompts are held), and the indices of those that used their
        whole script within the episode budgets."""
        if not rows:
            return batch, []
        asked = batch.select(rows).select_fields(optional=("uid", *MEDIA_KEYS))
        asked.objects["guide_turns"] = turns
        episodes = self.episodes(asked)  # type: ignore[misc]
        fits = [k for k, ok in enumerate(episodes["guide_complete"].tolist()) if ok > 0.5]
        episodes.tensors.pop("guide_complete")
        base = batch.select(rows)
        return Batch(tensors={**base.tensors, **episodes.tensors}, objects={**base.objects, **episodes.objects},
                     meta=base.meta), fits


def replaced(rows: Batch, texts: list[str], ids: list[torch.Tensor], width: int) -> Batch:
    """``rows`` (K samples) with their responses replaced by ``ids`` (K tensors (T_k,); those longer than
    ``width`` are left empty: they are not used): every per-token field rewritten (the guide's tokens all the
    policy's, its behaviour log-probs 0 until :func:`fill_behaviour`) and ``response_text`` set to ``texts``."""
    tensors = {key: value.clone() for key, value in rows.tensors.items()}
    for key in TOKEN_FIELDS:
        if key in tensors:
            tensors[key].zero_()
    for k, target in enumerate(ids):
        if len(target) > width:
            continue
        tensors["responses"][k, : len(target)] = target
        tensors["response_mask"][k, : len(target)] = 1.0
        if "policy_mask" in tensors:
            tensors["policy_mask"][k, : len(target)] = 1.0
    return Batch(tensors=tensors, objects={**rows.objects, "response_text": list(texts)}, meta=rows.meta)


def write_rows(batch: Batch, source: Batch, rows: list[int], picks: list[int]) -> Batch:
    """``batch`` with its rows ``rows`` taken from ``source``'s rows ``picks``: the per-token fields, and the
    sample fields the source has (the response text; an agent episode's counts, record and context key)."""
    if not rows:
        return batch
    tensors, objects = dict(batch.tensors), dict(batch.objects)
    index, pick = torch.tensor(rows), torch.tensor(picks)
    for key in (*TOKEN_FIELDS, *SAMPLE_TENSORS):
        if key in tensors and key in source.tensors:
            tensors[key] = tensors[key].clone()
            tensors[key][index] = source[key][pick].to(tensors[key].dtype)
    for key in SAMPLE_OBJECTS:
        if key in objects and key in source.objects:
            objects[key] = list(objects[key])
            for row, k in zip(rows, picks):
                objects[key][row] = source[key][k]
    return Batch(tensors=tensors, objects=objects, meta=batch.meta)


def fill_behaviour(batch: Batch) -> None:
    """The guided rows' behaviour log-probs are the trainer's old log-probs (weight 1: see the module docstring)."""
    if GUIDED not in batch.tensors or "old_log_probs" not in batch.tensors:
        return
    rows = batch[GUIDED] > 0.5
    if bool(rows.any()):
        batch.tensors["rollout_log_probs"] = batch["rollout_log_probs"].clone()
        batch.tensors["rollout_log_probs"][rows] = batch["old_log_probs"][rows].to(batch["rollout_log_probs"].dtype)
