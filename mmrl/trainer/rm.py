"""``make rm``: a VLM reward model trained on preference pairs with the Bradley-Terry loss.

The reward model is the policy's backbone (from ``rm.init``, the SFT policy by default) with a scalar head
that starts at zero, scoring a whole (prompt, media, response) on its last token. For a pair it is trained
to score the chosen response above the rejected one:

    loss = -log sigmoid(r(prompt, chosen) - r(prompt, rejected))

Runs in-process on one rank, like SFT. Held-out pairwise accuracy (the share of val pairs scored the right
way round) is printed and logged to MLflow; the checkpoint is the backbone in Hugging Face format plus
``value_head.safetensors``, what ``reward.model.path`` loads.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mmrl.config import Config
from mmrl.controller.worker import resolve_device
from mmrl.models.encoding import EncodedPrompt, collate
from mmrl.models.loading import load_model, load_processor, save_checkpoint
from mmrl.trainer.preference_pairs import PreferencePair, read_pairs
from mmrl.rollout.samples import encode_rows
from mmrl.trainer.tracking import Tracker
from mmrl.trainer.dataset import load_rows, rows_to_batch
from mmrl.trainer.sft import pad_targets
from mmrl.trainer.supervised import train_steps
from mmrl.workers.model_builder import build_model


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """chosen, rejected: (B,) scores -> mean of -log sigmoid(chosen - rejected), a scalar."""
    return -F.logsigmoid(chosen - rejected).mean()


def response_ids(tokenizer: Any, text: str) -> torch.Tensor:
    """A response as the policy would emit it: its tokens, then the end-of-turn token; (T,) int64."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.tensor([*ids, tokenizer.eos_token_id], dtype=torch.long)


def load_pairs(path: str, key: str, rows: list[dict[str, Any]]) -> list[PreferencePair]:
    """The pairs of the file ``path`` (the value of config key ``key``), whose prompts are rows of ``rows``."""
    if not path:
        raise ValueError(f"{key} is empty: give a pairs file, or run the make rm stage (pipelines.rm), which "
                         "writes synthetic pairs made from the split's labels when it is empty")
    return read_pairs(Path(path), {str(r["id"]) for r in rows})


class RMTrainer:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.resources.device)
        self.processor = load_processor(cfg.rm.init)
        self.tokenizer = self.processor.tokenizer
        torch.manual_seed(cfg.seed)
        self.model = load_model(cfg.rm.init, cfg.model.dtype, cfg.model.attn_implementation, self.device,
                           cfg.model.compile)
        self.layout = build_model(cfg, "rm_trainee", cfg.rm.init, device=self.device, distributed=False,
                                  model=self.model)
        self.root = self.layout.root  # ValueModel sharing self.model's backbone
        train_rows = load_rows(cfg.data.dir, "train")
        val_rows = load_rows(cfg.data.dir, "val")
        self.train_pairs = load_pairs(cfg.rm.train_pairs, "rm.train_pairs", train_rows)
        self.val_pairs = load_pairs(cfg.rm.val_pairs, "rm.val_pairs", val_rows)[: cfg.rm.eval_pairs]
        self.prompts = self.encode(train_rows, self.train_pairs) | self.encode(val_rows, self.val_pairs)

    def encode(self, rows: list[dict[str, Any]], pairs: list[PreferencePair]) -> dict[str, EncodedPrompt]:
        """The encoded prompts the pairs refer to, by row id."""
        wanted = {p.prompt_id for p in pairs}
        rows = [r for r in rows if str(r["id"]) in wanted]
        return dict(zip((str(r["id"]) for r in rows), encode_rows(self.processor, rows_to_batch(rows))))

    def scores(self, pairs: list[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) scores of the chosen and (B,) of the rejected responses, in one forward."""
        prompts = [self.prompts[p.prompt_id] for p in pairs] * 2
        texts = [p.chosen for p in pairs] + [p.rejected for p in pairs]
        ids, mask = pad_targets([response_ids(self.tokenizer, t) for t in texts], self.tokenizer.pad_token_id)
        inputs = collate(prompts, self.tokenizer.pad_token_id, ids, mask, share_media=True)
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        out = self.root.sequence_scores(inputs, ids.shape[1], mask.sum(-1).long())
        return out[: len(pairs)], out[len(pairs):]

    def train(self, tracker: Tracker) -> None:
        self.root.train()
        train_steps("rm", self.cfg.rm, self.layout.trainable(), len(self.train_pairs), self.cfg.seed, self.step_loss,
                    tracker)

    def step_loss(self, indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        """The Bradley-Terry loss of the chosen pairs and their pairwise accuracy."""
        chosen, rejected = self.scores([self.train_pairs[i] for i in indices])
        return bradley_terry_loss(chosen, rejected), {"train_pairwise_acc": float((chosen > rejected).float().mean())}

    @torch.no_grad()
    def evaluate(self, pairs: list[PreferencePair], batch_size: int = 32) -> dict[str, float]:
        """Pairwise accuracy (ties count as wrong) and mean margin on ``pairs``, overall and per kind."""
        self.root.eval()
        right: dict[str, list[float]] = defaultdict(list)
        margins = []
        for start in range(0, len(pairs), batch_size):
            batch = pairs[start : start + batch_size]
            chosen, rejected = self.scores(batch)
            for pair, c, r in zip(batch, chosen.tolist(), rejected.tolist()):
                right["all"].append(float(c > r))
                right[pair.kind or "unknown"].append(float(c > r))
                margins.append(c - r)
        out = {f"rm/val_pairwise_acc/{kind}": sum(v) / len(v) for kind, v in right.items() if kind != "all"}
        out["rm/val_pairwise_acc"] = sum(right["all"]) / len(right["all"])
        out["rm/val_margin"] = sum(margins) / len(margins)
        return out

    def save(self) -> Path:
        path = save_checkpoint(self.model, self.processor, Path(self.cfg.rm.out_dir) / "checkpoint")
        self.root.save_head(path)
        return path


def run_rm(cfg: Config) -> dict[str, Any]:
    """The ``make rm`` stage: train, report held-out pairwise accuracy, save ``<rm.out_dir>/checkpoint``."""
    trainer = RMTrainer(cfg)
    tracker = Tracker(cfg, cfg.trainer.experiment, "rm", stage="rm")
    try:
        before = trainer.evaluate(trainer.val_pairs)["rm/val_pairwise_acc"]
        trainer.train(tracker)
        metrics = trainer.evaluate(trainer.val_pairs)
        tracker.log_metrics(metrics, cfg.rm.steps)
        path = trainer.save()
        tracker.log_text(str(path), "checkpoint_path.txt")
        tracker.finish()
    except BaseException:
        tracker.finish("FAILED")
        raise
    kinds = ", ".join(f"{k.rsplit('/', 1)[1]} {v:.3f}" for k, v in metrics.items() if k.count("/") == 2)
    print(f"rm: held-out pairwise accuracy {before:.3f} -> {metrics['rm/val_pairwise_acc']:.3f} "
          f"({len(trainer.val_pairs)} pairs; {kinds}) -> {path}")
    return {"checkpoint": str(path), "val_pairwise_acc": metrics["rm/val_pairwise_acc"], "before": before,
            "mlflow_run_id": tracker.run_id}
