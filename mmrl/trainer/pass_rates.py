"""Per-prompt pass rates, and the sampling rules that act on them: spend rollouts where they teach.

Once a prompt's group of samples all agree it teaches GRPO-style estimators nothing. :class:`PassRates` keeps,
per prompt uid, how its groups went (groups seen, samples, correct samples, and the current run of solved groups,
every sample right, and of unsolved ones, every sample wrong); the checkpoint holds it, so a resumed run keeps
it. :class:`SamplingRules` decides, when the loader reaches a prompt, whether to draw it:

- ``trainer.skip_solved_after=k`` (0: off): a prompt whose last k groups were all solved is skipped;
- ``trainer.unsolved_revisit_rate=p`` (1: off): a prompt that has never been solved (every group so far all
  wrong) is drawn with probability p, so the always-wrong prompts come back at a bounded rate.

Both are off by default until measured. Guiding an always-wrong group with a known-good response (LUFFY's
off-policy guidance, ``trainer.guide_unsolved``) is :mod:`mmrl.trainer.guidance`'s.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class PromptRecord:
    groups: int = 0
    samples: int = 0
    correct: int = 0
    solved_streak: int = 0
    """Groups in a row, up to the last, whose every sample was right."""
    ever_solved: bool = False
    """Whether any sample of any group was right."""

    @property
    def pass_rate(self) -> float:
        return self.correct / self.samples if self.samples else 0.0


@dataclass
class PassRates:
    records: dict[str, PromptRecord] = field(default_factory=dict)

    def record(self, uids: Sequence[str], correct: torch.Tensor) -> None:
        """One step's samples: their prompt uids and 0/1 correctness (B,), each uid's samples one group."""
        groups: dict[str, list[float]] = {}
        for uid, value in zip(uids, correct.tolist()):
            groups.setdefault(str(uid), []).append(float(value))
        for uid, values in groups.items():
            rec = self.records.setdefault(uid, PromptRecord())
            right = sum(v > 0.5 for v in values)
            rec.groups += 1
            rec.samples += len(values)
            rec.correct += right
            rec.solved_streak = rec.solved_streak + 1 if right == len(values) else 0
            rec.ever_solved = rec.ever_solved or right > 0

    def get(self, uid: str) -> PromptRecord | None:
        return self.records.get(uid)

    def metrics(self) -> dict[str, float]:
        """``sampler/prompts_seen``, ``sampler/prompts_always_solved`` (last group solved, every sample of every
        group right) and ``sampler/prompts_never_solved``."""
        records = list(self.records.values())
        return {"sampler/prompts_seen": float(len(records)),
                "sampler/prompts_always_solved": float(sum(r.correct == r.samples > 0 for r in records)),
                "sampler/prompts_never_solved": float(sum(not r.ever_solved for r in records))}

    def state_dict(self) -> dict[str, Any]:
        return {uid: asdict(rec) for uid, rec in self.records.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records = {uid: PromptRecord(**rec) for uid, rec in state.items()}


@dataclass
class SamplingRules:
    """Which prompts the loader draws, from their :class:`PassRates` (see the module docstring)."""

    pass_rates: PassRates
    skip_solved_after: int = 0
    unsolved_revisit_rate: float = 1.0
    skipped_solved: int = 0
    skipped_unsolved: int = 0

    @property
    def active(self) -> bool:
        return self.skip_solved_after > 0 or self.unsolved_revisit_rate < 1.0

    def draw(self, uid: str, rng: random.Random) -> bool:
        """Whether to draw the prompt ``uid`` now (counting the ones it skips)."""
        rec = self.pass_rates.get(uid)
        if rec is None:
            return True
        if self.skip_solved_after and rec.solved_streak >= self.skip_solved_after:
            self.skipped_solved += 1
            return False
        if not rec.ever_solved and self.unsolved_revisit_rate < 1.0 and rng.random() >= self.unsolved_revisit_rate:
            self.skipped_unsolved += 1
            return False
        return True

    def metrics(self) -> dict[str, float]:
        return self.pass_rates.metrics() | {"sampler/skipped_solved": float(self.skipped_solved),
                                            "sampler/skipped_unsolved": float(self.skipped_unsolved)}
