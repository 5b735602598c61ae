"""The actor's loss terms for one run, by their names in the loss tables: the policy loss and the algorithm's
extra losses with their coefficients. The hybrid worker hands one to its :class:`~mmrl.workers.actor.
PolicyUpdater`, which adds the terms up; the entropy bonus and the KL loss are the updater's own."""

from __future__ import annotations

from dataclasses import dataclass

from mmrl.algos.losses import EXTRA_LOSSES, LOSS_FIELDS, POLICY_LOSSES


@dataclass(frozen=True)
class ActorLoss:
    policy: str
    """A key of :data:`~mmrl.algos.losses.POLICY_LOSSES`."""
    extras: tuple[tuple[str, float], ...] = ()
    """(a key of :data:`~mmrl.algos.losses.EXTRA_LOSSES`, its coefficient) for each loss added to the policy loss."""

    def __post_init__(self) -> None:
        if self.policy not in POLICY_LOSSES:
            raise ValueError(f"policy loss {self.policy!r} is unknown; allowed: {', '.join(sorted(POLICY_LOSSES))}")
        unknown = [name for name, _ in self.extras if name not in EXTRA_LOSSES]
        if unknown:
            raise ValueError(f"extra losses {unknown} are unknown; allowed: {', '.join(sorted(EXTRA_LOSSES))}")

    @property
    def fields(self) -> tuple[str, ...]:
        """The per-sample batch fields the terms read beyond the common ones (:data:`~mmrl.algos.losses.
        LOSS_FIELDS`), each once."""
        names = [self.policy, *(name for name, _ in self.extras)]
        return tuple(dict.fromkeys(field for name in names for field in LOSS_FIELDS.get(name, ())))
