"""Weight updates between the tokens of a generation (``rollout.partial``, the async mode's rollout pool).

AReaL and PipelineRL do not let a long generation hold back a new weight version: the generation pauses at a token
boundary, the new weights are loaded, and it goes on, each token tagged with the version that drew it. Here the
decode loop (:func:`mmrl.rollout.sampler.decode`) calls :attr:`InFlightUpdates.poll` every ``every`` tokens; when
it loaded newer weights, the rows' contexts (prompt and the tokens drawn so far) are prefilled again with them
before the next token is drawn. The KV cache the old weights made is dropped, as AReaL does (PipelineRL keeps it):
every token after the switch is then drawn from exactly the new version's distribution given its prefix, so its
behaviour log-prob is that version's, which the trainer's importance correction divides by. A switch costs one
prefill of the batch's contexts (the vision tower once per distinct prompt).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class InFlightUpdates:
    """``poll()`` loads newer published weights into the engine's model when there are any and returns True when it
    did; ``version()`` is the version the model holds now; ``every``: tokens drawn between polls."""

    poll: Callable[[], bool]
    version: Callable[[], int]
    every: int = 8
