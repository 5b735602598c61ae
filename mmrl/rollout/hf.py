"""Rollout with transformers ``generate``: batched, left-padded, on the policy module itself.

Colocated with the actor in the hybrid worker, the engine shares the actor's module, so the weights it
samples with are the trained weights by construction and ``update_weights`` has nothing to copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from mmrl.models.encoding import EncodedPrompt, collate, vision_token_ids
from mmrl.models.logprobs import gather_logprobs_entropy, policy_log_softmax
from mmrl.rollout.base import RolloutOutput, SamplingParams


class HFRolloutEngine:
    def __init__(self, model: torch.nn.Module, processor: Any, device: torch.device, micro_batch_size: int = 64):
        self.model = model
        self.tokenizer = processor.tokenizer
        self.device = device
        self.micro_batch_size = micro_batch_size
        self.pad_id = self.tokenizer.pad_token_id
        self.eos_id = self.tokenizer.eos_token_id
        self.banned_ids = vision_token_ids(self.tokenizer)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Shared module: the weights are already the actor's; checks the names and shapes match."""
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name not in params or params[name].shape != tensor.shape:
                raise ValueError(f"update_weights: {name} {tuple(tensor.shape)} does not match the model")

    @torch.no_grad()
    def generate(self, prompts: Sequence[EncodedPrompt], params: SamplingParams) -> RolloutOutput:
        """Generate ``params.n`` responses for each prompt (sample rows grouped by prompt)."""
        expanded = [p for p in prompts for _ in range(params.n)]
        pieces = [
            self._generate_micro(expanded[i : i + self.micro_batch_size], params)
            for i in range(0, len(expanded), self.micro_batch_size)
        ]
        return RolloutOutput(
            responses=torch.cat([p.responses for p in pieces]),
            response_mask=torch.cat([p.response_mask for p in pieces]),
            log_probs=torch.cat([p.log_probs for p in pieces]),
            texts=[t for p in pieces for t in p.texts],
        )

    def _generate_micro(self, prompts: Sequence[EncodedPrompt], params: SamplingParams) -> RolloutOutput:
        inputs = {k: v.to(self.device) for k, v in collate(prompts, self.pad_id).items()}
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(
            **inputs,
            max_new_tokens=params.max_new_tokens,
            do_sample=not params.greedy,
            temperature=params.temperature if not params.greedy else None,
            top_p=params.top_p if not params.greedy else None,
            top_k=params.top_k if not params.greedy else None,
            suppress_tokens=self.banned_ids,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        self.model.train(was_training)
        prompt_width = inputs["input_ids"].shape[1]
        tokens = out.sequences[:, prompt_width:].cpu()
        temperature = 1.0 if params.greedy else params.temperature
        log_probs = policy_log_softmax(torch.stack(out.logits, dim=1).cpu(), self.banned_ids, temperature)
        logp, _ = gather_logprobs_entropy(log_probs, tokens)
        responses, mask = self._pad_after_eos(tokens, params.max_new_tokens)
        logp = torch.nn.functional.pad(logp, (0, params.max_new_tokens - logp.shape[1])) * mask
        texts = self.tokenizer.batch_decode(
            [row[: int(m.sum())] for row, m in zip(responses, mask)], skip_special_tokens=False
        )
        return RolloutOutput(responses=responses, response_mask=mask, log_probs=logp, texts=texts)

    def _pad_after_eos(self, tokens: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, L<=width) -> responses (B, width) padded after the first eos, mask (B, width)."""
        is_eos = tokens == self.eos_id
        # Positions strictly after the first eos: cumulative eos count > 0, shifted right by one.
        after_eos = torch.cumsum(is_eos.long(), dim=1) - is_eos.long() > 0
        mask = (~after_eos).float()
        responses = tokens.masked_fill(after_eos, self.pad_id)
        pad = width - tokens.shape[1]
        responses = torch.nn.functional.pad(responses, (0, pad), value=self.pad_id)
        return responses, torch.nn.functional.pad(mask, (0, pad))
