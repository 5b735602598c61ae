"""Stage ``make demo``: model -> data -> sft -> rl -> eval on the embedded defaults, in one process.

Prints ``demo: sft_acc=X rl_acc=Y rl_steps=N minutes=M`` (test-split accuracies of the SFT and RL
checkpoints), then the config's bar (``bar.*``: the accuracy to reach, the gain over SFT, the RL minutes) and
whether the run met it, and writes ``outputs/demo/summary.json``. A run that misses its bar exits with status 1.
The RL stage starts fresh (``trainer.resume=never``)
unless a checkpoint path is given: the demo rebuilds everything it would resume from.

With ``rollout.agent.enabled`` (``configs/agent_demo.yaml``) the accuracies are of episodes with the run's
tools; the demo then also evaluates both checkpoints with the tools disabled and reports how the episodes used
the tools (calls per episode, the share of zoom calls on the right region).

    python -m pipelines.demo --config configs/demo.yaml
    python -m pipelines.demo --config configs/agent_demo.yaml seed=1
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from mmrl.config import BarConfig
from mmrl.models.loading import load_model
from mmrl.models.tiny import build_tiny_vlm, count_parameters
from mmrl.trainer.eval_checkpoint import run_eval
from mmrl.trainer.run import run_rl
from mmrl.trainer.sft import run_sft
from mmrl.trainer.tracking import redact_uri, tracking_uri
from pipelines import data, model
from pipelines.cli import parse_command

SUMMARY = Path("outputs/demo/summary.json")


def main(argv: list[str] | None = None) -> dict:
    start = time.time()
    command = parse_command(__doc__, argv)
    cfg = command.load()
    stage_s: dict[str, float] = {}

    def timed(name: str, fn, *args, **kwargs):
        t0 = time.time()
        out = fn(*args, **kwargs)
        stage_s[name] = round(time.time() - t0, 1)
        print(f"demo: stage {name} took {stage_s[name]} s", flush=True)
        return out

    path = timed("model", build_tiny_vlm, model.task_corpus(cfg), cfg.tiny_model, cfg.model.path, cfg.seed,
                 cfg.model.family)
    print(f"demo: tiny model with {count_parameters(load_model(path)) / 1e6:.2f} M parameters")
    timed("data", data.synthetic, cfg)
    sft = timed("sft", run_sft, cfg)
    # The demo rebuilds the model, data and SFT policy: an RL checkpoint of an earlier demo is not a resume
    # point for this one. (`make rl` resumes; so does the demo with trainer.resume=<path>.)
    fresh = ["trainer.resume=never"] if cfg.trainer.resume == "auto" else []
    cfg = command.load(f"trainer.init={sft['checkpoint']}", *fresh)
    rl = timed("rl", run_rl, cfg)
    sft_eval = timed("eval_sft", run_eval, cfg, sft["checkpoint"], "eval-sft")
    rl_eval = timed("eval_rl", run_eval, cfg, str(Path(cfg.trainer.out_dir) / "checkpoint"), "eval-rl")
    tools = {}
    if cfg.rollout.agent.enabled:
        plain = command.load(f"trainer.init={sft['checkpoint']}", *fresh, "rollout.agent.enabled=false")
        tools = {"sft_acc_no_tools": timed("eval_sft_no_tools", run_eval, plain, sft["checkpoint"],
                                           "eval-sft-no-tools")["accuracy"]["all"],
                 "rl_acc_no_tools": timed("eval_rl_no_tools", run_eval, plain,
                                          str(Path(cfg.trainer.out_dir) / "checkpoint"), "eval-rl-no-tools")
                 ["accuracy"]["all"],
                 "sft_tool_use": sft_eval["tool_use"], "rl_tool_use": rl_eval["tool_use"]}
    minutes = (time.time() - start) / 60
    summary = {
        "sft_acc": sft_eval["accuracy"]["all"],
        "rl_acc": rl_eval["accuracy"]["all"],
        "rl_steps": rl["steps"],
        "wall_minutes": round(minutes, 2),
        "mlflow_run_id": rl["mlflow_run_id"],
        "mlflow_tracking_uri": redact_uri(tracking_uri(cfg.tracking)),
        "sft_acc_by_source": sft_eval["accuracy"],
        "rl_acc_by_source": rl_eval["accuracy"],
        "stage_seconds": stage_s,
        "seed": cfg.seed,
        **tools,
    }
    summary["bar"] = check_bar(cfg.bar, summary)
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(summary, indent=2))
    print(f"demo: sft_acc={summary['sft_acc']:.3f} rl_acc={summary['rl_acc']:.3f} "
          f"rl_steps={summary['rl_steps']} minutes={minutes:.1f}")
    print(f"demo: bar {summary['bar']['text']}: {'PASS' if summary['bar']['passed'] else 'FAIL'}")
    if tools:
        print(f"demo: without tools sft_acc={tools['sft_acc_no_tools']:.3f} rl_acc={tools['rl_acc_no_tools']:.3f}; "
              f"tool use after sft {_rounded(tools['sft_tool_use'])}, after rl {_rounded(tools['rl_tool_use'])}")
    return summary


def check_bar(bar: BarConfig, summary: dict) -> dict:
    """Whether the run met ``bar``: the bar's values, ``passed``, the misses (``failures``) and a one-line ``text``."""
    rl_minutes = summary["stage_seconds"]["rl"] / 60
    gain = summary["rl_acc"] - summary["sft_acc"]
    checks = [(f"rl_acc>={bar.rl_acc:.2f}", bar.rl_acc > 0, summary["rl_acc"] >= bar.rl_acc, summary["rl_acc"]),
              (f"gain>={bar.gain:+.2f}", bar.gain != 0, gain >= bar.gain, gain),
              (f"rl_minutes<={bar.rl_minutes:.1f}", bar.rl_minutes > 0, rl_minutes <= bar.rl_minutes, rl_minutes)]
    failures = [f"{name} (got {value:.3f})" for name, wanted, met, value in checks if wanted and not met]
    text = " ".join(name for name, wanted, _, _ in checks if wanted) or "none set"
    return {"rl_acc": bar.rl_acc, "gain": bar.gain, "rl_minutes": bar.rl_minutes, "rl_minutes_taken": rl_minutes,
            "passed": not failures, "failures": failures, "text": text}


def _rounded(metrics: dict[str, float]) -> dict[str, float]:
    return {name.rsplit("/", 1)[1]: round(value, 3) for name, value in metrics.items()}


if __name__ == "__main__":
    sys.exit(0 if main()["bar"]["passed"] else 1)
