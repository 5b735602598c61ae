"""Greedy evaluation: accuracy per data_source (by the configured verifiers), and a table of sample rollouts."""

from __future__ import annotations

import base64
import html
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mmrl.agent.scorecard import ToolUse
from mmrl.config import TrainerConfig
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
    tool_use: ToolUse | None = None
    """How agent episodes used their tools (None for single-turn generation)."""

    def metrics(self, prefix: str = "val") -> dict[str, float]:
        out = {f"{prefix}/{source}/acc": acc for source, acc in self.accuracy.items() if source != "all"}
        out[f"{prefix}/acc"] = self.accuracy["all"]
        return out | (self.tool_use.metrics(f"{prefix}/agent") if self.tool_use is not None else {})

    def table(self) -> dict[str, list[Any]]:
        """Accuracy per data_source (then "all") as table columns: data_source, accuracy, prompts."""
        sources = [*sorted(s for s in self.accuracy if s != "all"), "all"]
        return {"data_source": sources, "accuracy": [self.accuracy[s] for s in sources],
                "prompts": [self.counts[s] for s in sources]}

    def summary(self) -> str:
        parts = [f"{source}={acc:.3f} (n={self.counts[source]})" for source, acc in sorted(self.accuracy.items())]
        tools = ([f"{name.rsplit('/', 1)[1]}={value:.2f}" for name, value in self.tool_use.metrics("x").items()]
                 if self.tool_use is not None else [])
        return "accuracy: " + ", ".join(parts) + (f"; tools: {', '.join(tools)}" if tools else "")


def evaluate(generate: GenerateFn, rows: list[dict[str, Any]], verify: VerifyFn, batch_size: int,
             max_new_tokens: int, num_samples: int = 16) -> EvalResult:
    """Greedy answers for ``rows``; a prompt's accuracy is its verifier score (1 = correct)."""
    params = SamplingParams(n=1, greedy=True, max_new_tokens=max_new_tokens)
    correct: dict[str, list[float]] = defaultdict(list)
    samples: list[dict[str, Any]] = []
    tool_use: ToolUse | None = None
    for start in range(0, len(rows), batch_size):
        batch_rows = rows[start : start + batch_size]
        prompts = rows_to_batch(batch_rows)
        out = generate(prompts, params)
        scores = verify(prompts.union(out.select_fields("response_text"))).tolist()
        episodes = out["episode"] if "episode" in out.objects else [None] * len(out)
        for i, (text, score) in enumerate(zip(out["response_text"], scores)):
            correct[prompts["data_source"][i]].append(score)
            if episodes[i] is not None:
                tool_use = tool_use or ToolUse()
                tool_use.add(batch_rows[i], episodes[i])
            if len(samples) < num_samples:
                samples.append(_sample_row(prompts, i, text, score) | {"episode": episodes[i]})
    every = [s for scores in correct.values() for s in scores]
    accuracy = {source: sum(s) / len(s) for source, s in correct.items()}
    accuracy["all"] = sum(every) / max(len(every), 1)
    counts = {source: len(s) for source, s in correct.items()} | {"all": len(every)}
    return EvalResult(accuracy=accuracy, counts=counts, samples=samples, tool_use=tool_use)


def stops_early(cfg: TrainerConfig, step: int, val_acc: float) -> bool:
    """Whether the run stops after step ``step``'s evaluation (``trainer.stop_val_acc``; never at its last step);
    prints why when it does."""
    stop = 0 < cfg.stop_val_acc <= val_acc and step < cfg.steps
    if stop:
        print(f"stopping at step {step} of {cfg.steps}: val/acc {val_acc:.3f} >= trainer.stop_val_acc "
              f"{cfg.stop_val_acc}", flush=True)
    return stop


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


def _img(png: bytes, width: int = 112) -> str:
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" width="{width}">' if png else ""


def episode_html(episode: dict[str, Any]) -> str:
    """An agent episode's turns in order: the policy's texts, and under each tool turn its calls (the tool, its
    arguments or the call's error, the result's text and images), then the cut if a budget ended it."""
    parts = []
    for turn in episode["turns"]:
        if turn["role"] == "assistant":
            parts.append(f"<div><b>policy</b> <code>{html.escape(turn['text'])}</code></div>")
            continue
        for call in (episode["calls"][i] for i in turn["calls"]):
            what = html.escape(f"{call['name']}({call['arguments']})" if "arguments" in call
                               else f"{call['name'] or '?'}: malformed call ({call['error']})")
            failed = f" <i>failed: {html.escape(call['failure'])}</i>" if call["failure"] else ""
            images = "".join(_img(png, 96) for png in call["images"])
            parts.append(f"<div><b>tool</b> {what}{failed}<br><code>{html.escape(call['text'])}</code>{images}</div>")
    if episode["cut"]:
        parts.append(f"<div><i>cut by {html.escape(episode['cut'])}</i></div>")
    return "".join(parts)


def samples_html(samples: list[dict[str, Any]], title: str) -> str:
    """An HTML table of sample rollouts with their images inlined (an agent episode: every turn, each call and
    the images its tools returned)."""
    rows = []
    for s in samples:
        episode = s.get("episode")
        response = episode_html(episode) if episode else f"<code>{html.escape(s['response'])}</code>"
        rows.append(
            f"<tr><td>{_img(s['image_png'])}</td><td>{html.escape(s['prompt'])}</td><td>{response}"
            f"</td><td>{html.escape(s['answer'])}</td><td>{s['reward']:.2f}</td></tr>"
        )
    head = "<tr><th>image</th><th>prompt</th><th>response</th><th>answer</th><th>reward</th></tr>"
    return f"<html><body><h3>{html.escape(title)}</h3><table border=1>{head}{''.join(rows)}</table></body></html>"
