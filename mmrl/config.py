"""Typed, keyword-only config dataclasses: embedded defaults, YAML files, dotted overrides.

A config is built in three layers: the defaults below, a YAML file (which may name a ``base:`` YAML
it extends), then ``section.key=value`` overrides from the command line. Every key is checked before
anything starts: an unknown key or a value of the wrong type fails with a :class:`ConfigError` that
names the key and what is allowed.

This module sits near the bottom of the library. It holds the dataclasses, the loader, the checks that need no
table (:meth:`Config.validate`, which never writes), and :func:`resolve`, which fills the derived values into a
new Config. Of the library it imports only the field helpers (:mod:`mmrl.config_fields`) and the two tables whose
entries declare their own sections: the losses (``actor.loss.<name>``, :data:`mmrl.algos.losses.LOSSES`) and the
algorithms (``algorithm.<name>``, :data:`mmrl.algos.table.ALGORITHMS`); neither imports this module. The checks
against the tables of algorithms, losses and engines run one layer up, in :mod:`mmrl.run_config`, whose
``load_run_config`` is what a run loads its config with::

    cfg = load_run_config("configs/grpo_image.yaml", ["rollout.n=8", "actor.lr=1e-4"])
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mmrl.algos.losses import LOSSES
from mmrl.algos.table import ALGORITHMS
from mmrl.config_fields import ConfigError, auto_size, gather_sections, num

# Keys that were renamed: the old spelling gets an error that names the new one.
RENAMED = {
    "algorithm.adv_estimator": "algorithm.name (and adv_estimator=gae is now name=ppo)",
    "reward.type": "reward.function (rules), reward.model.path (a reward model) and reward.judge.path (a judge)",
    # The keys of one loss or one algorithm moved into its own section.
    "actor.policy_loss": "actor.loss.policy",
    "actor.clip_ratio_c": "actor.loss.dual_clip.clip_ratio_c",
    "actor.positive_lm_coef": "actor.loss.positive_lm.coef",
    "actor.sppo_eta": "actor.loss.sppo.eta",
    "actor.cispo_clip_low": "actor.loss.cispo.clip_low",
    "actor.cispo_clip_high": "actor.loss.cispo.clip_high",
    "actor.sapo_tau_pos": "actor.loss.sapo.tau_pos",
    "actor.sapo_tau_neg": "actor.loss.sapo.tau_neg",
    "actor.gmpo_clip_low": "actor.loss.gmpo.clip_low",
    "actor.gmpo_clip_high": "actor.loss.gmpo.clip_high",
    "actor.clip_cov_ratio": "actor.loss.clip_cov.ratio",
    "actor.clip_cov_lb": "actor.loss.clip_cov.lb",
    "actor.clip_cov_ub": "actor.loss.clip_cov.ub",
    "actor.kl_cov_ratio": "actor.loss.kl_cov.ratio",
    "actor.kl_cov_coef": "actor.loss.kl_cov.coef",
    "actor.dppo_tv_delta": "actor.loss.dppo_tv.delta",
    "actor.dppo_kl_delta": "actor.loss.dppo_kl.delta",
    "algorithm.pass_k": "algorithm.grpo_pass_k.k",
    "algorithm.filter_mode": "algorithm.pf_ppo.filter_mode",
    "algorithm.filter_k": "algorithm.pf_ppo.filter_k",
    "algorithm.lam_critic": "algorithm.vapo.lam_critic",
    "algorithm.lam_alpha": "algorithm.vapo.lam_alpha",
}


@dataclass(kw_only=True)
class ModelConfig:
    path: str = "outputs/model/tiny-qwen2.5-vl"
    """Local directory of a Hugging Face VLM checkpoint (the tiny model, or e.g. Qwen2.5-VL-3B-Instruct)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training and rollout."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    """Attention kernel passed to transformers."""
    family: Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "smolvlm"] = "qwen2_5_vl"
    """The model family ``make model`` builds a tiny model of (mmrl/models/families/). Every other stage reads a
    checkpoint's family from its config.json (``model_type``), never from here."""


@dataclass(frozen=True, kw_only=True)
class TinyModelConfig:
    """Sizes of the tiny model that ``make model`` builds (of the family ``model.family``)."""

    vocab_size: int = num(384, ge=64)
    hidden_size: int = num(128, ge=8)
    num_layers: int = num(3, ge=1)
    num_heads: int = num(4, ge=1)
    num_kv_heads: int = num(2, ge=1)
    intermediate_size: int = num(512, ge=1)
    vision_depth: int = num(2, ge=1)
    vision_hidden_size: int = num(64, ge=8)
    vision_heads: int = num(4, ge=1)
    patch_size: int = num(0, ge=0)
    """Vision patch side in pixels; 0: the family's own."""
    merge_size: int = num(2, ge=1)
    min_pixels: int = num(28 * 28, ge=1)
    max_pixels: int = num(112 * 112, ge=1)


Strategy = Literal["replicate", "fsdp", "hsdp"]


@dataclass(kw_only=True)
class PartConfig:
    """How one part of a model (the vision encoder or the LLM) is laid out over a worker group."""

    strategy: Strategy = "replicate"
    """replicate: full copy per rank, gradients all-reduced; fsdp: FSDP2 over all ranks; hsdp: FSDP2 within
    groups of ``shard_size`` ranks, replicated across the groups."""
    shard_size: int = num(0, ge=0)
    """hsdp only: ranks per shard group (must divide resources.num_workers)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations (vision blocks / decoder layers) in the backward pass instead of
    keeping them from the forward: activation memory per block falls from its intermediates to its input,
    for about one more forward's compute. Only gradient passes of a model in training mode recompute (the
    rollout and the no-grad log-prob passes run plainly); gradients equal the plain path's."""


@dataclass(kw_only=True)
class VisionPartConfig(PartConfig):
    freeze: bool = False
    """Keep the vision encoder's weights fixed (no gradients, no optimizer state)."""


@dataclass(kw_only=True)
class DataConfig:
    dir: str = "outputs/data"
    """Folder of the prompt parquet files, one per split (``<dir>/<split>.parquet``)."""
    tasks: dict[str, float] = field(default_factory=lambda: {"colour": 1.0})
    """Synthetic task mix: task name -> fraction. Images: colour, count, shape, compare_count (two images);
    videos: first_colour, direction; ``zoom`` (alone: the agent task of :mod:`data_prep.zoom_task`, whose
    ``sft`` split holds demonstrated episodes)."""
    sizes: dict[str, int] = field(default_factory=lambda: {"sft": 48, "train": 2048, "val": 128, "test": 400})
    """Rows per split for the synthetic generator."""
    image_size: int = num(112, ge=1)
    """Side of the synthetic square images, in pixels."""
    max_count: int = num(3, ge=1)
    """Largest number of shapes in the count task."""
    min_pixels: int = num(28 * 28, ge=1)
    """Pixel budget, lower bound, applied to a user's images."""
    max_pixels: int = num(448 * 448, ge=1)
    """Pixel budget, upper bound, applied to a user's images (sides are rounded to multiples of the model's
    patch size times its merge size, read from the processor at ``model.path``). For the Qwen families the size is
    qwen-vl-utils' ``smart_resize`` (the same as Qwen's tools and vLLM give), mmrl's own rule only where it has no
    usable answer (an aspect ratio over 200, a budget its rounding misses)."""
    jsonl: str = ""
    """A user's data file: when set, ``make data`` converts it instead of generating the synthetic tasks. A JSONL of
    {prompt, image|images, answer} (``format=jsonl``), or a peer's file or folder (``format``)."""
    format: Literal["jsonl", "verl", "easyr1", "hf"] = "jsonl"
    """The layout of ``jsonl`` (:mod:`data_prep.peer_formats`): mmrl's JSONL, verl's or EasyR1's parquet, or a
    Hugging Face ``datasets`` folder (``save_to_disk``; ``split`` picks a DatasetDict's split)."""
    image_dir: str = ""
    """Folder that the data file's media paths are relative to (default: the file's folder)."""
    split: str = "train"
    """Name of the split written by the converter."""
    max_prompt_tokens: int = num(4096, ge=1)
    """The converter quarantines a row whose prompt (counted with the model's processor, image tokens
    included) is longer."""
    video_fps: float = num(2.0, gt=0)
    """Frames sampled per second of video (also the rate of the synthetic clips)."""
    video_min_frames: int = num(2, ge=1)
    video_max_frames: int = num(16, ge=1)
    """Frames kept per video; a longer video is sampled evenly within this (and counted as sampled down)."""
    video_frame_max_pixels: int = num(224 * 224, ge=1)
    """Pixel budget of one video frame (lower bound: ``min_pixels``)."""
    video_max_pixels: int = num(8 * 224 * 224, ge=1)
    """Pixel budget of all of a video's frames together: frames shrink first, then fewer are kept. For the Qwen
    families, qwen-vl-utils' rules (its ``total_pixels``): the frame count comes from ``video_fps`` and the frame
    limits, and each frame gets ``video_max_pixels / frames * 2`` (a temporal patch covers two frames), within
    ``video_frame_max_pixels``."""
    max_video_seconds: float = num(600.0, gt=0)
    """A longer video is quarantined (``video_too_long``)."""
    video_timeout_s: float = num(60.0, gt=0)
    """Decoding one video may take this long before it is quarantined (``video_timeout``)."""
    video_size: int = num(56, ge=28)
    """Side of the synthetic clips' frames, in pixels (a multiple of 28)."""
    video_frames: int = num(4, ge=2)
    """Frames of a synthetic clip (even)."""
    zoom_grid: int = num(4, ge=1)
    """The zoom task's cells per side (its board is ``image_size`` px)."""
    zoom_shapes: int = num(3, ge=1, le=3)
    """Shapes in each of the zoom task's cells (1 to 3, of different kinds and colours)."""
    zoom_spot: int = num(0, ge=0)
    """Side, in the board's pixels, of the square at each cell's centre that holds its shapes (0: the whole cell):
    the demonstrations zoom on it, and a smaller spot makes a zoomed shape larger."""
    zoom_call_share: float = num(1.0, ge=0, le=1)
    """Share of the zoom task's demonstrations (its ``sft`` split) whose ``zoom_in`` call is trained; the others
    show the call as context and train the answer only (reading the zoomed image), leaving where to zoom to RL."""
    zoom_direct_share: float = num(0.0, ge=0, le=1)
    """Share of the zoom task's ``sft`` rows that answer from the full view, without a call (spread evenly): SFT
    then teaches both ways and leaves RL to teach when to zoom."""
    zoom_direct_by_kind: dict[str, float] = field(default_factory=dict)
    """``zoom_direct_share`` per kind of shape asked about (circle, square, triangle; a kind not named keeps
    ``zoom_direct_share``), spread evenly within each kind: the question, not the draw of the SFT weights, then
    sets whether the greedy SFT policy calls."""
    zoom_call_cells: Literal["question", "random"] = "question"
    """Where the trained calls zoom: on the question's cell, or on a random cell (their answers then context
    only): SFT teaches the call's format and reading the zoomed image, and RL alone where to zoom."""
    zoom_cell_names: Literal["grid", "letters"] = "grid"
    """How the zoom task's questions name a cell: ``grid``, "in cell B2"; ``letters``, "in cell Bb" (no digit,
    which the tiny model's calls and tool schema are full of)."""


@dataclass(kw_only=True)
class OptimConfig:
    """The optimizer of a single-process supervised stage (make sft, make rm)."""

    steps: int = num(60, ge=1)
    batch_size: int = num(16, ge=1)
    lr: float = num(2e-3, ge=0)
    weight_decay: float = num(0.0, ge=0)
    warmup_steps: int = num(5, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After the warm-up: constant, or a cosine decay to ``min_lr_ratio * lr`` over the ``steps``."""
    min_lr_ratio: float = num(0.0, ge=0, le=1)
    grad_clip: float = num(1.0, gt=0)
    """Gradient-norm clip (a very large value turns clipping off)."""


@dataclass(kw_only=True)
class SFTConfig(OptimConfig):
    init: str = ""
    """Checkpoint to start from; empty means ``model.path``."""
    split: str = "sft"
    """The labelled split to train on."""
    out_dir: str = "outputs/sft"
    """Where the checkpoint (``<out_dir>/checkpoint``) is written."""


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
    memory at hand (:mod:`mmrl.budget`)."""
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


@dataclass(kw_only=True)
class UpdateConfig:
    """What the actor and the critic share: the optimizer, the mini-batch loop and the layout."""

    lr: float = num(1e-4, ge=0)
    weight_decay: float = num(0.0, ge=0)
    warmup_steps: int = num(10, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After the warm-up: constant, or a cosine decay to ``min_lr_ratio * lr`` at the run's last update."""
    min_lr_ratio: float = num(0.0, ge=0, le=1)
    decay_steps: int = num(0, ge=0)
    """Optimizer steps the cosine spans; 0: the whole run (trainer.steps x num_mini_batches x ppo_epochs),
    filled in by :func:`resolve`."""
    grad_clip: float = num(1.0, gt=0)
    """Gradient-norm clip (a very large value turns clipping off)."""
    ppo_epochs: int = num(1, ge=1)
    """Passes over each step's batch."""
    num_mini_batches: int = num(2, ge=1)
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    micro_batch_size: int = auto_size()
    """Sequences per forward/backward (gradient accumulation inside a mini-batch), in the update and the
    no-grad passes (log-probs, values); 0/auto: by ``max_tokens_per_micro``."""
    max_tokens_per_micro: int = auto_size()
    """Micro-batches by this token budget (it wins over ``micro_batch_size``): a row costs its real response
    length, plus its prompt's length the first time the prompt appears in the micro-batch (with ``share_prompt``;
    every time without). A row over the budget forms its own micro-batch. All ranks take the largest
    micro-batch count any rank needs, so that sharded forwards stay in step. 0/auto (with ``micro_batch_size``
    0): a budget per pass sized from the model, its activation checkpointing and the memory left after the
    weights and the optimizer (:mod:`mmrl.budget`); the no-grad passes get a larger one than the update."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-mean-token-sum-norm"] = "token-mean"
    """How per-token losses become one: verl's names; seq-mean-token-sum-norm is Dr. GRPO's (token sums over
    sequences, divided by the number of sequences x a constant, ``loss_horizon``)."""
    loss_horizon: int = num(0, ge=0)
    """The constant of seq-mean-token-sum-norm; 0: rollout.max_new_tokens, filled in by :func:`resolve`."""
    vision: VisionPartConfig = field(default_factory=VisionPartConfig)
    """Layout of the vision encoder (for the actor: of the reference too, which follows the actor)."""
    llm: PartConfig = field(default_factory=PartConfig)
    """Layout of the language model (embeddings, decoder layers, head)."""


# The language model's linear layers in Qwen2/2.5/3-VL decoder layers (attention and MLP projections).
LLM_LINEAR_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(kw_only=True)
class LoRAConfig:
    """Low-rank adapters (peft LoRA) on the actor: the base weights stay frozen, only the adapters train; the KL
    reference is the base with the adapters switched off, and the rollout engine gets merged weights."""

    rank: int = num(0, ge=0)
    """Rank of each adapter; 0: no LoRA (full fine-tuning)."""
    alpha: float = num(32.0, gt=0)
    """The adapters' output is scaled by ``alpha / rank``."""
    dropout: float = num(0.0, ge=0, le=0.9)
    """Dropout on the adapters' input while training (0: the update's forward equals the log-prob passes')."""
    target_modules: list[str] = field(default_factory=lambda: list(LLM_LINEAR_LAYERS))
    """Names of the language model's linear layers that get adapters (a layer's own name, e.g. ``q_proj``, or a
    dotted tail, e.g. ``self_attn.q_proj``), matched inside the language model only, never the vision tower."""
    include_vision: bool = False
    """Also put adapters on every linear layer of the vision tower (its blocks and merger); false: the vision
    tower stays frozen (as EasyR1 and prime-rl do)."""


@dataclass(kw_only=True)
class LossKeys:
    """The policy loss by name, and each loss's own keys: the section ``actor.loss.<name>`` of each loss of the
    table (``mmrl.algos.losses.LOSSES``) that has some. A key of a loss the run does not read is refused
    (algorithms.md#policy-losses)."""

    policy: str = ""
    """Policy loss by name (a policy loss of ``mmrl.algos.losses.LOSSES``); empty: the algorithm's own."""


LossConfig = gather_sections("LossConfig", {name: spec.section for name, spec in LOSSES.items()}, LossKeys,
                             __name__)


@dataclass(kw_only=True)
class ActorConfig(UpdateConfig):
    loss: LossConfig = field(default_factory=LossConfig)
    """The actor's loss."""
    clip_ratio_low: float = num(0.2, gt=0, le=1)
    clip_ratio_high: float = num(0.2, gt=0, le=1)
    """PPO clip range [1 - low, 1 + high]; DAPO's clip-higher raises ``high``."""
    entropy_coeff: float = num(0.0, ge=0)
    """Weight of the entropy bonus in the policy loss."""
    use_kl_loss: bool = False
    """Add a KL(policy || reference) penalty to the loss (needs the reference policy)."""
    kl_loss_coef: float = num(0.001, ge=0)
    kl_estimator: Literal["k1", "k2", "k3", "low_var_kl", "abs"] = "k3"
    share_prompt: bool = True
    """Score the samples of a prompt in one packed sequence that holds the prompt once (its media and its
    tokens run once, not n times; :mod:`mmrl.models.packing`). Needs sdpa or eager attention: with
    flash_attention_2 every sample gets its own row."""
    old_log_probs: Literal["auto", "recompute", "rollout"] = "auto"
    """Where the PPO ratio's old log-probs come from. recompute: a separate forward pass before the update;
    rollout: the engine's own (they match the trainer's within 1e-4 on the hf and vLLM engines); auto: with
    one epoch and one mini-batch (an on-policy step) the update's own forward, detached, which equals them,
    so the pass is skipped; otherwise recompute."""
    rollout_correction: Literal["none", "token", "sequence"] = "none"
    """Off-policy correction for samples drawn by other weights than the trainer's (async mode's, or an engine
    whose log-probs drift): a truncated importance weight ``min(pi_old / pi_rollout, rollout_is_cap)`` per token
    or per sequence on each token's policy-gradient term (:mod:`mmrl.algos.rollout_correction`). Needs the old
    log-probs recomputed (they are, whatever ``old_log_probs`` says)."""
    rollout_is_cap: float = num(2.0, ge=1)
    """The truncation of the rollout-correction weight."""
    logprob_chunk_tokens: int = num(0, ge=0)
    """Tokens per chunk of the LM head when scoring tokens (log-probs, entropy; the actor, the reference and
    SFT): the head's logits exist for one chunk at a time, forward and backward. 0: automatic, as many tokens
    as keep a chunk's float32 logits within 128 MiB (220 tokens at a 151,936-token vocabulary)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA instead of full fine-tuning (``actor.lora.rank`` > 0) for the RL actor (``make sft`` trains all)."""


@dataclass(kw_only=True)
class CriticConfig(UpdateConfig):
    """The value model of PPO: the policy's VLM backbone with a scalar head per token."""

    lr: float = num(1e-3, ge=0)
    init: str = ""
    """Checkpoint the backbone starts from; empty = trainer.init (the SFT policy)."""
    cliprange_value: float = num(0.5, gt=0)
    """Clip range of the value update around the rollout-time values (PPO's clipped value loss)."""
    placement: Literal["colocate", "separate"] = "colocate"
    """colocate: the critic's ranks share the actor's resource pool (bundles); separate: its own pool."""


@dataclass(kw_only=True)
class AlgorithmKeys:
    """The algorithm by name, the keys several algorithms share, and each algorithm's own keys: the section
    ``algorithm.<name>`` of each algorithm of the table (``mmrl.algos.ALGORITHMS``) that has some. A key of an
    algorithm the run does not use is refused (algorithms.md#the-algorithm-object)."""

    name: str = "grpo"
    """The RL algorithm by name: a name of ``mmrl.algos.ALGORITHMS`` (grpo, ppo, dapo, ...; algorithms.md lists
    them)."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group's standard deviation (False gives Dr. GRPO's estimator)."""
    epsilon: float = num(1e-6, gt=0)
    """Added to the group's standard deviation before dividing by it."""
    gamma: float = num(1.0, ge=0, le=1)
    """Discount of token-level returns (ppo, vapo, pf_ppo, reinforce_plus_plus)."""
    lam: float = num(1.0, ge=0, le=1)
    """GAE lambda (ppo, pf_ppo)."""
    use_kl_in_reward: bool = False
    """Subtract ``kl_coef`` x a per-token KL(policy || reference) estimate from the token rewards before the
    advantages (REINFORCE++, PPO-style RLHF); needs the reference policy and a separate old-log-prob pass."""
    kl_penalty: Literal["k1", "k2", "k3", "low_var_kl", "abs"] = "k1"
    """The KL estimator of the reward penalty."""
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"
    """fixed: ``kl_coef`` throughout; adaptive: moved each step towards ``kl_target`` over ``kl_horizon`` samples."""
    kl_coef: float = num(0.001, ge=0)
    """The reward penalty's coefficient (the adaptive controller's start)."""
    kl_target: float = num(0.1, gt=0)
    kl_horizon: int = num(10000, ge=1)
    max_gen_rounds: int = num(4, ge=1)
    """Dynamic sampling (dapo, vapo): generation rounds a step may take to fill its batch with groups whose
    rewards differ; past it the step fails with an error that says what to change."""
    critic_warmup_steps: int = num(0, ge=0)
    """Value pre-training (ppo, vapo, pf_ppo): the first steps train the critic only, the actor waits."""


AlgorithmConfig = gather_sections("AlgorithmConfig", {name: cls.section for name, cls in ALGORITHMS.items()},
                                  AlgorithmKeys, __name__)


@dataclass(kw_only=True)
class RewardModelConfig:
    """A reward-model worker group: a VLM with a scalar head (``make rm``) scoring (prompt, media, response)."""

    path: str = ""
    """The reward model's checkpoint (``<rm.out_dir>/checkpoint``); empty: no reward model."""
    weight: float = num(1.0)
    """Its weight in the total reward."""
    micro_batch_size: int = auto_size()
    """Sequences per scoring forward; 0/auto: by ``max_tokens_per_micro``."""
    max_tokens_per_micro: int = auto_size()
    """Tokens per scoring forward (prompt + response of each row; it wins over ``micro_batch_size``); 0/auto:
    sized from the model and the memory at hand (:mod:`mmrl.budget`)."""
    placement: Literal["colocate", "separate"] = "colocate"
    """colocate: its ranks share the actor's resource pool; separate: its own pool."""
    vision: VisionPartConfig = field(default_factory=VisionPartConfig)
    llm: PartConfig = field(default_factory=PartConfig)


@dataclass(kw_only=True)
class JudgeConfig:
    """A generative judge: a VLM asked, through a rollout engine, whether a response is correct."""

    path: str = ""
    """The judge's checkpoint (a policy checkpoint); empty: no judge."""
    weight: float = num(1.0)
    engine: str = ""
    """Its rollout engine (see ``mmrl.rollout.ENGINES``); empty: ``rollout.engine``."""
    template: str = ("Question: {question}\nReference answer: {ground_truth}\nResponse: {response}\n"
                     "Is the response correct? Answer yes or no.")
    """The question put to the judge, after the prompt's media; fields: question, response, ground_truth."""
    max_new_tokens: int = num(8, ge=1)
    micro_batch_size: int = auto_size()
    """Questions per generate call of an hf engine; 0/auto: a token budget sized from the judge's model."""
    placement: Literal["colocate", "separate"] = "colocate"


@dataclass(kw_only=True)
class RewardConfig:
    function: str = "answer_match"
    """A reward function: a registered name (``rewards.available()``), an installed plugin (entry-point group
    ``mmrl.rewards``) or ``path/to/file.py:function``; ``none`` for no rule reward (a reward model alone)."""
    weights: dict[str, float] = field(default_factory=dict)
    """When set, the rule reward is the weighted sum of these reward functions (``function`` is then ignored)."""
    timeout_s: float = num(10.0, gt=0)
    """A reward call that takes longer scores 0 and is counted. With ``isolation=process`` its worker is killed
    (this holds even for code that never releases the GIL); inline, a late result is discarded but the call is
    not stopped."""
    isolation: Literal["process", "inline"] = "process"
    """process: reward functions run in one pool of worker processes per run (killed and restarted on a hang, a
    crash or memory past ``max_memory_mb``); inline: in the driver's thread, one sample after another (fastest,
    for trusted, well-behaved code)."""
    num_workers: int = num(2, ge=1)
    """Reward worker processes (``isolation=process``)."""
    max_memory_mb: float = num(4096, gt=0)
    """A reward worker whose resident memory passes this is killed; its sample scores 0."""
    max_abs_score: float = num(1e4, gt=0)
    """A score outside [-max_abs_score, max_abs_score] is a failure and scores 0."""
    max_failed_steps: int = num(3, ge=1)
    """Stop the run once every sample of this many steps in a row had a failed reward call."""
    verifier: str = "answer_match"
    """The verifier that decides whether a response is correct (val/test accuracy, ``train/acc``): a
    registered reward name or ``path/to/file.py:function`` returning 1 for correct."""
    verifiers: dict[str, str] = field(default_factory=dict)
    """Per ``data_source`` verifiers that replace ``verifier`` for that source."""
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)


@dataclass(kw_only=True)
class RMConfig(OptimConfig):
    """``make rm``: a reward model trained on preference pairs with the Bradley-Terry loss."""

    init: str = "outputs/sft/checkpoint"
    """The backbone it starts from (a policy checkpoint); its scalar head starts at zero."""
    out_dir: str = "outputs/rm"
    """Where the checkpoint (``<out_dir>/checkpoint``) and the pairs are written."""
    train_pairs: str = ""
    """A JSON-lines file of training pairs (``prompt_id`` of a row of the train split, ``chosen``,
    ``rejected``); empty: the ``make rm`` stage writes synthetic pairs made from the train split's labels."""
    val_pairs: str = ""
    """The same for the held-out pairs, on the val split."""
    pairs_per_prompt: int = num(4, ge=1)
    """Synthetic pairs per prompt."""
    steps: int = num(1200, ge=1)
    batch_size: int = num(32, ge=1)
    """Pairs per step."""
    lr: float = num(3e-4, ge=0)
    warmup_steps: int = num(10, ge=0)
    eval_pairs: int = num(256, ge=1)
    """Held-out pairs scored for pairwise accuracy."""


@dataclass(kw_only=True)
class TrainerConfig:
    init: str = "outputs/sft/checkpoint"
    """Checkpoint the RL run starts from."""
    out_dir: str = "outputs/rl"
    """Where the final checkpoint (``<out_dir>/checkpoint``) is written."""
    steps: int = num(100, ge=1)
    prompts_per_step: int = num(16, ge=1)
    eval_every: int = num(25, ge=0)
    """Evaluate on the val split every this many steps (0: only at the end)."""
    val_size: int = num(128, ge=1)
    """Val prompts per evaluation."""
    experiment: str = "mmrl"
    """MLflow experiment name."""
    run_name: str = ""
    save_every: int = num(50, ge=0)
    """Write a resumable checkpoint (``<out_dir>/step_<N>/``) every this many steps; the last step is
    always saved. 0: only the last step."""
    keep_last: int = num(2, ge=1)
    """Resumable checkpoints kept; older ones are deleted once a newer one is complete."""
    resume: str = "auto"
    """``auto``: continue from the newest complete checkpoint in ``out_dir`` if there is one; ``never``:
    start from ``init``; or the path of a ``step_<N>`` checkpoint folder."""
    max_restarts: int = num(3, ge=0)
    """Times a run rebuilds its workers from the newest checkpoint after a worker died or hung."""
    step_timeout_s: float = num(1800.0, gt=0)
    """A call to the workers (and any collective inside it) that takes longer counts as a hung worker."""
    skip_solved_after: int = num(0, ge=0)
    """Skip a prompt whose last this many groups had every sample right (0: off; :mod:`mmrl.trainer.pass_rates`)."""
    unsolved_revisit_rate: float = num(1.0, ge=0, le=1)
    """Draw a prompt never solved so far (every sample of every group wrong) with this probability (1: off)."""
    guide_unsolved: bool = False
    """A group whose every sample is wrong gets its row's known-good response (``extra["guide"]``, else the answer
    in the trained format; with agent rollouts a whole episode, its policy turns the guide's, its tool turns the
    real tools') in place of its last sample (LUFFY-style off-policy guidance, importance weight 1 with respect to
    the policy before the update: :mod:`mmrl.trainer.guidance`). Off by default until measured."""
    mode: Literal["sync", "async"] = "sync"
    """sync: generate, score, update, one after the other on the trainer's workers. async: a rollout pool
    (``rollout.num_workers``) generates the next batches while the trainer updates, with weights at most
    ``max_staleness`` versions old (:mod:`mmrl.trainer.async_rl`)."""
    max_staleness: int = num(1, ge=0)
    """async: the most weight versions a trained sample may be behind the trainer (0: exactly the sync run)."""
    stale_policy: Literal["wait", "drop"] = "wait"
    """async: wait (the default): at most ``max_staleness + 1`` batches are in flight, so no sample is ever too
    old and none is wasted; the rollout pool waits for weights when it is that far ahead. drop: one more batch
    is in flight, so the rollout pool never waits, and a batch older than ``max_staleness`` is dropped
    (``async/dropped_groups``)."""
    max_skipped_steps: int = num(3, ge=0)
    """Steps in a row whose update may be skipped for a non-finite reward, advantage, loss or gradient;
    one more stops the run with an error."""


@dataclass(kw_only=True)
class EvalConfig:
    checkpoint: str = "outputs/rl/checkpoint"
    split: str = "test"
    batch_size: int = num(64, ge=1)
    max_new_tokens: int = num(16, ge=1)
    """Response length limit of every evaluation: the RL run's validation, SFT's and ``make eval``
    (``rollout.max_new_tokens`` limits the training rollouts only)."""
    run_name: str = ""


@dataclass(kw_only=True)
class ResourcesConfig:
    num_workers: int = num(1, ge=1)
    """Workers in the actor/rollout/reference group (data-parallel ranks)."""
    threads_per_worker: int = num(0, ge=0)
    """torch threads per worker; 0 means the machine's cores divided by the number of workers."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto`` takes a GPU when one is visible."""
    ray_address: str = ""
    """An existing Ray cluster's address; empty starts a local Ray."""
    reuse_workers: bool = False
    """Keep the worker processes of a finished run (or of groups a recovery rebuilds) idle, and start later
    worker groups in them instead of in new processes (saves each rank's start: seconds of CPU for Python,
    torch and transformers). A process is reused only after its worker was torn down cleanly (process group
    and DTensor caches gone, memory freed, RNGs, threads and environment as at its start); never after a
    failure, and never after it ran vLLM. On CPU an idle process holds no Ray resources and serves a later
    group of any shape on its node (at most ``mmrl.controller.reuse.MAX_IDLE_PER_NODE`` wait per node); on GPU
    it keeps its bundle until a pool of another shape needs it. Idle processes hold memory until
    ``mmrl.controller.reuse.release_idle_workers()`` or the driver's end, so it is off by default: turn it on
    where one driver process runs many short runs (tests, sweeps, notebooks)."""


@dataclass(kw_only=True)
class TrackingConfig:
    uri: str = ""
    """MLflow tracking URI; empty means $MLFLOW_TRACKING_URI, else a sqlite file under outputs/."""
    sqlite_path: str = "outputs/mlflow.db"
    """The default store's sqlite file."""
    artifact_dir: str = "outputs/mlartifacts"
    """Where the default store keeps run artifacts (curves, rollout tables)."""
    system_metrics: bool = True
    """Log MLflow's system metrics (CPU, memory, disk, network; GPU when one is visible and pynvml is installed)."""
    system_metrics_interval_s: float = num(10.0, gt=0)
    """Seconds between two samples of the system metrics."""
    log_model: bool = True
    """Log the RL run's final policy as an MLflow model (``policy``: the Hugging Face folder in a pyfunc model
    whose ``predict`` gives greedy answers; :mod:`mmrl.policy_model`)."""
    register_model: str = ""
    """When set, the logged policy is also registered under this name in the model registry."""


@dataclass(kw_only=True)
class BarConfig:
    """The bar a demo config must meet (``make demo`` prints PASS or FAIL against it; ``make results`` records it).
    A demo's accuracies are greedy, on the test split; 0 leaves that bar unset."""

    rl_acc: float = num(0.0, ge=0, le=1)
    """The accuracy the RL checkpoint must reach."""
    gain: float = num(0.0, ge=-1, le=1)
    """The least gain of the RL checkpoint over the SFT start (``rl_acc - sft_acc``)."""
    rl_minutes: float = num(0.0, ge=0)
    """The most minutes the RL stage may take (the demo summary's own time; 0: no time bar)."""


@dataclass(kw_only=True)
class Config:
    seed: int = num(0, ge=0)
    """The one seed: synthetic data (each split derives its own), model init, SFT and RL sampling."""
    model: ModelConfig = field(default_factory=ModelConfig)
    tiny_model: TinyModelConfig = field(default_factory=TinyModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rm: RMConfig = field(default_factory=RMConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    bar: BarConfig = field(default_factory=BarConfig)

    given_keys: frozenset[str] = field(default=frozenset(), repr=False, compare=False, metadata={"key": False})
    """Not a config key: the dotted keys the YAML chain and the overrides set (``"algorithm.pf_ppo.filter_k"``;
    a mapping-valued key such as ``data.tasks`` as a whole), recorded by :func:`load_config`, so that a check
    can tell a key the user set from a default. Empty for a config built in code."""

    def validate(self) -> None:
        """The checks that need no table of the library, each naming the keys involved (single values are
        checked by their bounds). It reads and never writes. The checks against the tables of algorithms,
        losses and engines run from the layer above (:mod:`mmrl.run_config`)."""
        if self.reward.function == "none" and not self.reward.weights and not (
            self.reward.model.path or self.reward.judge.path
        ):
            raise ConfigError("reward.function=none leaves nothing to score the samples: set reward.function, "
                              "reward.weights, reward.model.path or reward.judge.path")
        for name in ("actor.vision", "actor.llm", "critic.vision", "critic.llm", "reward.model.vision",
                     "reward.model.llm"):
            _check_part(self, name)
        samples = self.trainer.prompts_per_step * self.rollout.n
        for section in ("actor", "critic"):
            mini = getattr(self, section).num_mini_batches
            if samples < mini * self.resources.num_workers:
                raise ConfigError(
                    f"trainer.prompts_per_step * rollout.n = {samples} samples cannot fill {section}.num_mini_batches="
                    f"{mini} mini-batches on each of resources.num_workers={self.resources.num_workers} workers; "
                    f"lower {section}.num_mini_batches"
                )
        _check_lora(self)
        if self.actor.old_log_probs == "rollout" and (self.rollout.top_p < 1 or self.rollout.top_k > 0):
            raise ConfigError("actor.old_log_probs=rollout needs rollout.top_p=1 and rollout.top_k=0: with a "
                              "truncated distribution the engine's log-probs are not the policy's")
        if self.data.min_pixels > self.data.max_pixels:
            raise ConfigError(f"data.min_pixels={self.data.min_pixels} exceeds data.max_pixels={self.data.max_pixels}")
        if self.data.video_min_frames > self.data.video_max_frames:
            raise ConfigError(f"data.video_min_frames={self.data.video_min_frames} exceeds "
                              f"data.video_max_frames={self.data.video_max_frames}")
        for key, mapping in (("data.tasks", self.data.tasks), ("data.sizes", self.data.sizes)):
            bad = {k: v for k, v in mapping.items() if not (math.isfinite(v) and v >= 0)}
            if bad:
                raise ConfigError(f"{key} values must be finite and >= 0, got {bad}")
        bad_weights = {k: v for k, v in self.reward.weights.items() if not math.isfinite(v)}
        if bad_weights:
            raise ConfigError(f"reward.weights values must be finite numbers, got {bad_weights}")


def require_known(key: str, value: str, table: Mapping[str, Any]) -> None:
    """Raise a ConfigError naming ``key`` and the allowed names when ``value`` is not a name of ``table``."""
    if value not in table:
        raise ConfigError(f"{key}={value!r} is unknown; allowed: {', '.join(sorted(table))}")


def _check_lora(cfg: Config) -> None:
    lora = cfg.actor.lora
    if not lora.rank:
        return
    bad = [name for name in lora.target_modules
           if not name or not all(p.isidentifier() or p.isdigit() for p in name.split("."))]
    if not lora.target_modules or bad:
        raise ConfigError(f"actor.lora.target_modules={lora.target_modules!r} must name linear layers of the language "
                          f"model (e.g. {', '.join(LLM_LINEAR_LAYERS)}){f'; not a layer name: {bad}' if bad else ''}")
    if lora.include_vision and cfg.actor.vision.freeze:
        raise ConfigError("actor.lora.include_vision=true puts trained adapters on the vision tower, but "
                          "actor.vision.freeze=true freezes it: set one of them to false")


def _check_part(cfg: Config, name: str) -> None:
    spec: Any = cfg
    for key in name.split("."):
        spec = getattr(spec, key)
    workers = cfg.resources.num_workers
    if spec.strategy == "hsdp" and (spec.shard_size < 1 or workers % spec.shard_size):
        raise ConfigError(
            f"{name}.strategy=hsdp needs {name}.shard_size dividing resources.num_workers={workers}, "
            f"got {spec.shard_size}"
        )


# ---------------------------------------------------------------------------------------------------
# Derived values


def resolve(cfg: Config) -> Config:
    """A new Config with the derived values filled in; ``cfg`` is left as it is.

    A derived key left at 0 takes its value from the others: ``actor.loss_horizon`` and
    ``critic.loss_horizon`` = ``rollout.max_new_tokens``; ``actor.decay_steps`` and ``critic.decay_steps`` =
    ``trainer.steps x num_mini_batches x ppo_epochs`` of that section. A value already set is kept, so
    resolving a resolved config gives the same config. Change a config before resolving it (better: build it
    with overrides), never after: a resolved config keeps the values derived from the old keys.
    """
    out = copy.deepcopy(cfg)
    for name in ("actor", "critic"):
        section = getattr(out, name)
        setattr(out, name, dataclasses.replace(
            section,
            loss_horizon=section.loss_horizon or out.rollout.max_new_tokens,
            decay_steps=section.decay_steps or out.trainer.steps * section.num_mini_batches * section.ppo_epochs,
        ))
    return out


# ---------------------------------------------------------------------------------------------------
# Loading


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- YAML file (and its ``base:`` chain) <- ``key.sub=value`` overrides; checked by bounds and
    :meth:`Config.validate`, not resolved (:func:`resolve`) and not checked against the library's tables: a run
    loads its config with :func:`mmrl.run_config.load_run_config`, which does both. The keys given are
    recorded in ``given_keys``."""
    raw: dict[str, Any] = _read_yaml_chain(Path(path)) if path else {}
    for item in overrides:
        _apply_override(raw, item)
    cfg = _build(Config, raw, prefix="")
    cfg.given_keys = frozenset(_given_keys(Config, raw, prefix=""))
    cfg.validate()
    return cfg


def _given_keys(cls: type, raw: dict[str, Any], prefix: str) -> list[str]:
    """The dotted leaf keys of ``raw`` (already checked against ``cls`` by :func:`_build`)."""
    hints = typing.get_type_hints(cls)
    keys = []
    for name, value in raw.items():
        if dataclasses.is_dataclass(hints[name]) and isinstance(value, dict):
            keys.extend(_given_keys(hints[name], value, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _read_yaml_chain(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass a YAML under configs/")
    if path.resolve() in seen:
        raise ConfigError(f"config file {path} names itself as a base (cycle: {[str(p) for p in seen]})")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    merged = _read_yaml_chain(path.parent / base, seen + (path.resolve(),))
    _deep_merge(merged, data)
    return merged


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and not _is_leaf_mapping(key):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _is_leaf_mapping(key: str) -> bool:
    # Mapping-valued fields (task mixes, reward weights) are replaced whole, not merged key by key.
    return key in {"tasks", "sizes", "weights", "verifiers"}


def _apply_override(raw: dict[str, Any], item: str) -> None:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value (e.g. rollout.n=8)")
    dotted, text = item.split("=", 1)
    keys = dotted.strip().split(".")
    node = raw
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {key!r} is not a section")
    node[keys[-1]] = yaml.safe_load(text) if text.strip() else ""


def _build(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping of keys, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("key", True)}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in raw if k not in fields]
    if unknown:
        key = unknown[0]
        if f"{prefix}{key}" in RENAMED:
            raise ConfigError(f"{prefix}{key} was renamed: use {RENAMED[prefix + key]}")
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise ConfigError(f"unknown key {prefix}{key}{hint}; allowed keys in {where}: {', '.join(fields)}")
    raw = {name: 0 if value == "auto" and fields[name].metadata.get("auto") else value for name, value in raw.items()}
    kwargs = {name: _coerce(hints[name], value, f"{prefix}{name}") for name, value in raw.items()}
    built = cls(**kwargs)
    _check_bounds(built, prefix)
    return built


def _check_bounds(obj: Any, prefix: str) -> None:
    """Every bounded numeric field of ``obj`` (given or default) lies in its range."""
    for f in dataclasses.fields(obj):
        bounds = f.metadata.get("bounds")
        value = getattr(obj, f.name)
        problem = bounds.violation(value) if bounds is not None else None
        if problem:
            raise ConfigError(f"{prefix}{f.name}={value!r} {problem}")


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}={value!r} is not allowed; allowed values: {', '.join(map(str, args))}")
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in args:
            if option is type(None) and value is None:
                return None
            try:
                return _coerce(option, value, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(f"{key}={value!r} matches none of its types: {'; '.join(errors)}")
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        key_t, val_t = args
        return {_coerce(key_t, k, f"{key}.{k}"): _coerce(val_t, v, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    return _coerce_scalar(tp, value, key)


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    elif tp is Any:
        return value
    raise ConfigError(f"{key}={value!r} must be of type {getattr(tp, '__name__', tp)}")


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config's keys as plain nested dicts (for YAML dumps and MLflow params); ``given_keys`` is no key."""
    tree = dataclasses.asdict(cfg)
    tree.pop("given_keys", None)
    return tree


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
