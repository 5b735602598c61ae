"""The actor's loss terms for one run, by their names in the loss table: the policy loss and the algorithm's
extra losses with their coefficients. The hybrid worker hands one to its :class:`~mmrl.workers.actor.
PolicyUpdater`, which adds the terms up; the entropy bonus and the KL loss are the updater's own."""

from __future__ import annotations

from dataclasses import dataclass

from mmrl.algos.losses import LOSSES, extra_losses, policy_losses


@dataclass(frozen=True)
class ActorLoss:
    policy: str
    """A policy loss of :data:`~mmrl.algos.losses.LOSSES`."""
    extras: tuple[tuple[str, float], ...] = ()
    """(an extra loss of :data:`~mmrl.algos.losses.LOSSES`, its coefficient) for each loss added to the policy
    loss."""

    def __post_init__(self) -> None:
        if self.policy not in policy_losses():
            raise ValueError(f"policy loss {self.policy!r} is unknown; allowed: {', '.join(sorted(policy_losses()))}")
        unknown = [name for name, _ in self.extras if name not in extra_losses()]
        if unknown:
            raise ValueError(f"extra losses {unknown} are unknown; allowed: {', '.join(sorted(extra_losses()))}")

    @property
    def fields(self) -> tuple[str, ...]:
        """The per-sample batch fields the terms read beyond the common ones (each spec's ``fields``), each
        once."""
        names = [self.policy, *(name for name, _ in self.extras)]
        return tuple(dict.fromkeys(field for name in names for field in LOSSES[name].fields))
