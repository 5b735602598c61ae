"""mmrl's image sizes and video frames for the Qwen families against qwen-vl-utils' own: its ``smart_resize`` over a
grid of sizes, aspect ratios (extreme ones included) and budgets, and its ``fetch_video`` (decord) on real files
over a grid of durations and frame rates: the same frame indices and the same frame size."""

import io
import itertools

import numpy as np
import pytest
from qwen_vl_utils.vision_process import fetch_image, fetch_video, smart_resize

from data_prep.pixels import fit_pixel_budget, resize_to_budget
from data_prep.synthetic_video import write_mp4
from data_prep.video import VideoLimits, decode_video, plan_sampling
from mmrl.models.families import family_named
from PIL import Image

SIDES = [1, 13, 28, 29, 55, 100, 223, 500, 1000, 1999, 4096]
BUDGETS = [(28 * 28, 28 * 28 * 4), (4 * 28 * 28, 256 * 28 * 28), (56 * 56, 112 * 112), (3136, 12845056)]


@pytest.mark.parametrize("factor", [28, 32])  # Qwen2/2.5-VL (patch 14), Qwen3-VL (patch 16)
def test_image_sizes_equal_smart_resize_wherever_it_gives_a_usable_size(factor):
    usable = fallback = 0
    for (width, height), (lo, hi) in itertools.product(itertools.product(SIDES, SIDES), BUDGETS):
        lo, hi = max(lo, factor * factor), max(hi, factor * factor)
        ours = fit_pixel_budget(width, height, lo, hi, factor, sizing="qwen")
        try:
            new_h, new_w = smart_resize(height, width, factor, min_pixels=lo, max_pixels=hi)
            theirs = (new_w, new_h) if min(new_w, new_h) >= factor and lo <= new_w * new_h <= hi else None
        except ValueError:  # qwen-vl-utils refuses an aspect ratio over 200
            theirs = None
        if theirs is not None:
            assert ours == theirs, (width, height, lo, hi)
            usable += 1
        else:  # where smart_resize has no usable answer, mmrl's own rule gives one in budget
            assert ours[0] % factor == ours[1] % factor == 0 and lo <= ours[0] * ours[1] <= hi, (width, height, lo, hi)
            fallback += 1
    assert usable > 300 and fallback > 10  # both branches are exercised by the grid


def test_a_resized_image_is_what_fetch_image_returns():
    rng = np.random.default_rng(0)
    for width, height in [(100, 37), (640, 480), (30, 900)]:
        image = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
        ours = resize_to_budget(image, 28 * 28 * 4, 28 * 28 * 64, 28, sizing="qwen")
        theirs = fetch_image({"image": image, "min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 64})
        assert ours.size == theirs.size and np.array_equal(np.asarray(ours), np.asarray(theirs)), (width, height)


def test_the_qwen_families_size_by_qwen_vl_utils_and_the_others_by_mmrl():
    assert {name: family_named(name).media_sizing for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "smolvlm")} == {
        "qwen2_vl": "qwen", "qwen2_5_vl": "qwen", "qwen3_vl": "qwen", "smolvlm": "mmrl"}


@pytest.mark.parametrize(("seconds", "native_fps"), [(0.5, 24), (1.0, 10), (2.2, 30), (4.0, 7), (6.5, 25)])
def test_video_frames_and_sizes_equal_fetch_video(tmp_path, seconds, native_fps):
    """Real MP4 files decoded by decord, through qwen-vl-utils' fetch_video and through mmrl's decoder, at three
    sampling rates and two frame budgets: the same frame indices, the same frame size."""
    total = max(2, round(seconds * native_fps))
    frames = [np.full((48, 80, 3), (7 * i) % 256, dtype=np.uint8) for i in range(total)]
    path = tmp_path / "clip.mp4"
    write_mp4(frames, path, native_fps)
    for fps, (frame_max, total_max) in itertools.product([0.5, 2.0, 4.0], [(56 * 84, 8 * 56 * 84), (56 * 56, 4 * 56 * 56)]):
        limits = VideoLimits(min_pixels=28 * 28, frame_max_pixels=frame_max, total_max_pixels=total_max, factor=28,
                             fps=fps, min_frames=2, max_frames=16, sizing="qwen")
        video, meta = fetch_video({"video": str(path), "fps": fps, "min_frames": 2, "max_frames": 16,
                                   "min_pixels": 28 * 28, "max_pixels": frame_max, "total_pixels": total_max},
                                  return_video_metadata=True)
        plan = plan_sampling(meta["total_num_frames"], meta["fps"], 80, 48, limits)
        assert plan.indices == meta["frames_indices"], (fps, frame_max)
        assert (plan.size[1], plan.size[0]) == tuple(video.shape[-2:]), (fps, frame_max)
        stored = decode_video(str(path), limits)  # the decoder mmrl's data prep runs, on the same file
        assert len(stored["frames"]) == len(meta["frames_indices"])
        assert Image.open(io.BytesIO(stored["frames"][0])).size == plan.size
