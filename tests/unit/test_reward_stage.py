"""The driver's reward stage (a plugin that raises or returns NaN scores 0 and is counted) and the
per-data_source verifier behind every accuracy."""

import io

import torch
from PIL import Image

import pytest

from mmrl.config import ConfigError, RewardConfig, load_config
from mmrl.protocol import Batch
from mmrl.trainer.reward_stage import REWARD_STAGES, Verifier, build_reward_stage, place_on_last_token


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
    scores, metrics = build_reward_stage(RewardConfig(function=f"{plugin}:score", timeout_s=5)).score(batch)
    assert scores.tolist() == [2.0, 0.0, 0.0, 1.0]
    assert metrics["reward/num_errors"] == 1 and metrics["reward/num_nan"] == 1


def test_weighted_rewards_from_config():
    batch = Batch(objects={
        "response_text": ["<answer>red</answer>", "red", "<answer>blue</answer>"],
        "answer": ["red"] * 3, "data_source": ["s"] * 3, "images": [[]] * 3, "extra": [{}] * 3,
    })
    scores, _ = build_reward_stage(RewardConfig(weights={"answer_match": 1.0, "format": 0.5})).score(batch)
    assert scores.tolist() == [1.5, 1.0, 0.5]


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


def test_reward_stage_table_and_config():
    assert set(REWARD_STAGES) == {"function"}
    with pytest.raises(ConfigError, match="reward.type='judge' is unknown; allowed: function"):
        load_config(None, ["reward.type=judge"])


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
    scores, metrics = build_reward_stage(RewardConfig(function=f"{plugin}:score", timeout_s=5)).score(batch)
    assert scores.tolist() == [1.0, 0.0] and metrics["reward/num_errors"] == 0
