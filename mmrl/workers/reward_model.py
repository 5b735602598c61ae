"""The reward-model worker: a trained VLM reward model (``make rm``) scoring whole responses.

It is the value model's architecture (backbone + scalar head) with the head read from the checkpoint, laid
out by ``reward.model.vision`` / ``reward.model.llm`` on its own worker group. It reads the policy's token
ids directly, so it must share the policy's tokenizer (checked by the driver before any worker starts).
"""

from __future__ import annotations

import torch

from mmrl.algos import ALGORITHMS
from mmrl.memory.budget import ModelDims, memory_at_hand, score_batching, sharers
from mmrl.config import Config
from mmrl.controller import Dispatch, Worker, register
from mmrl.models.encoding import collate
from mmrl.models.loading import load_processor
from mmrl.protocol import Batch
from mmrl.workers.micro import FILLER, micro_batches
from mmrl.workers.model_builder import build_model
from mmrl.workers.prompts import SCORED, PromptCache


def sequence_scores(model: torch.nn.Module, batch: Batch, pad_token_id: int, device: torch.device) -> torch.Tensor:
    """The reward model's score of each sample of ``batch`` (prompt + right-padded response): (B,) float32."""
    responses, mask = batch["responses"], batch["response_mask"]
    inputs = collate(batch["prompt"], pad_token_id, responses, mask, share_media=True)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    return model(inputs, responses.shape[1], mask.sum(-1).long())


class RewardModelWorker(Worker):
    """One data-parallel rank of the reward model."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, cfg: Config, checkpoint: str) -> int:
        """Load the reward model at ``checkpoint`` (backbone + ``value_head.safetensors``); returns its size."""
        processor = load_processor(checkpoint)
        self.pad_token_id = processor.tokenizer.pad_token_id
        self.prompt_cache = PromptCache(processor)
        self.layout = build_model(cfg, "reward_model", checkpoint, device=self.device, world_size=self.world_size)
        share = sharers(cfg, self.device.type, ALGORITHMS[cfg.algorithm.name].needs_critic)
        self.scoring = score_batching(cfg.reward.model, ModelDims.of(self.layout.root.core, lm_head=False),
                                      memory_at_hand(self.device, share))
        return sum(p.numel() for p in self.layout.root.parameters())

    @register(Dispatch.RANK_ZERO)
    def micro_batching(self) -> dict[str, str]:
        """The scoring pass's micro-batching (rank 0's)."""
        return {"reward_model.scores": str(self.scoring)}

    @register(Dispatch.DP_COMPUTE, fields=SCORED, prompts=True)
    def compute_rm_scores(self, batch: Batch) -> Batch:
        """-> rm_scores (B,): the reward model's score of each (prompt, media, response)."""
        batch = self.prompt_cache.attach(batch)
        out = []
        with torch.no_grad():
            for micro in micro_batches(batch, self.scoring.rows, self.scoring.tokens, False, self.all_reduce_sum):
                scores = sequence_scores(self.layout.root, micro, self.pad_token_id, self.device).cpu()
                if not micro.meta.get(FILLER):
                    out.append(scores)
        return Batch(tensors={"rm_scores": torch.cat(out)})
