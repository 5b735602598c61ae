"""Scripted policy turns: an engine that answers the agent loop with given texts instead of sampling.

A guide episode (``trainer.guide_unsolved`` with agent rollouts, :mod:`mmrl.trainer.guidance`) is a known-good
episode: its policy turns are given (the row's ``extra["guide"]``, say a ``zoom_in`` call on the right region and
the answer), its tool turns are not: the calls run through the rank's real tools, and their outputs are encoded
as any episode's are. So the guide goes through the same :class:`~mmrl.agent.loop.AgentLoop` as sampled
episodes, with :class:`ScriptedTurns` in the engine's place, and its tokens, positions and pixels are those the
policy would see had it written the same turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmrl.models.encoding import EncodedPrompt
from mmrl.rollout.base import RolloutOutput, SamplingParams


class ScriptedTurns:
    """Serves each episode its next scripted turn, by the episode's prompt name (one episode per name).

    ``scripts``: prompt name -> the texts of its policy turns, in order. A turn is its text's tokens and the
    end-of-turn token, cut to the turn's allowance (the loop then flags the episode as cut); an episode asked
    for a turn past its script gets an empty one (the loop ends it as cut). :meth:`complete` tells whether every
    scripted turn of a name was served.
    """

    def __init__(self, scripts: Mapping[str, Sequence[str]], tokenizer: Any) -> None:
        self.scripts = {name: list(turns) for name, turns in scripts.items()}
        self.tokenizer = tokenizer
        self.served = dict.fromkeys(self.scripts, 0)

    def turn_ids(self, text: str) -> torch.Tensor:
        """A scripted turn as the policy would end it: its tokens, then the end-of-turn token; (T,) int64."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.tensor([*ids, self.tokenizer.eos_token_id], dtype=torch.long)

    def complete(self, name: str) -> bool:
        return self.served[name] == len(self.scripts[name])

    def generate(self, prompts: Sequence[EncodedPrompt], params: SamplingParams) -> RolloutOutput:
        """The next scripted turn of each prompt's episode (``params.n`` must be 1): responses (B, R) int64 padded
        with the pad id, response_mask (B, R), log_probs (B, R) zeros (a scripted turn has no sampling
        probability), R = ``params.max_new_tokens``."""
        if params.n != 1:
            raise ValueError(f"scripted turns are one episode per prompt; got n={params.n}")
        width = params.max_new_tokens
        responses = torch.full((len(prompts), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(prompts), width)
        texts = []
        for row, prompt in enumerate(prompts):
            turns, k = self.scripts[prompt.name], self.served[prompt.name]
            text = turns[k] if k < len(turns) else ""
            self.served[prompt.name] = min(k + 1, len(turns))
            ids = self.turn_ids(text)[:width] if text else torch.zeros(0, dtype=torch.long)
            responses[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1.0
            texts.append(text)
        return RolloutOutput(responses=responses, response_mask=mask, log_probs=torch.zeros(len(prompts), width),
                             texts=texts)
