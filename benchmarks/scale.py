"""``make bench-scale``: peak memory per worker and step time at real model shapes, mmrl against TRL.

The model: a random-init Qwen2.5-VL with the real vocabulary (151,936) and Qwen2.5-VL-3B-Instruct's widths
(text: hidden 2048, FFN 11008, 16 heads, 2 KV heads, tied embeddings, rope theta 1e6; vision: hidden 1280, FFN
3420, 16 heads, 14-pixel patches merged 2 x 2 into 2048), only a few layers deep (``tiny_model.num_layers`` /
``vision_depth`` in configs/bench_scale.yaml: 2 and 2 of 36 and 32), so that it runs on a CPU box. The
tokenizer is the tiny BPE (a few hundred tokens); the model's vocabulary is padded to ``tiny_model.vocab_size``:
the head and the embedding have their real size, which is what memory and time see (nothing here learns).

The work of one cell (M responses x R tokens): M / n one-image prompts (112 x 112: 16 image tokens) x n samples
(``rollout.n``), each response R random non-special tokens, random advantages (mmrl) or rewards (TRL); one GRPO
update per step, the M responses as one micro-batch: forward, backward, one AdamW step; no KL, one epoch, one
mini-batch, temperature 1, activation checkpointing as the config says (TRL's default is on; both sides take
it). Generation is not measured: TRL's is replaced by the same random responses, so both sides update on the
same shapes.

Sides (``--sides``, default ``mmrl mmrl-lora trl trl-lora``): ``mmrl`` (full parameters) and
``mmrl-lora`` (``actor.lora``: adapters on the language model's linear layers, vision frozen) through one fresh
actor worker (:class:`~mmrl.workers.hybrid.ActorRolloutRefWorker` without a rollout engine or a reference);
``trl`` and ``trl-lora`` (the same adapters through peft) through TRL's ``GRPOTrainer`` in a fresh process.
Cells (``--cells``, default ``8x64 64x64``, each M x R; ``8x256`` adds the length axis). Each cell
runs a warm-up step of the same M responses of WARMUP_LENGTH tokens (it allocates the gradients and the AdamW
state), then ``--steps`` (default 1) measured steps: the step time is their median, the peak is over
all the steps, so it is the steady state's, with the optimizer state in memory.

Memory is :mod:`mmrl.memory.peaks`'s peak over the steps (on CPU the process's peak RSS; CUDA's peak allocated
memory on a GPU), in GiB, the window opened once the model is loaded. ``state`` is what the weights, the
gradients and AdamW's moments take (counted, not measured): the floor under every side's peak (a loaded
checkpoint stays mapped from its file until touched, so the memory right after loading says little). The table
ends with each side's growth from the smallest to the largest M at the same R, against one float32 tensor of the
extra responses' logits, e.g. (56, 64, V) from 8 to 64 (2.03 GiB). The measures go to
``outputs/bench_scale/results.json`` as they come. This is a benchmark, not a test: it asserts nothing.

    python -m benchmarks.scale --config configs/bench_scale.yaml
    python -m benchmarks.scale --config configs/bench_scale.yaml --cells "8x64 64x64" --sides "mmrl trl" \\
        tiny_model.num_layers=4
    make bench-scale CELLS="8x64 8x256" SIDES="mmrl trl" STEPS=2 ARGS="tiny_model.num_layers=4"
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.flags import names, parse_flags, shapes
from mmrl.config import Config, TinyModelConfig
from mmrl.memory.peaks import GIB, peak_gb, reset_peak
from mmrl.protocol import Batch
from pipelines.cli import Command

OUT = Path("outputs/bench_scale")
CELLS = ((8, 64), (64, 64))  # (responses per micro-batch, tokens per response)
SIDES = ("mmrl", "mmrl-lora", "trl", "trl-lora")
STEPS = 1
WARMUP_LENGTH = 4
KINDS = {"mmrl": ("mmrl", False), "mmrl-lora": ("mmrl", True), "trl": ("trl", False), "trl-lora": ("trl", True)}
"""Each side: (framework, LoRA)."""

# Qwen2.5-VL-3B-Instruct's config.json values that TinyModelConfig does not carry.
VISION_FFN = 3420
ROPE_THETA = 1_000_000.0
TIED_EMBEDDINGS = True
TOKENIZER_VOCAB = TinyModelConfig().vocab_size  # the tiny BPE's; the model's vocabulary is padded past it


@dataclass
class Measure:
    """One side on one cell: memory (GiB) and seconds per step."""

    side: str
    micro: int
    length: int
    peak_gb: float
    step_s: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """The step time: the median of the measured steps."""
        return statistics.median(self.step_s)

    @property
    def tokens_per_s(self) -> float:
        return self.micro * self.length / self.seconds


# ---- the model ----------------------------------------------------------------------------------


def scale_config(tokenizer: Any, spec: TinyModelConfig) -> Any:
    """A Qwen2_5_VLConfig with ``spec``'s widths and depths, the vocabulary padded to ``spec.vocab_size``, and
    Qwen2.5-VL-3B's vision FFN, rope theta and tied embeddings."""
    from transformers import Qwen2_5_VLConfig

    from mmrl.models.families.qwen2_vl import mrope_section, text_config, token_ids

    if spec.vocab_size < len(tokenizer):
        raise ValueError(f"tiny_model.vocab_size={spec.vocab_size} is below the tokenizer's {len(tokenizer)} tokens")
    text = text_config(tokenizer, spec) | {
        "vocab_size": spec.vocab_size, "max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA, "mrope_section": mrope_section(spec)},
    }
    patch = spec.patch_size or 14
    vision = dict(depth=spec.vision_depth, hidden_size=spec.vision_hidden_size, intermediate_size=VISION_FFN,
                  num_heads=spec.vision_heads, patch_size=patch, spatial_merge_size=spec.merge_size,
                  out_hidden_size=spec.hidden_size, window_size=112, fullatt_block_indexes=[spec.vision_depth - 1])
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=TIED_EMBEDDINGS,
                            **token_ids(tokenizer))


def build_scale_model(cfg: Config) -> str:
    """Write the bench model (random init, seed ``cfg.seed``) and the tiny processor to ``model.path``, unless
    a model of the same spec is there; returns a line that says which."""
    from mmrl.models.families.qwen2_5_vl import QWEN2_5_VL
    from mmrl.models.families.qwen2_vl import qwen_tokenizer
    from mmrl.models.tiny import count_parameters
    from pipelines.model import task_corpus

    out = Path(cfg.model.path)
    stamp = out / "bench_scale_spec.json"
    spec = cfg.tiny_model
    if stamp.is_file() and json.loads(stamp.read_text()) == {**asdict(spec), "seed": cfg.seed}:
        return f"model: {out} (already built)"
    tokenizer = qwen_tokenizer(task_corpus(cfg), TOKENIZER_VOCAB)
    processor = QWEN2_5_VL.build_processor(tokenizer, spec)
    torch.manual_seed(cfg.seed)
    model = QWEN2_5_VL.model_class()(scale_config(tokenizer, spec))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    stamp.write_text(json.dumps({**asdict(spec), "seed": cfg.seed}))
    return f"model: {count_parameters(model) / 1e6:.0f} M parameters -> {out}"


def in_fresh_process(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a new spawned process (its memory is its own, and is gone after)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


# ---- the work -----------------------------------------------------------------------------------


def response_ids(tokenizer: Any) -> torch.Tensor:
    """The ids a random response draws from: the tokenizer's, less its special tokens (no end of turn, no
    vision token), so every response runs to its full length on both sides."""
    special = set(tokenizer.all_special_ids)
    return torch.tensor([i for i in range(len(tokenizer)) if i not in special])


def random_responses(allowed: torch.Tensor, count: int, length: int, seed: int) -> torch.Tensor:
    """(count, length) int64 ids drawn uniformly from ``allowed`` (K,)."""
    generator = torch.Generator().manual_seed(seed)
    return allowed[torch.randint(len(allowed), (count, length), generator=generator)]


def mmrl_batch(rows: list[dict[str, Any]], n: int, length: int, allowed: torch.Tensor, seed: int) -> Batch:
    """The prompts of ``rows`` x n samples, each with ``length`` random response tokens and a random advantage."""
    from mmrl.trainer.dataset import rows_to_batch

    batch = rows_to_batch(rows).repeat(n)
    count = len(batch)
    mask = torch.ones(count, length)
    batch.tensors["responses"] = random_responses(allowed, count, length, seed)
    batch.tensors["response_mask"] = mask
    batch.tensors["advantages"] = torch.randn(count, 1, generator=torch.Generator().manual_seed(seed)) * mask
    return batch


def side_config(command: Command, side: str, micro: int) -> Config:
    """The run's config for ``side``: one worker, micro-batches of ``micro`` rows, LoRA or not."""
    _, lora = KINDS[side]
    rank = [] if lora else ["actor.lora.rank=0"]
    return command.load(*rank, "resources.num_workers=1", f"actor.micro_batch_size={micro}",
                        "actor.max_tokens_per_micro=0", "actor.num_mini_batches=1", "actor.ppo_epochs=1",
                        "actor.use_kl_loss=false")


def prompt_rows(cfg: Config, micro: int, steps: int) -> list[list[dict[str, Any]]]:
    """Each step's prompt rows (the warm-up's first): micro / n of them."""
    from mmrl.trainer.dataset import load_rows

    n = cfg.rollout.n
    if micro % n:
        raise ValueError(f"bench-scale: a cell of {micro} responses is not a whole number of prompts x rollout.n={n}")
    rows = load_rows(cfg.data.dir, "train")
    per_step = micro // n
    return [rows[step * per_step:(step + 1) * per_step] for step in range(1 + steps)]


# ---- the sides ----------------------------------------------------------------------------------


def run_mmrl(cfg: Config, side: str, micro: int, length: int, steps: int) -> Measure:
    """One fresh actor worker (no rollout engine, no reference): a warm-up update, then ``steps`` updates on
    random responses."""
    from mmrl.models.loading import load_processor
    from benchmarks.common import spawn, step_peaks

    allowed = response_ids(load_processor(cfg.model.path).tokenizer)
    batches = [mmrl_batch(rows, cfg.rollout.n, length if step else WARMUP_LENGTH, allowed, cfg.seed + step)
               for step, rows in enumerate(prompt_rows(cfg, micro, steps))]
    group = spawn(cfg)
    try:
        group.init_model(cfg, cfg.model.path, False, False)
        group.reset_peak_memory()
        peaks, times = [0.0], []
        for batch in batches:
            group.forget_prompts()  # a new step: its peak-memory window opens
            start = time.perf_counter()
            group.update_actor(batch)
            times.append(time.perf_counter() - start)
            peaks = step_peaks(group, peaks)
        return Measure(side, micro, length, peaks[0], times[1:])
    finally:
        group.shutdown()


def run_trl(cfg: Config, side: str, micro: int, length: int, steps: int, threads: int) -> Measure:
    """TRL's GRPOTrainer on the same model, prompts and shapes, generation replaced by random responses (run it
    in a fresh process: :func:`in_fresh_process`)."""
    from trl import GRPOConfig, GRPOTrainer
    from transformers import AutoProcessor, TrainerCallback

    from mmrl.models.loading import load_model
    from mmrl.models.lora import peft_config, target_modules
    from benchmarks.peer import trl_dataset
    from pipelines.cli import quiet_third_party

    quiet_third_party()
    torch.set_num_threads(threads)
    _, lora = KINDS[side]
    if cfg.actor.llm.activation_checkpointing != cfg.actor.vision.activation_checkpointing:
        raise ValueError("bench-scale: TRL checkpoints the whole model or nothing; set actor.llm and actor.vision "
                         "activation_checkpointing alike")
    processor = AutoProcessor.from_pretrained(cfg.model.path)
    model = load_model(cfg.model.path, cfg.model.dtype, cfg.model.attn_implementation, torch.device("cpu"))
    allowed = response_ids(processor.tokenizer)
    rows = [row for step in prompt_rows(cfg, micro, steps) for row in step]
    times: list[float] = []
    calls = [0]

    class FixedResponses(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids: list, *args: Any, **kwargs: Any) -> tuple[list, None]:
            calls[0] += 1
            size = length if calls[0] > 1 else WARMUP_LENGTH
            ids = random_responses(allowed, len(prompt_ids), size, cfg.seed + calls[0])
            return ids.tolist(), None

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            times.append(time.perf_counter() - self.start)

    def reward(completions: list[Any], **_: Any) -> list[float]:
        return torch.rand(len(completions)).tolist()

    args = GRPOConfig(
        output_dir=str(OUT / f"trl-{side}-{micro}x{length}"), use_cpu=True, report_to=[], save_strategy="no",
        logging_steps=1000, max_steps=1 + steps, learning_rate=cfg.actor.lr, lr_scheduler_type="constant",
        warmup_steps=0, seed=cfg.seed, per_device_train_batch_size=micro, gradient_accumulation_steps=1,
        num_generations=cfg.rollout.n, max_completion_length=length, temperature=cfg.rollout.temperature,
        beta=0.0, num_iterations=1, remove_unused_columns=False, dataloader_num_workers=0, bf16=False,
        disable_tqdm=True, gradient_checkpointing=cfg.actor.llm.activation_checkpointing,
    )
    peft = peft_config(cfg.actor.lora, target_modules(model, cfg.actor.lora)) if lora else None
    trainer = FixedResponses(model=model, reward_funcs=[reward], args=args, train_dataset=trl_dataset(rows),
                             processing_class=processor, callbacks=[StepTimer()], peft_config=peft)
    cpu = torch.device("cpu")
    reset_peak(cpu, trim=True)
    trainer.train()
    if len(times) != 1 + steps:
        raise RuntimeError(f"bench-scale: TRL ran {len(times)} steps, expected {1 + steps}")
    return Measure(side, micro, length, peak_gb(cpu), times[1:])


# ---- the table ----------------------------------------------------------------------------------


def state_gib(cfg: Config, lora: bool) -> float:
    """GiB that the weights, the gradients and AdamW's two moments take (the parameter's dtype each): the floor
    under every side's peak. Counted on a meta-device copy of the model (no memory)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from mmrl.models.loading import DTYPES
    from mmrl.models.lora import target_modules

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(cfg.model.path))
    total = sum(p.numel() for p in model.parameters())
    trained = total
    if lora:
        modules = dict(model.named_modules())
        trained = sum(cfg.actor.lora.rank * (modules[name].in_features + modules[name].out_features)
                      for name in target_modules(model, cfg.actor.lora))
    return (total + 3 * trained) * DTYPES[cfg.model.dtype].itemsize / GIB


def logits_gib(responses: int, length: int, vocab: int) -> float:
    """GiB of one float32 (responses, length, vocab) tensor."""
    return responses * length * vocab * 4 / GIB


def peer_of(results: list[Measure], m: Measure) -> Measure | None:
    """TRL's measure of the same kind (full or LoRA) on the same cell, if measured."""
    _, lora = KINDS[m.side]
    return next((r for r in results if KINDS[r.side] == ("trl", lora) and (r.micro, r.length) == (m.micro, m.length)),
                None)


def table_rows(results: list[Measure], states: dict[bool, float]) -> list[list[str]]:
    rows = []
    for m in results:
        peer = peer_of(results, m) if KINDS[m.side][0] == "mmrl" else None
        state = states[KINDS[m.side][1]]
        rows.append([f"{m.micro} x {m.length}", m.side, f"{state:.2f}", f"{m.peak_gb:.2f}",
                     f"{m.peak_gb - state:.2f}", f"{m.seconds:.1f}", f"{m.tokens_per_s:.0f}",
                     f"{m.peak_gb / peer.peak_gb:.2f}" if peer else "",
                     f"{peer.seconds / m.seconds:.2f}x" if peer else ""])
    return rows


def growth_lines(results: list[Measure], vocab: int) -> list[str]:
    """Each side's peak growth from the smallest to the largest micro-batch at each length, against one float32
    tensor of the extra responses' logits."""
    lines = []
    for side in dict.fromkeys(r.side for r in results):
        for length in sorted({r.length for r in results}):
            cells = sorted((r for r in results if r.side == side and r.length == length), key=lambda r: r.micro)
            if len(cells) < 2:
                continue
            low, high = cells[0], cells[-1]
            extra = high.micro - low.micro
            lines.append(f"{side}: {low.micro} -> {high.micro} responses of {length} tokens: peak "
                         f"{high.peak_gb - low.peak_gb:+.2f} GiB; one float32 ({extra}, {length}, {vocab}) tensor is "
                         f"{logits_gib(extra, length, vocab):.2f} GiB")
    return lines


def print_table(results: list[Measure], cfg: Config) -> None:
    from benchmarks.common import print_table as print_rows

    spec = cfg.tiny_model
    print_rows(f"One GRPO update per step at Qwen2.5-VL-3B's widths, V = {spec.vocab_size}, {spec.num_layers} text + "
               f"{spec.vision_depth} vision layers, {cfg.model.dtype}, activation checkpointing "
               f"{cfg.actor.llm.activation_checkpointing}; memory GiB (peak RSS on CPU); 'vs TRL': mmrl's peak / "
               "TRL's of the same kind (full or LoRA), and TRL's step time / mmrl's; state = weights + "
               "gradients + AdamW moments, counted",
               ["M x R", "side", "state GiB", "peak GiB", "peak - state", "step s", "tokens/s", "peak vs TRL",
                "speed vs TRL"], table_rows(results, {lora: state_gib(cfg, lora) for lora in (False, True)}))
    for line in growth_lines(results, spec.vocab_size):
        print(line)


def flag_parser() -> argparse.ArgumentParser:
    """The flags of ``make bench-scale``: the grid of cells and sides, and the measured steps."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=shapes(2, "8x64 64x64"), default=" ".join(f"{m}x{r}" for m, r in CELLS),
                        help="the cells, each M x R (responses per micro-batch x tokens per response), separated by "
                             "spaces or commas (make: CELLS=...; default: %(default)s)")
    parser.add_argument("--sides", type=names(list(KINDS)), default=" ".join(SIDES),
                        help=f"the sides, from {', '.join(KINDS)} (make: SIDES=...; default: %(default)s)")
    parser.add_argument("--steps", type=int, default=STEPS,
                        help="measured steps per cell, after the warm-up (make: STEPS=...; default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> list[Measure]:
    from benchmarks.common import ensure_inputs
    from mmrl.controller.session import ensure_ray

    command, flags = parse_flags(flag_parser(), argv)
    cells, sides, steps = flags.cells, flags.sides, flags.steps
    cfg = command.load()
    print(in_fresh_process(build_scale_model, cfg))
    prompts = max(m for m, _ in cells) // cfg.rollout.n * (1 + steps)
    data = command.load(f"data.sizes={{sft: 8, train: {prompts}, val: 8, test: 8}}")
    ensure_inputs(data, rebuild_data=True)
    threads = cfg.resources.threads_per_worker or torch.get_num_threads()
    results: list[Measure] = []
    runs = [(cell, side) for cell in cells for side in sides]
    if any(KINDS[s][0] == "mmrl" for s in sides):
        ensure_ray(cfg.resources)
    for (micro, length), side in tqdm(runs, desc="bench-scale (cell x side)"):
        side_cfg = side_config(command, side, micro)
        if KINDS[side][0] == "mmrl":
            measure = run_mmrl(side_cfg, side, micro, length, steps)
        else:
            measure = in_fresh_process(run_trl, side_cfg, side, micro, length, steps, threads)
        results.append(measure)
        tqdm.write(f"{side} {micro}x{length}: peak {measure.peak_gb:.2f} GiB, step {measure.seconds:.1f} s")
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "results.json").write_text(json.dumps([asdict(m) for m in results], indent=1))  # so far
    print_table(results, cfg)
    return results


if __name__ == "__main__":
    main()
