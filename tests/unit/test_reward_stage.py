"""The driver's reward stage (a plugin that raises or returns NaN scores 0 and is counted) and the
per-data_source verifier behind every accuracy."""

import io

import torch
from PIL import Image

import pytest

from mmrl.config import ConfigError, RewardConfig, load_config
from mmrl.protocol import Batch
from mmrl.trainer.reward_stage import (CombinedReward, RewardFailure, RuleReward, Verifier, model_image_size,
                                       place_on_last_token, reward_inputs)


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
    stage = RuleReward(RewardConfig(function=f"{plugin}:score", timeout_s=5, num_workers=1))
    scores, metrics = stage.score(batch)
    stage.close()
    assert scores.tolist() == [2.0, 0.0, 0.0, 1.0]
    assert metrics["reward/my_reward.score/failures/error"] == 1
    assert metrics["reward/my_reward.score/failures/non_finite"] == 1
    assert metrics["reward/my_reward.score/red"] == 1.0 and metrics["reward/failed_samples"] == 2


def test_weighted_rewards_from_config():
    batch = Batch(objects={
        "response_text": ["<answer>red</answer>", "red", "<answer>blue</answer>"],
        "answer": ["red"] * 3, "data_source": ["s"] * 3, "images": [[]] * 3, "extra": [{}] * 3,
    })
    stage = RuleReward(RewardConfig(weights={"answer_match": 1.0, "format": 0.5}, isolation="inline"))
    scores, metrics = stage.score(batch)
    assert scores.tolist() == [1.5, 1.0, 0.5]
    assert metrics["reward/answer_match/score"] == pytest.approx(2 / 3) and metrics["reward/format/score"] == pytest.approx(2 / 3)


def test_score_goes_on_the_last_response_token():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    placed = place_on_last_token(torch.tensor([2.0, 3.0]), mask)
    assert placed.tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, 3.0]]


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
    default = Verifier(RewardConfig())
    assert default.correct(batch) == [0.0, 0.0, 1.0, 0.0]  # answer_match everywhere: "3.0" != "3"
    per_source = Verifier(RewardConfig(verifiers={"synthetic/count": f"{plugin}:numeric"}))
    assert per_source.correct(batch) == [1.0, 0.0, 1.0, 0.0]


def test_a_verifier_that_raises_scores_zero_for_that_sample_only(tmp_path):
    plugin = tmp_path / "flaky.py"
    plugin.write_text("def verify(response, ground_truth):\n"
                      "    if 'boom' in response:\n"
                      "        raise ValueError('bad')\n"
                      "    return 1.0\n")
    verifier = Verifier(RewardConfig(verifier=f"{plugin}:verify"))
    assert verifier.correct(samples(["ok", "boom", "ok"], ["a"] * 3, ["s"] * 3)) == [1.0, 0.0, 1.0]


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
    stage = RuleReward(RewardConfig(function=f"{plugin}:score", max_failed_steps=2, isolation="inline"))
    bad, mixed = samples(["x", "y"], ["a"] * 2, ["s"] * 2), samples(["x", "fine"], ["a"] * 2, ["s"] * 2)
    stage.score(bad)
    stage.score(mixed)  # one clean sample resets the count
    stage.score(bad)
    with pytest.raises(RewardFailure, match="every sample of the last 2 steps had a failed reward call.*KeyError"):
        stage.score(bad)


class Constant:
    def __init__(self, values: list[float], name: str) -> None:
        self.values, self.name = values, name

    def score(self, batch):
        return torch.tensor(self.values), {f"reward/{self.name}/score": sum(self.values) / len(self.values)}


def test_parts_combine_with_their_weights():
    combined = CombinedReward([("a", 1.0, Constant([1.0, 0.0], "a")), ("b", 0.5, Constant([2.0, 4.0], "b"))])
    scores, metrics = combined.score(samples(["x", "y"], ["a"] * 2, ["s"] * 2))
    assert scores.tolist() == [2.0, 2.0]
    assert metrics == {"reward/a/score": 0.5, "reward/b/score": 3.0, "reward/score/total": 2.0}
    with pytest.raises(ValueError, match="no part"):
        CombinedReward([])


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
    stage = RuleReward(RewardConfig(function=f"{plugin}:score", timeout_s=5, num_workers=1))
    scores, metrics = stage.score(batch)
    stage.close()
    assert scores.tolist() == [1.0, 0.0] and metrics["reward/video_reward.score/failures"] == 0
