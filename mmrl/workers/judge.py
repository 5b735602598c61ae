"""The generative-judge worker: a VLM asked, through a rollout engine, whether each response is correct.

The judge sees the prompt's media, the prompt's text, the policy's response (an agent episode's whole transcript,
with the images its tools returned) and the reference answer (``reward.judge.template``) and answers greedily;
:func:`rewards.judge.parse_verdict` turns its answer into 1 (yes), 0 (no) or "unparsable" (scored 0 and counted).
"""

from __future__ import annotations

import dataclasses

import torch

from mmrl.agent.chat import reserved_for
from mmrl.config import Config
from mmrl.controller import Dispatch, Worker, register
from mmrl.models.loading import load_processor
from mmrl.plugins.safe_text import clean
from mmrl.protocol import Batch
from mmrl.rollout import RolloutEngine, SamplingParams, build_rollout_engine
from mmrl.rollout.samples import generate_samples
from mmrl.workers.model_builder import build_model
from rewards.judge import check_template, episode_transcript, judge_messages, parse_verdict, plain_text

JUDGED = ("messages", "images", "response_text", "answer")


class JudgeWorker(Worker):
    """One data-parallel rank of the judge (each rank holds the whole judge: it is replicated)."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, cfg: Config, checkpoint: str) -> int:
        """Load the judge at ``checkpoint`` and its rollout engine (``reward.judge.engine``); returns its size."""
        judge = cfg.reward.judge
        check_template(judge.template)
        self.template, self.max_new_tokens = judge.template, judge.max_new_tokens
        engine_cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(
            cfg.rollout, engine=judge.engine or cfg.rollout.engine, micro_batch_size=judge.micro_batch_size,
            max_tokens_per_micro=0))
        self.processor = load_processor(checkpoint)
        self.reserved = reserved_for(self.processor)  # what a response or a tool's text shown to it must not hold
        layout = build_model(cfg, "judge", checkpoint, device=self.device, distributed=False)
        self.engine: RolloutEngine = build_rollout_engine(
            engine_cfg, checkpoint=checkpoint, processor=self.processor, device=self.device, policy=layout.root.model
        )
        return sum(p.numel() for p in layout.root.parameters())

    @register(Dispatch.RANK_ZERO)
    def micro_batching(self) -> dict[str, str]:
        """The judge engine's batching of one call (rank 0's)."""
        batching = self.engine.batching(SamplingParams(n=1, max_new_tokens=self.max_new_tokens))
        return {"judge.generate": str(batching) if batching is not None else "the engine's own"}

    @register(Dispatch.DP_COMPUTE, fields=JUDGED, optional=("videos", "episode"))
    def judge(self, batch: Batch) -> Batch:
        """-> judge_scores (B,) (1 yes, 0 no or unparsable), judge_parsed (B,) (1 when a verdict was read) and
        judge_text (the judge's answers). An agent episode (``episode``) is judged whole: its response is the
        episode's transcript, the tools' images following the prompt's (:func:`episode_transcript`). What the
        policy and the tools wrote is made safe for the judge's tokenizer (:func:`plain_text`), and its own answers
        cleaned before they are parsed and logged."""
        batch.require(*JUDGED)
        responses, images = [plain_text(r, self.reserved) for r in batch["response_text"]], list(batch["images"])
        if "episode" in batch.objects:
            for i, record in enumerate(batch["episode"]):
                responses[i], returned = episode_transcript(record, self.reserved)
                images[i] = [*images[i], *returned]
        questions = Batch(objects={
            "messages": [judge_messages(m, r, a, self.template)
                         for m, r, a in zip(batch["messages"], responses, batch["answer"])],
            "images": images,
            "videos": batch["videos"] if "videos" in batch.objects else [[] for _ in range(len(batch))],
        })
        params = SamplingParams(n=1, greedy=True, max_new_tokens=self.max_new_tokens)
        texts = [clean(t) for t in generate_samples(self.engine, self.processor, questions, params)["response_text"]]
        verdicts = [parse_verdict(t) for t in texts]
        return Batch(
            tensors={"judge_scores": torch.tensor([v or 0.0 for v in verdicts]),
                     "judge_parsed": torch.tensor([float(v is not None) for v in verdicts])},
            objects={"judge_text": list(texts)},
        )
