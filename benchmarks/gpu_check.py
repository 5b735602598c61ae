"""``make gpu-check``: mmrl's GPU paths on CUDA, in one command, on tiny models.

1. Chunked scoring at a real vocabulary (151,936): the chunked log-probs and entropy and their gradients against
   the full-vocabulary computation on the device, with the peak memory of each.
2. Activation checkpointing, per model family: the gradients of a policy pass with both parts recomputed equal
   the plain pass's.
3. Short RL runs: GRPO on a tiny model of every family (both parts recomputed, log-probs in chunks of 64
   tokens), PPO with a sharded critic, and GRPO with LoRA adapters (the vision tower's included).

Everything goes under ``outputs/gpu_check/``; the runs use every visible GPU (up to 2 workers, nccl between them
when 2). It prints the device, each check's numbers and each run's mean step time, and exits with an error
naming the checks that failed. Without CUDA it stops at once with an error; ``resources.device=cpu`` runs the
same checks on the CPU (to try the script, not the GPU).

    python -m benchmarks.gpu_check --config configs/demo.yaml
"""

from __future__ import annotations

import copy
import statistics
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from mlflow.tracking import MlflowClient
from PIL import Image

from mmrl.answer_format import format_answer
from mmrl.config import Config
from mmrl.models.encoding import encode_prompt, vision_token_ids
from mmrl.models.families import FAMILIES
from mmrl.models.loading import load_processor
from mmrl.models.logprobs import response_logprobs
from mmrl.models.scoring import Scoring, score_tokens
from mmrl.models.tiny import build_tiny_vlm
from mmrl.parallel.sharding import model_blocks
from mmrl.trainer.tracking import tracking_uri
from mmrl.trainer.run import run_rl
from mmrl.workers.model_builder import build_model
from pipelines import data, model
from pipelines.cli import parse_command

OUT = "outputs/gpu_check"
TOLERANCE = 1e-5  # of each compared tensor's largest entry: float32 sums in another order
SAVERS = ("actor.llm.activation_checkpointing=true", "actor.vision.activation_checkpointing=true",
          "actor.logprob_chunk_tokens=64")
# run name -> (model family, overrides): GRPO on every family with the memory savers on, then PPO and LoRA.
RUNS = {**{f"grpo-{family}": (family, ("algorithm.name=grpo", *SAVERS)) for family in FAMILIES},
        "ppo": ("qwen2_5_vl", ("algorithm.name=ppo", "critic.llm.strategy=fsdp")),
        "grpo-lora": ("qwen2_5_vl", ("algorithm.name=grpo", "actor.lora.rank=8", "actor.lora.include_vision=true",
                                     "actor.lr=3e-3"))}


def check_overrides(cfg: Config) -> list[str]:
    """The overrides that make the user's config small and point it at ``outputs/gpu_check`` and the GPUs."""
    out = []
    if cfg.resources.device in ("auto", "cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("gpu-check: CUDA is not available here (torch.cuda.is_available() is False); run it "
                             "on a GPU machine after `make install GPU=1`, or pass resources.device=cpu to try it")
        out += ["resources.device=cuda", f"resources.num_workers={min(2, torch.cuda.device_count())}"]
    return out + [
        f"data.dir={OUT}/data", "data.sizes={sft: 16, train: 256, val: 16, test: 16}",
        f"trainer.steps={min(cfg.trainer.steps, 10)}", "trainer.eval_every=0", "trainer.val_size=16",
        "trainer.save_every=0", "trainer.resume=never", f"tracking.uri=sqlite:///{OUT}/mlflow.db",
    ]


def relative_gap(got: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    """The largest |got - expected| of each pair over the pair's largest |expected| (at least 1)."""
    return max(float((a - b).abs().max()) / max(1.0, float(b.abs().max())) for a, b in zip(got, expected))


def peak_gb(device: torch.device) -> float:
    """CUDA's peak allocated memory since the last reset, GiB (NaN on the CPU)."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def check_scoring(device: torch.device, tokens: int, hidden_size: int = 256, vocab: int = 151_936) -> float:
    """Chunked scoring (256 tokens a chunk) against (tokens, vocab) float32 logits at once: log-probs, entropy and
    the gradients wrt the hidden states and the head, at temperature 0.7 with two banned ids."""
    torch.backends.cuda.matmul.allow_tf32 = False  # the same float32 products on both paths
    gen = torch.Generator(device).manual_seed(0)
    weight = (torch.randn(vocab, hidden_size, device=device, generator=gen) / hidden_size**0.5).requires_grad_()
    hidden = torch.randn(tokens, hidden_size, device=device, generator=gen).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), device=device, generator=gen)
    w_logp, w_ent = torch.randn(2, tokens, device=device, generator=gen)
    banned, temperature = (5, 7), 0.7

    def full() -> tuple[torch.Tensor, torch.Tensor]:
        logits = (F.linear(hidden, weight) / temperature).index_fill(-1, torch.tensor(banned, device=device), -torch.inf)
        log_probs = F.log_softmax(logits, -1)
        probs = log_probs.exp()
        entropy = -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)
        return log_probs.gather(-1, targets[:, None]).squeeze(-1), entropy

    def chunked() -> tuple[torch.Tensor, torch.Tensor]:
        return score_tokens(hidden, SimpleNamespace(weight=weight), targets, Scoring(temperature, banned, True, 256))

    results = {}
    for name, scores in (("full", full), ("chunked", chunked)):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        logp, entropy = scores()
        grads = torch.autograd.grad((w_logp * logp).sum() + (w_ent * entropy).sum(), [hidden, weight])
        results[name] = [logp.detach(), entropy.detach(), *grads], peak_gb(device)
    gap = relative_gap(results["chunked"][0], results["full"][0])
    memory = (f"; peak memory {results['chunked'][1]:.2f} GiB chunked vs {results['full'][1]:.2f} GiB full"
              if device.type == "cuda" else "")
    print(f"gpu-check: chunked scoring, V={vocab}, {tokens} tokens: max relative difference {gap:.1e}{memory}",
          flush=True)
    return gap


def check_checkpointing(cfg: Config, model_dir: str, device: torch.device) -> float:
    """One policy pass (an image prompt and a text prompt) with both parts recomputed against the plain pass:
    the gradients of every weight. Fails when the recomputed pass did not run each block twice."""
    processor = load_processor(model_dir)
    image = Image.new("RGB", (56, 56), (200, 30, 30))
    prompts = [encode_prompt(processor, [{"role": "user", "content": "<image>What colour is the shape?"}], [image]),
               encode_prompt(processor, [{"role": "user", "content": "Name a colour."}], [])]
    answer = processor.tokenizer(format_answer("red"), add_special_tokens=False)["input_ids"]
    responses = torch.tensor([answer, answer])
    mask = torch.ones(responses.shape)
    mask[1, len(answer) // 2:] = 0
    grads = []
    for recompute in (False, True):
        run_cfg = copy.deepcopy(cfg)
        run_cfg.actor.vision.activation_checkpointing = run_cfg.actor.llm.activation_checkpointing = recompute
        root = build_model(run_cfg, "actor", model_dir, device=device, distributed=False).root.train()
        calls = [0]
        _, blocks, layers = model_blocks(root)
        for block in [*blocks, *layers]:
            block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        logp, _ = response_logprobs(root, prompts, responses, mask, pad_token_id=processor.tokenizer.pad_token_id,
                                    banned_ids=vision_token_ids(processor), temperature=1.0, device=device)
        (logp * torch.linspace(-1, 1, logp.numel(), device=device).view_as(logp)).sum().backward()
        grads.append({n: p.grad for n, p in root.named_parameters() if p.grad is not None})
        if calls[0] != len(blocks + layers) * (1 + recompute):
            raise SystemExit(f"gpu-check: {model_dir}: {calls[0]} block calls, recompute={recompute}; expected "
                             f"{len(blocks + layers) * (1 + recompute)}")
    plain, recomputed = grads
    if plain.keys() != recomputed.keys() or not plain:
        raise SystemExit(f"gpu-check: {model_dir}: the recomputed pass gave gradients to other weights")
    return relative_gap([recomputed[n] for n in plain], list(plain.values()))


def mean_step_s(cfg: Config, run_id: str) -> tuple[float, float]:
    """Mean step time over the steps after the first (warm-up), and the first step's time."""
    history = MlflowClient(tracking_uri(cfg.tracking)).get_metric_history(run_id, "timing_s/step")
    times = [m.value for m in sorted(history, key=lambda m: m.step)]
    return statistics.mean(times[1:] or times), times[0]


def main(argv: list[str] | None = None) -> dict[str, float]:
    command = parse_command(__doc__, argv)
    small = check_overrides(command.load())
    cfg = command.load(*small)
    device = torch.device("cuda" if cfg.resources.device == "cuda" else "cpu")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    failed = []
    if check_scoring(device, tokens=1024 if device.type == "cuda" else 128) > TOLERANCE:
        failed.append("chunked scoring")
    data.synthetic(cfg)
    for family in FAMILIES:
        path = build_tiny_vlm(model.task_corpus(cfg), cfg.tiny_model, f"{OUT}/model-{family}", cfg.seed, family)
        gap = check_checkpointing(cfg, str(path), device)
        print(f"gpu-check: activation checkpointing, {family}: max relative gradient difference {gap:.1e}", flush=True)
        if gap > TOLERANCE:
            failed.append(f"activation checkpointing ({family})")
    results = {}
    for run, (family, overrides) in RUNS.items():
        run_cfg = command.load(*small, f"model.path={OUT}/model-{family}", f"trainer.init={OUT}/model-{family}",
                               f"trainer.out_dir={OUT}/{run}", *overrides)
        result = run_rl(run_cfg)
        results[run], first = mean_step_s(run_cfg, result["mlflow_run_id"])
        print(f"gpu-check: {run} on {run_cfg.resources.num_workers} x {name}: {results[run]:.3f} s/step "
              f"(first step {first:.2f} s, {run_cfg.trainer.steps} steps)", flush=True)
    if failed:
        raise SystemExit(f"gpu-check: failed: {', '.join(failed)} (tolerance {TOLERANCE:g})")
    return results


if __name__ == "__main__":
    main()
