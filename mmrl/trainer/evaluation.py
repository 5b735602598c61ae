"""Greedy evaluation: accuracy per data_source (by the configured verifiers), and a table of sample rollouts."""

from __future__ import annotations

import base64
import html
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mmrl.protocol import Batch
from mmrl.rollout.base import SamplingParams
from mmrl.trainer.dataset import rows_to_batch
from rewards import prompt_text

GenerateFn = Callable[[Batch, SamplingParams], Batch]
VerifyFn = Callable[[Batch], torch.Tensor]  # samples -> (B,) verdicts, 1 = correct (RewardStage.verify)


@dataclass
class EvalResult:
    accuracy: dict[str, float]
    """data_source -> share of prompts answered correctly; "all" over every prompt."""
    counts: dict[str, int]
    samples: list[dict[str, Any]] = field(default_factory=list)

    def metrics(self, prefix: str = "val") -> dict[str, float]:
        out = {f"{prefix}/{source}/acc": acc for source, acc in self.accuracy.items() if source != "all"}
        out[f"{prefix}/acc"] = self.accuracy["all"]
        return out

    def summary(self) -> str:
        parts = [f"{source}={acc:.3f} (n={self.counts[source]})" for source, acc in sorted(self.accuracy.items())]
        return "accuracy: " + ", ".join(parts)


def evaluate(generate: GenerateFn, rows: list[dict[str, Any]], verify: VerifyFn, batch_size: int,
             max_new_tokens: int, num_samples: int = 16) -> EvalResult:
    """Greedy answers for ``rows``; a prompt's accuracy is its verifier score (1 = correct)."""
    params = SamplingParams(n=1, greedy=True, max_new_tokens=max_new_tokens)
    correct: dict[str, list[float]] = defaultdict(list)
    samples: list[dict[str, Any]] = []
    for start in range(0, len(rows), batch_size):
        prompts = rows_to_batch(rows[start : start + batch_size])
        out = generate(prompts, params)
        scores = verify(prompts.union(out.select_fields("response_text"))).tolist()
        for i, (text, score) in enumerate(zip(out["response_text"], scores)):
            correct[prompts["data_source"][i]].append(score)
            if len(samples) < num_samples:
                samples.append(_sample_row(prompts, i, text, score))
    every = [s for scores in correct.values() for s in scores]
    accuracy = {source: sum(s) / len(s) for source, s in correct.items()}
    accuracy["all"] = sum(every) / max(len(every), 1)
    counts = {source: len(s) for source, s in correct.items()} | {"all": len(every)}
    return EvalResult(accuracy=accuracy, counts=counts, samples=samples)


def _sample_row(prompts: Batch, i: int, response: str, reward: float) -> dict[str, Any]:
    """One row of the rollout table; its picture is the first image, else the first frame of the first video."""
    videos = prompts["videos"][i] if "videos" in prompts.objects else []
    picture = prompts["images"][i][0] if prompts["images"][i] else (videos[0]["frames"][0] if videos else b"")
    return {
        "prompt": prompt_text(prompts["messages"][i]),
        "image_png": picture,
        "response": response,
        "answer": prompts["answer"][i],
        "reward": reward,
        "data_source": prompts["data_source"][i],
    }


def samples_table(samples: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Columns for ``mlflow.log_table`` (images left out)."""
    keys = ["data_source", "prompt", "response", "answer", "reward"]
    return {k: [s[k] for s in samples] for k in keys}


def samples_html(samples: list[dict[str, Any]], title: str) -> str:
    """An HTML table of sample rollouts with their images inlined."""
    rows = []
    for s in samples:
        img = base64.b64encode(s["image_png"]).decode() if s["image_png"] else ""
        cell = f'<img src="data:image/png;base64,{img}" width="112">' if img else ""
        rows.append(
            f"<tr><td>{cell}</td><td>{html.escape(s['prompt'])}</td><td><code>{html.escape(s['response'])}</code>"
            f"</td><td>{html.escape(s['answer'])}</td><td>{s['reward']:.2f}</td></tr>"
        )
    head = "<tr><th>image</th><th>prompt</th><th>response</th><th>answer</th><th>reward</th></tr>"
    return f"<html><body><h3>{html.escape(title)}</h3><table border=1>{head}{''.join(rows)}</table></body></html>"
