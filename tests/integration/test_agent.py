"""Agent rollouts in a real run: GRPO on 2 ranks whose episodes hold tool turns with images (holes in the
policy mask), scored and trained where they were generated, with the agent's metrics and the rollout HTML."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from mmrl.models.encoding import collate, encode_prompt
from mmrl.models.loading import load_model, load_processor

from mmrl.tracking import Tracker
from mmrl.trainer.rl import RLTrainer
from pipelines.probes import ScriptedCallsActor


class ScriptedTrainer(RLTrainer):
    actor_worker = ScriptedCallsActor  # decides when the random model calls zoom_in (see its docstring)


def turn_ending_model(model_dir: Path, out: Path, scale: float = 2.0) -> Path:
    """The tiny model with its end-of-turn token's head row along its typical final state: its turns end
    after a few tokens (a random model's rarely end at all), so that episodes go on after tool turns."""
    model, processor = load_model(str(model_dir)), load_processor(str(model_dir))
    prompt = encode_prompt(processor, [{"role": "user", "content": "What colour is it?"}], [])
    with torch.no_grad():
        states = model(**collate([prompt], processor.tokenizer.pad_token_id), output_hidden_states=True)
        final = states.hidden_states[-1][0].mean(0)
        model.lm_head.weight[processor.tokenizer.eos_token_id] = scale * final / final.norm()
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


# vLLM runs the same loop through the engine interface; its run costs a vLLM start: `make test-extra`.
@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.extra)])
def test_grpo_on_two_ranks_trains_on_episodes_whose_tool_turns_are_holes(engine, tiny_config, vllm_model_dir, tmp_path):
    cfg = tiny_config
    cfg.model.path = cfg.trainer.init = str(turn_ending_model(vllm_model_dir, tmp_path / "model"))
    cfg.rollout.engine = engine
    cfg.rollout.agent.max_new_tokens = 12
    # A reward on the final answer's text that differs within groups, so that the update has advantages.
    cfg.reward.function, cfg.reward.weights = "tests/fixtures/reward_plugins/kinds.py:text_length_parity", {}
    cfg.rollout.agent.enabled = True
    cfg.rollout.agent.tools = ["zoom_in"]  # its block is ~900 tokens of the tiny tokenizer (not trained on it)
    cfg.rollout.agent.max_turns, cfg.rollout.agent.max_tokens = 3, 400
    cfg.rollout.agent.max_pixels = 56 * 56
    cfg.rollout.agent.num_workers = 1
    cfg.resources.num_workers = 2
    cfg.trainer.steps, cfg.trainer.val_size, cfg.trainer.eval_every = 2, 4, 0
    cfg.actor.old_log_probs = "recompute"  # so that the rollout's and the trainer's log-probs are compared
    trainer = ScriptedTrainer(cfg)
    tracker = Tracker(cfg, cfg.trainer.experiment, "agent", stage="rl")
    try:
        trainer.fit(tracker)
        held = trainer.workers.held_contexts()
        tracker.finish()
    finally:
        trainer.close()
    # Each rank scored and trained the episodes it generated, from the contexts it holds (a rank asked for a
    # context it does not hold fails the pass).
    assert all(keys for keys in held) and not set(held[0]) & set(held[1])
    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(tracker.run_id)
    metrics = run.data.metrics
    assert run.info.status == "FINISHED"
    assert metrics["agent/tool_calls/zoom_in"] > 0
    assert metrics["agent/tool_errors"] == 0 and metrics["critic/flat_groups"] < 1 and metrics["actor/pg_loss"] != 0
    assert 1 < metrics["agent/turns/mean"] <= 3
    assert metrics["agent/response_tokens/tool/mean"] > 0
    assert metrics["response_length/policy_tokens"] < metrics["response_length/mean"]
    assert metrics["rollout/logprob_diff_max"] < 1e-4  # over the policy's tokens of multi-turn episodes
    html = Path(client.download_artifacts(run.info.run_id, "rollouts/step_00002.html", str(tmp_path))).read_text()
    assert "<b>tool</b> zoom_in" in html and "data:image/png;base64" in html

