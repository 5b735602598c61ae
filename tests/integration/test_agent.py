"""Agent rollouts in real runs whose episodes hold tool turns with images (holes in the policy mask): PPO on 2
ranks, scored and trained where they were generated and valued by a critic that gets their contexts with the
samples, with the agent's metrics, the rollout HTML and off-policy guidance (each all-wrong group's guide episode
run with the real tool on the rank that holds its prompt); GRPO in async mode, its episodes run on the rollout pool
and trained on the trainer's rank, through a rollout rank's death mid-episode; and GRPO with LoRA on video prompts,
a reward model and a judge that score each episode whole (the reward model from its context, tool images included;
the judge from its transcript), through a trainer rank's death mid-episode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from data_prep.zoom_task import write_zoom_splits
from mmrl.trainer.dataset import PromptLoader, load_rows
from mmrl.trainer.tracking import Tracker
from mmrl.trainer.rl import RLTrainer
from pipelines import data as data_stage
from benchmarks.probes import DyingEpisodeActor, DyingEpisodeRollout, ScriptedCallsActor, ScriptedCallsRollout


class ScriptedTrainer(RLTrainer):
    actor_worker = ScriptedCallsActor  # decides when the random model calls zoom_in (see script_calls)


class DyingEpisodeTrainer(RLTrainer):
    actor_worker = DyingEpisodeActor  # calls a tool that returns an image; dies mid-episode once


class RecordingTrainer(RLTrainer):
    """Keeps each step's trained samples (``trained``): their uids, weight versions, episode records and tool
    images' grids."""

    def collect(self, prompts):
        batch, metrics = super().collect(prompts)
        self.trained = getattr(self, "trained", [])
        self.trained.append({"uid": list(batch["uid"]), "versions": batch["weight_version"].tolist(),
                             "episodes": list(batch["episode"]), "tool_grids": list(batch["tool_grids"])})
        return batch, metrics


def scripted_async_trainer(cfg, worker: type = ScriptedCallsRollout) -> RecordingTrainer:
    """An async-mode trainer whose rollout pool's ranks (``worker``) decide when the random model calls zoom_in."""
    trainer = RecordingTrainer(cfg)
    trainer.source.worker = worker
    return trainer


@pytest.fixture(scope="module")
def agent_reward_model_dir(turn_ending_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                           random_reward_model) -> Path:
    """The agent runs' policy as a reward model (the same tokenizer) with a random, non-zero head."""
    return random_reward_model(turn_ending_model_dir, tmp_path_factory.mktemp("agent-rm") / "rm")


def agent_config(cfg, model_dir: Path, engine: str = "hf"):
    cfg.model.path = cfg.trainer.init = str(model_dir)
    cfg.rollout.engine = engine
    cfg.rollout.agent.max_new_tokens = 12
    # A reward on the final answer's text that differs within groups, so that the update has advantages.
    cfg.reward.function, cfg.reward.weights = "tests/fixtures/reward_plugins/kinds.py:text_length_parity", {}
    cfg.rollout.agent.enabled = True
    cfg.rollout.agent.tools = ["zoom_in"]  # its block is ~900 tokens of the tiny tokenizer (not trained on it)
    cfg.rollout.agent.max_turns, cfg.rollout.agent.max_tokens = 3, 400
    cfg.rollout.agent.max_pixels = 56 * 56
    cfg.rollout.agent.num_workers = 1
    cfg.trainer.steps, cfg.trainer.val_size, cfg.trainer.eval_every = 2, 4, 0
    cfg.actor.old_log_probs = "recompute"  # so that the rollout's and the trainer's log-probs are compared
    return cfg


def fit(trainer: RLTrainer, name: str, probe=None) -> tuple[Tracker, object]:
    """Run ``trainer`` to its last step under an MLflow run named ``name``; (its tracker, ``probe(trainer)`` taken
    before the workers are shut down)."""
    cfg = trainer.cfg
    tracker = Tracker(cfg, cfg.trainer.experiment, name, stage="rl")
    try:
        trainer.fit(tracker)
        probed = probe(trainer) if probe is not None else None
        tracker.finish()
    finally:
        trainer.close()
    return tracker, probed


def check_episodes_trained(metrics: dict[str, float]) -> None:
    assert metrics["agent/tool_calls/zoom_in"] > 0
    assert metrics["agent/tool_errors"] == 0 and metrics["actor/pg_loss"] != 0
    assert 1 < metrics["agent/turns/mean"] <= 3
    assert metrics["agent/response_tokens/tool/mean"] > 0
    assert metrics["response_length/policy_tokens"] < metrics["response_length/mean"]
    assert metrics["rollout/logprob_diff_max"] < 1e-4  # over the policy's tokens of multi-turn episodes


# vLLM runs the same loop through the engine interface; its run costs a vLLM start: `make test-extra`.
@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.extra)])
def test_ppo_on_two_ranks_trains_and_values_episodes_whose_tool_turns_are_holes(engine, tiny_config,
                                                                               turn_ending_model_dir, tmp_path):
    cfg = agent_config(tiny_config, turn_ending_model_dir, engine)
    cfg.algorithm.name = "ppo"
    cfg.resources.num_workers = 2
    # The zoom task's rows, whose extra["guide"] is the call on the question's cell and the answer; the random
    # policy never answers right, so every group is all wrong and gets its guide episode.
    write_zoom_splits(tmp_path / "zoom", {"train": 8, "val": 4}, seed=0)
    cfg.data.dir, cfg.trainer.guide_unsolved = str(tmp_path / "zoom"), True
    cfg.rollout.agent.max_new_tokens = 96  # the guide's call is 86 tokens of this tokenizer
    tracker, held = fit(ScriptedTrainer(cfg), "agent", lambda trainer: trainer.workers.held_contexts())
    # Each rank scored and trained the episodes it generated, from the contexts it holds (a rank asked for a
    # context it does not hold fails the pass).
    assert all(keys for keys in held) and not set(held[0]) & set(held[1])
    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(tracker.run_id)
    metrics = run.data.metrics
    assert run.info.status == "FINISHED"
    check_episodes_trained(metrics)
    # The critic saw the episodes: a loss, and predictions it moved in this step. (Its values before the step stay 0
    # when step 1's rewards were all 0, as the parity reward of the sampled answers may make them.)
    assert metrics["critic/vf_loss"] > 0 and abs(metrics["critic/vpred_mean"]) > 0
    # A guide ran its call through the real tool on the rank that held its prompt, was verified and trained on
    # (its behaviour log-probs the trainer's own: logprob_diff above stays within 1e-4).
    assert metrics["train/acc"] == 0 and metrics["guide/groups"] == 1 and metrics["guide/rejected"] == 0
    html = Path(client.download_artifacts(run.info.run_id, "rollouts/step_00002.html", str(tmp_path))).read_text()
    assert "<b>tool</b> zoom_in" in html and "data:image/png;base64" in html


def test_async_grpo_trains_on_episodes_the_rollout_pool_ran_through_a_rank_killed_mid_episode(
        tiny_config, turn_ending_model_dir):
    """max_staleness=0: the trainer's rank scores episodes with tool images it never generated (their contexts
    came with the samples) with the weights that drew them, to the engine's log-probs within 1e-4. In step 2 the
    rollout rank kills its process between a policy turn that called zoom_in and its tool turn: the pool is rebuilt
    and the batch generated again whole, on the same weights; nothing of the lost episodes is trained on."""
    cfg = agent_config(tiny_config, turn_ending_model_dir)
    cfg.trainer.mode, cfg.trainer.max_staleness = "async", 0
    trainer = scripted_async_trainer(cfg, DyingEpisodeRollout)
    tracker, _ = fit(trainer, "agent-async")
    died = json.loads((Path(cfg.trainer.out_dir) / "rollout_died_mid_episode").read_text())
    assert died["version"] == 1  # step 2's batch
    # Mid-episode: an episode had called the tool and had one tool turn fewer than policy turns.
    assert any(calls and policy == tools + 1
               for calls, policy, tools in zip(died["pending_calls"], died["policy_turns"], died["tool_turns"]))
    assert trainer.source.rollout_restarts == 1 and trainer.restarts == 0  # the pool was replaced, the trainer went on
    # Each step trained one whole batch, the loader's next, drawn by the trainer's current weights.
    loader = PromptLoader(load_rows(cfg.data.dir, "train"), cfg.trainer.prompts_per_step, cfg.seed)
    assert [list(dict.fromkeys(r["uid"])) for r in trainer.trained] == [list(loader.next_batch()["uid"])
                                                                          for _ in range(2)]
    assert all(len(r["uid"]) == cfg.trainer.prompts_per_step * cfg.rollout.n for r in trainer.trained)
    assert [set(r["versions"]) for r in trainer.trained] == [{0}, {1}]
    # The redone episodes returned tool images, and were trained on.
    images = [len(c["images"]) for e in trainer.trained[1]["episodes"] for c in e["calls"]]
    assert images and all(n == 1 for n in images)
    # The FLOP account sees each episode's own tool images (mmrl.perf.flops).
    assert [len(g) for g in trainer.trained[1]["tool_grids"]] == [
        sum(len(c["images"]) for c in e["calls"]) for e in trainer.trained[1]["episodes"]]
    client = MlflowClient(cfg.tracking.uri)
    metrics = client.get_run(tracker.run_id).data.metrics
    check_episodes_trained(metrics)
    assert metrics["async/staleness_max"] == 0 and metrics["async/rollout_restarts"] == 1
    history = client.get_metric_history(tracker.run_id, "rollout/logprob_diff_max")
    assert len(history) == 2 and all(p.value < 1e-4 for p in history)


def test_lora_agent_episodes_on_video_prompts_recover_from_a_rank_killed_mid_episode(tiny_config, turn_ending_model_dir,
                                                                                      agent_reward_model_dir, tmp_path):
    """Video prompts whose episodes get image turns from a tool, a LoRA policy, a reward model and a judge beside the
    rule reward, and a rank that dies between a policy turn and its tool turn in step 2: the driver rebuilds the
    groups from step 1's checkpoint and finishes, the rollout's and the trainer's log-probs agreeing within 1e-4 on
    those episodes."""
    data_stage.main(["--config", "", f"data.dir={tmp_path / 'video'}", "data.tasks={first_colour: 1.0}",
                     "data.sizes={train: 8, val: 4}", "data.video_size=56"])
    cfg = agent_config(tiny_config, turn_ending_model_dir)
    cfg.data.dir = str(tmp_path / "video")
    cfg.rollout.agent.tools = ["zoom_in", "tests/fixtures/agent_tools/faulty.py:misbehave"]
    cfg.actor.lora.rank, cfg.actor.lora.alpha = 4, 8.0
    cfg.reward.model.path, cfg.reward.model.weight = str(agent_reward_model_dir), 0.5
    cfg.reward.judge.path, cfg.reward.judge.max_new_tokens = str(turn_ending_model_dir), 4
    cfg.trainer.steps, cfg.trainer.save_every = 2, 1
    trainer = DyingEpisodeTrainer(cfg)
    tracker, _ = fit(trainer, "agent-recovery")
    assert (Path(cfg.trainer.out_dir) / "agent_rank_died").is_file()  # it died, mid-episode
    assert trainer.restarts == 1 and trainer.step_no == 2
    client = MlflowClient(cfg.tracking.uri)
    (restart,) = client.get_metric_history(tracker.run_id, "trainer/restarts")
    assert restart.step == 2  # step 2 ran again, from step 1's checkpoint
    metrics = client.get_run(tracker.run_id).data.metrics
    assert metrics["agent/tool_calls/misbehave"] > 0 and metrics["agent/tool_errors"] == 0
    assert metrics["rollout/logprob_diff_max"] < 1e-4  # video pixels, then the tool's images, in one episode
    assert metrics["actor/pg_loss"] != 0
    # The reward model scored every episode from its context (tool images included; a context missing on its rank
    # fails the pass) and the judge read each transcript; the training reward is their weighted sum with the rule's.
    parts = metrics["reward/score/mean"] + 0.5 * metrics["reward/model/score"] + metrics["reward/judge/score"]
    assert metrics["reward/model/std"] > 0 and metrics["reward/score/total"] == pytest.approx(parts, abs=1e-5)
