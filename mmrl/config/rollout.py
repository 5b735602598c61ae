"""The rollout sections: sampling, the engine, the agent loop's tools and budgets (``rollout.agent``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mmrl.config_fields import auto_size, num


@dataclass(kw_only=True)
class AgentConfig:
    """Multi-turn rollouts: the policy calls tools between its turns (:mod:`mmrl.agent`)."""

    enabled: bool = False
    """true: every rollout is an episode of policy and tool turns; false: one policy turn (single-turn)."""
    tools: list[str] = field(default_factory=lambda: ["zoom_in"])
    """The tools the policy may call: built-in names (``crop``, ``zoom_in``, ``calculator``), installed plugins
    (entry-point group ``mmrl.tools``) or ``path/to/file.py:function`` (declared with ``@mmrl.agent.tool``)."""
    max_turns: int = num(4, ge=1)
    """Policy turns per episode."""
    max_tool_calls: int = num(4, ge=1)
    """Tool calls per episode (a malformed call counts: it gets an error message back)."""
    max_tokens: int = num(512, ge=1)
    """Response tokens per episode, the policy's and the tools' (image tokens included)."""
    max_new_tokens: int = num(0, ge=0)
    """Tokens per policy turn; 0: ``rollout.max_new_tokens``."""
    isolation: Literal["process", "inline"] = "process"
    """process: tools run in worker processes (a tool that hangs, crashes or exhausts memory costs its call an
    error message); inline: in the rank's thread (trusted tools only)."""
    num_workers: int = num(2, ge=1)
    """Tool worker processes per rollout rank."""
    timeout_s: float = num(10.0, gt=0)
    """A tool call that takes longer fails (``timeout``); a hung tool costs about one timeout per step."""
    max_memory_mb: float = num(2048, gt=0)
    """A tool worker whose resident memory passes this is killed; its call fails (``memory``)."""
    max_text_chars: int = num(8192, ge=1)
    max_images: int = num(4, ge=1)
    """Images one call may return."""
    max_pixels: int = num(448 * 448, ge=1)
    """A returned image over this many pixels is shrunk to it (aspect kept)."""
    kept_context_gib: float = num(1.0, ge=0)
    """hf engine: the unfinished episodes' KV caches kept between their turns, in all, so that a later turn
    prefills only its new tokens and images (:mod:`mmrl.rollout.kept`); past it an episode prefills its whole
    context. 0: keep nothing."""


@dataclass(kw_only=True)
class RolloutConfig:
    engine: str = "hf"
    """Generation engine by name (see ``mmrl.rollout.ENGINES``): ``hf`` (transformers generate) or ``vllm``
    (vLLM's offline engine in the worker's process)."""
    n: int = num(8, ge=1)
    """Responses sampled per prompt."""
    temperature: float = num(1.0, gt=0)
    top_p: float = num(1.0, gt=0, le=1)
    top_k: int = num(0, ge=0)
    """0 disables top-k."""
    max_new_tokens: int = num(16, ge=1)
    """Response length limit, in tokens."""
    micro_batch_size: int = auto_size()
    """hf: samples per generate call (a prompt's n samples always go together); 0/auto: by
    ``max_tokens_per_micro``. vllm schedules its own batches."""
    max_tokens_per_micro: int = auto_size()
    """hf: tokens per generate call, a sample costing its prompt plus ``max_new_tokens`` (what its KV cache
    holds); it wins over ``micro_batch_size``. 0/auto (with ``micro_batch_size`` 0): sized from the model and the
    memory at hand (:mod:`mmrl.memory.budget`)."""
    max_model_len: int = num(0, ge=0)
    """Longest prompt + response an engine accepts; a longer prompt fails before generation, naming the
    sample. 0: the model's ``max_position_embeddings``."""
    free_cache_engine: bool = True
    """Free the rollout engine's own copy of the weights between a step's rollouts and the next (they are loaded
    again when it wakes, in the step's ``update_weights`` stage): an hf engine's copy (it has one when the actor
    is sharded; a replicated actor's engine shares its module and holds nothing), vLLM's KV cache and weights
    (sleep mode, GPU only: vLLM's CPU backend cannot sleep, so there it keeps them). false: the engine keeps its
    copy, and the weights move only when the actor's version changes."""
    gpu_memory_utilization: float = num(0.5, gt=0, le=1)
    """vllm on GPU: the share of GPU memory the engine takes (the trainer shares the GPU)."""
    cpu_kv_cache_gib: float = num(1.0, gt=0)
    """vllm on CPU: KV-cache size in GiB."""
    enforce_eager: bool = True
    """vllm: no CUDA graphs / torch.compile (faster start; set false on GPUs for faster decoding)."""
    max_images_per_prompt: int = num(4, ge=0)
    """vllm: images a prompt may hold (vLLM sizes its multimodal budget from it)."""
    max_videos_per_prompt: int = num(1, ge=0)
    """vllm: videos a prompt may hold."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Multi-turn episodes with tools (off by default)."""
    num_workers: int = num(1, ge=1)
    """``trainer.mode=async``: the rollout pool's workers (each holds a whole copy of the policy in its engine and
    generates for its share of a batch's prompts); the sync mode generates on the trainer's own workers."""
    weight_transport: Literal["object_store", "nccl"] = "object_store"
    """``trainer.mode=async``: how the trainer's weights reach the rollout pool (:mod:`mmrl.trainer.weight_transport`):
    through Ray's object store; ``nccl`` (a broadcast on GPUs) is the seam, not built."""
    partial: bool = False
    """``trainer.mode=async``: in-flight weight updates. A generation still running when the trainer publishes new
    weights loads them at a token boundary and goes on with them (its context is prefilled again with the new
    weights, so each token's behaviour log-prob is that of the version that drew it); each token records its
    version (``token_versions``) and the staleness bound holds per token. False: a batch is drawn wholly with the
    weights it started with."""
    partial_poll_tokens: int = num(8, ge=1)
    """``rollout.partial``: how often (in tokens drawn) a rollout rank asks the transport for newer weights."""


