"""The driver's reward stage: a plugin that raises or returns NaN scores 0 and is counted."""

import io

import torch
from PIL import Image

from mmrl.config import RewardConfig
from mmrl.trainer.scoring import build_reward_manager, place_on_last_token, score_samples
from mmrl.protocol import Batch


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
    manager = build_reward_manager(RewardConfig(function=f"{plugin}:score", timeout_s=5))
    scores, metrics = score_samples(manager, batch)
    assert scores.tolist() == [2.0, 0.0, 0.0, 1.0]
    assert metrics["reward/num_errors"] == 1 and metrics["reward/num_nan"] == 1


def test_weighted_rewards_from_config():
    batch = Batch(objects={
        "response_text": ["<answer>red</answer>", "red", "<answer>blue</answer>"],
        "answer": ["red"] * 3, "data_source": ["s"] * 3, "images": [[]] * 3, "extra": [{}] * 3,
    })
    manager = build_reward_manager(RewardConfig(weights={"answer_match": 1.0, "format": 0.5}))
    scores, _ = score_samples(manager, batch)
    assert scores.tolist() == [1.5, 1.0, 0.5]


def test_score_goes_on_the_last_response_token():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    placed = place_on_last_token(torch.tensor([2.0, 3.0]), mask)
    assert placed.tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, 3.0]]
