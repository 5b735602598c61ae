"""The driver's reward stage (a plugin that raises or returns NaN scores 0 and is counted), the
per-data_source verifier behind every accuracy, and one call of a function per sample for both."""

import io

import torch
from PIL import Image

import pytest

from mmrl.config import ConfigError, RewardConfig, load_config
from mmrl.protocol import Batch
from mmrl.trainer.reward_stage import (RewardFailure, RewardStage, model_image_size,
                                       reward_inputs, weighted_sum)


def png(rgb) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), rgb).save(buf, format="PNG")
    return buf.getvalue()


def test_plugin_failures_score_zero_and_are_counted(tmp_path):
    plugin = tmp_path / "my_reward.py"
    plugin.write_text(
        "def score(response, ground_truth, images):\n"
        "    if response == 'boom':\n"
        "        raise RuntimeError('plugin bug')\n"
        "    if response == 'nan':\n"
        "        return float('nan')\n"
        "    red = images[0].getpixel((0, 0))[0] / 255\n"
        "    return {'score': float(response == ground_truth) + red, 'red': red}\n"
    )
    images = [png((255, 0, 0))]
    batch = Batch(objects={
        "response_text": ["red", "boom", "nan", "blue"],
        "answer": ["red"] * 4,
        "data_source": ["s"] * 4,
        "images": [images] * 4,
        "extra": [{}] * 4,
    })
    stage = RewardStage(RewardConfig(function=f"{plugin}:score", timeout_s=5, num_workers=1))
    out = stage.score(batch)
    stage.close()
    scores, metrics = out.scores, out.metrics
    assert scores.dtype == torch.float32 and scores.tolist() == [2.0, 0.0, 0.0, 1.0]
    assert metrics["reward/my_reward.score/failures/error"] == 1
    assert metrics["reward/my_reward.score/failures/non_finite"] == 1
    assert metrics["reward/my_reward.score/red"] == 1.0 and metrics["reward/failed_samples"] == 2


def test_weighted_rewards_from_config():
    batch = Batch(objects={
        "response_text": ["<answer>red</answer>", "red", "<answer>blue</answer>"],
        "answer": ["red"] * 3, "data_source": ["s"] * 3, "images": [[]] * 3, "extra": [{}] * 3,
    })
    stage = RewardStage(RewardConfig(weights={"answer_match": 1.0, "format": 0.5}, isolation="inline"))
    out = stage.score(batch)
    assert out.scores.tolist() == [1.5, 1.0, 0.5]
    assert out.correct.tolist() == [1.0, 1.0, 0.0]  # answer_match, the default verifier
    metrics = out.metrics
    assert metrics["reward/answer_match/score"] == pytest.approx(2 / 3) and metrics["reward/format/score"] == pytest.approx(2 / 3)
    assert metrics["reward/score/mean"] == pytest.approx(1.0) == metrics["reward/score/total"]
    assert metrics["train/acc"] == pytest.approx(2 / 3) and metrics["reward/failed_samples"] == 0



def samples(texts, answers, sources):
    n = len(texts)
    return Batch(objects={"response_text": texts, "answer": answers, "data_source": sources,
                          "images": [[]] * n, "extra": [{}] * n})


def test_the_verifier_is_chosen_per_data_source_with_answer_match_by_default(tmp_path):
    plugin = tmp_path / "count_verifier.py"
    # A numeric verifier: "3.0" counts as the answer "3"; it is used for the count task only.
    plugin.write_text("from rewards import extract_answer\n"
                      "def numeric(response, ground_truth):\n"
                      "    got = extract_answer(response)\n"
                      "    try:\n"
                      "        return float(float(got) == float(ground_truth))\n"
                      "    except (TypeError, ValueError):\n"
                      "        return 0.0\n")
    batch = samples(
        ["<answer>3.0</answer>", "<answer>3.0</answer>", "<answer>Red</answer>", "<answer>4</answer>"],
        ["3", "3", "red", "3"],
        ["synthetic/count", "synthetic/colour", "synthetic/colour", "synthetic/count"],
    )
    default = RewardStage(RewardConfig())
    assert default.verify(batch).tolist() == [0.0, 0.0, 1.0, 0.0]  # answer_match everywhere: "3.0" != "3"
    per_source = RewardStage(RewardConfig(verifiers={"synthetic/count": f"{plugin}:numeric"}))
    assert per_source.verify(batch).tolist() == [1.0, 0.0, 1.0, 0.0]
    out = per_source.score(batch)  # the training reward is answer_match's; the verdicts are the same
    assert out.correct.tolist() == [1.0, 0.0, 1.0, 0.0] and out.scores.tolist() == [0.0, 0.0, 1.0, 0.0]
    assert out.metrics["reward/numeric/score"] == 0.5  # over the two count samples it verified
    assert out.metrics["train/acc"] == 0.5
    default.close(), per_source.close()


def test_a_verifier_that_raises_scores_zero_for_that_sample_only(tmp_path):
    plugin = tmp_path / "flaky.py"
    plugin.write_text("def verify(response, ground_truth):\n"
                      "    if 'boom' in response:\n"
                      "        raise ValueError('bad')\n"
                      "    return 1.0\n")
    stage = RewardStage(RewardConfig(verifier=f"{plugin}:verify", num_workers=1))
    batch = samples(["ok", "boom", "ok"], ["a"] * 3, ["s"] * 3)
    assert stage.verify(batch).tolist() == [1.0, 0.0, 1.0]
    out = stage.score(batch)
    assert out.correct.tolist() == [1.0, 0.0, 1.0]
    assert out.metrics["reward/verify/failures/error"] == 1  # a verifier's failures are counted too
    assert out.metrics["reward/failed_samples"] == 0  # not the training reward's: answer_match scored them all
    stage.close()


def test_reward_config():
    with pytest.raises(ConfigError, match="reward.type was renamed: use reward.function"):
        load_config(None, ["reward.type=judge"])
    with pytest.raises(ConfigError, match="reward.function=none leaves nothing to score"):
        load_config(None, ["reward.function=none"])
    load_config(None, ["reward.function=none", "reward.model.path=outputs/rm/checkpoint"])
    with pytest.raises(ConfigError, match="reward.model.llm.strategy=hsdp needs reward.model.llm.shard_size"):
        load_config(None, ["reward.model.llm.strategy=hsdp", "resources.num_workers=2"])


def test_every_sample_failing_for_max_failed_steps_in_a_row_stops_the_run(tmp_path):
    plugin = tmp_path / "broken.py"
    plugin.write_text("def score(response):\n    if response == 'fine':\n        return 1.0\n    raise KeyError('oops')\n")
    stage = RewardStage(RewardConfig(function=f"{plugin}:score", max_failed_steps=2, isolation="inline"))
    bad, mixed = samples(["x", "y"], ["a"] * 2, ["s"] * 2), samples(["x", "fine"], ["a"] * 2, ["s"] * 2)
    stage.score(bad)
    stage.score(mixed)  # one clean sample resets the count
    stage.score(bad)
    with pytest.raises(RewardFailure, match="every sample of the last 2 steps had a failed reward call.*KeyError"):
        stage.score(bad)


def test_weighted_sum_matches_a_plain_loop():
    terms = [(1.0, torch.tensor([1.0, 0.0, 0.25])), (0.5, torch.tensor([2.0, 4.0, -1.0])), (-2.0, torch.tensor([0.1, 0.2, 0.3]))]
    expected = [sum(w * float(s[i]) for w, s in terms) for i in range(3)]
    total = weighted_sum(terms, 3)
    assert total.dtype == torch.float32 and total.tolist() == pytest.approx(expected)
    assert weighted_sum([], 2).tolist() == [0.0, 0.0]


class Scores:
    """A stand-in for a reward-model or judge worker group: fixed scores for every batch."""

    def __init__(self, values: list[float]) -> None:
        self.values = torch.tensor(values)

    def compute_rm_scores(self, batch):
        return {"rm_scores": self.values}

    def judge(self, batch):
        return {"judge_scores": self.values, "judge_parsed": torch.ones(len(self.values)), "judge_text": [""] * len(self.values)}


def test_rules_a_reward_model_and_a_judge_add_up_with_their_weights():
    cfg = RewardConfig(weights={"format": 2.0}, isolation="inline")
    cfg.model.weight, cfg.judge.weight = 0.5, -1.0
    stage = RewardStage(cfg, model=Scores([1.0, 3.0]))
    stage.connect(model=Scores([1.0, 3.0]), judge=Scores([0.0, 1.0]))
    out = stage.score(samples(["<answer>a</answer>", "a"], ["a"] * 2, ["s"] * 2))
    assert out.scores.tolist() == [2.0 + 0.5 * 1.0, 0.0 + 0.5 * 3.0 - 1.0]
    assert out.metrics["reward/score/mean"] == 1.0 and out.metrics["reward/model/score"] == 2.0
    assert out.metrics["reward/judge/score"] == 0.5 and out.metrics["reward/score/total"] == pytest.approx(1.5)
    alone = RewardStage(RewardConfig(function="none", isolation="inline"), model=Scores([1.0, 3.0]))
    out = alone.score(samples(["<answer>a</answer>", "a"], ["a"] * 2, ["s"] * 2))
    assert out.scores.tolist() == [1.0, 3.0] and "reward/score/mean" not in out.metrics
    assert out.correct.tolist() == [1.0, 1.0]  # still verified
    with pytest.raises(ValueError, match="no part"):
        RewardStage(RewardConfig(function="none", isolation="inline")).score(samples(["a"], ["a"], ["s"]))


def test_a_function_that_is_reward_and_verifier_is_called_once_per_sample_in_one_pool(tmp_path):
    calls = tmp_path / "calls.txt"
    plugin = tmp_path / "counted.py"
    plugin.write_text(f"def score(response, ground_truth):\n"
                      f"    with open({str(calls)!r}, 'a') as f:\n"
                      f"        f.write(response + '\\n')\n"
                      f"    return float(response == ground_truth)\n")
    spec = f"{plugin}:score"
    cfg = RewardConfig(weights={spec: 1.0, "format": 0.5}, verifier=spec, verifiers={"other": "answer_match"},
                       num_workers=2, timeout_s=5)
    stage = RewardStage(cfg)
    batch = samples(["a", "b", "<answer>a</answer>", "d"], ["a"] * 4, ["s", "s", "other", "s"])
    out = stage.score(batch)
    assert sorted(calls.read_text().split()) == sorted(["a", "b", "<answer>a</answer>", "d"])  # once each
    assert out.scores.tolist() == [1.0, 0.0, 0.5, 0.0] and out.correct.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert len(stage.manager._pool.pids) == 2  # the run's one pool: rules and verifiers alike
    calls.write_text("")
    assert stage.verify(batch).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert sorted(calls.read_text().split()) == ["a", "b", "d"]  # the "other" sample is answer_match's
    training_only = RewardStage(RewardConfig(function=spec, isolation="inline"))
    calls.write_text("")
    training_only.verify(batch)
    assert calls.read_text() == ""  # verify() computes no training reward
    stage.close()


def test_reward_inputs_carry_the_prompt_the_model_s_image_sizes_and_lengths():
    class Encoded:
        image_grid_thw = torch.tensor([[1, 4, 6], [1, 2, 2]])

    batch = samples(["<answer>a</answer>"], ["a"], ["s"])
    batch.objects["messages"] = [[{"role": "system", "content": "sys"}, {"role": "user", "content": "<image>Q?"}]]
    batch.objects["prompt"] = [Encoded()]
    batch.tensors["response_mask"] = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    (inp,) = reward_inputs(batch, max_response_tokens=4, patch_size=14)
    assert inp.prompt == "<image>Q?" and inp.response_tokens == 3 and inp.max_response_tokens == 4
    assert inp.model_image_sizes == [(84, 56), (28, 28)] == [model_image_size(g, 14) for g in Encoded.image_grid_thw]

    batch.objects["image_grids"] = [[(1, 2, 4)]]  # read before the encoded prompt
    (inp,) = reward_inputs(batch, patch_size=14)
    assert inp.model_image_sizes == [(56, 28)]
    del batch.objects["prompt"]
    assert reward_inputs(batch, patch_size=14)[0].model_image_sizes == [(56, 28)]


def test_a_reward_function_sees_the_prompt_s_video_frames_and_timestamps(tmp_path):
    plugin = tmp_path / "video_reward.py"
    # Rewards naming the colour of the first frame; checks it got the frames in order, with their times.
    plugin.write_text(
        "def score(response, videos):\n"
        "    (clip,) = videos\n"
        "    assert clip.timestamps == [0.0, 0.5]\n"
        "    red = clip.frames[0].getpixel((0, 0))[0] > 128\n"
        "    return float(('red' in response) == red)\n"
    )
    video = {"frames": [png((255, 0, 0)), png((0, 0, 255))], "timestamps": [0.0, 0.5]}
    batch = Batch(objects={
        "response_text": ["red", "blue"], "answer": ["red"] * 2, "data_source": ["v"] * 2,
        "images": [[]] * 2, "videos": [[video]] * 2, "extra": [{}] * 2,
    })
    stage = RewardStage(RewardConfig(function=f"{plugin}:score", timeout_s=5, num_workers=1))
    out = stage.score(batch)
    stage.close()
    assert out.scores.tolist() == [1.0, 0.0] and out.metrics["reward/video_reward.score/failures"] == 0
