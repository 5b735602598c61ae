"""Video data prep: sampling plans by hand, real MP4 files through the converter (decord in a child
process), and every bad-video case with its named outcome."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_prep.convert import convert_jsonl
from data_prep.records import ImageLimits, RowConverter
from data_prep.rejects import RowRejected
from data_prep.synthetic import VideoSynthesis, build_splits
from data_prep.synthetic_video import COLOURS, ClipSpec, write_mp4
from data_prep.video import VideoLimits, VideoReader, plan_sampling
from mmrl.schema import decode_video, read_parquet

LIMITS = VideoLimits(min_pixels=28 * 28, frame_max_pixels=56 * 56, total_max_pixels=8 * 56 * 56, factor=28,
                     fps=2.0, min_frames=2, max_frames=8, max_seconds=60.0, timeout_s=60.0)


def clip(path: Path, frames: int, fps: float = 2.0, size: tuple[int, int] = (56, 56)) -> Path:
    """A real MP4 whose frame i is filled with grey level 20 * i (so frames can be told apart)."""
    arrays = [np.full((size[1], size[0], 3), 20 * (i % 12), np.uint8) for i in range(frames)]
    write_mp4(arrays, path, fps)
    return path


@pytest.mark.parametrize("frames,fps,size,expected_indices,expected_size,down", [
    (4, 2.0, (56, 56), [0, 1, 2, 3], (56, 56), False),  # 2 s at 2 fps: every frame
    (40, 10.0, (56, 56), [0, 6, 11, 17, 22, 28, 33, 39], (56, 56), False),  # 4 s x 2 fps = 8, every 39/7
    (200, 10.0, (112, 112), [0, 28, 57, 85, 114, 142, 171, 199], (56, 56), True),  # 20 s: 40 wanted, 8 kept
    (7, 2.0, (56, 56), [0, 1, 2, 4, 5, 6], (56, 56), True),  # 7 frames: even count, 6
])
def test_sampling_plans_by_hand(frames, fps, size, expected_indices, expected_size, down):
    plan = plan_sampling(frames, fps, size[0], size[1], LIMITS)
    assert plan.indices == expected_indices and plan.size == expected_size and plan.sampled_down is down


def test_the_total_budget_shrinks_frames_before_dropping_them():
    tight = VideoLimits(min_pixels=28 * 28, frame_max_pixels=112 * 112, total_max_pixels=4 * 56 * 56, factor=28,
                        max_frames=4)
    plan = plan_sampling(8, 2.0, 112, 112, tight)  # 4 frames wanted; 4 x 112^2 is over budget: 56x56 each
    assert len(plan.indices) == 4 and plan.size == (56, 56)
    fewer = VideoLimits(min_pixels=56 * 56, frame_max_pixels=112 * 112, total_max_pixels=2 * 56 * 56, factor=28)
    plan = plan_sampling(8, 2.0, 112, 112, fewer)  # frames cannot shrink below 56x56: 2 frames only
    assert len(plan.indices) == 2 and plan.size == (56, 56) and plan.sampled_down


def test_a_real_mp4_is_sampled_and_stored_with_timestamps(tmp_path):
    with VideoReader(LIMITS) as reader:
        stored = reader.read(clip(tmp_path / "a.mp4", frames=6, fps=2.0))
    assert stored["timestamps"] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5] and not stored["sampled_down"]
    video = decode_video(stored)
    greys = [int(np.asarray(f)[28, 28, 0]) for f in video.frames]
    assert all(abs(g - 20 * i) <= 3 for i, g in enumerate(greys)), greys  # H.264 is near-lossless here
    assert video.fps == pytest.approx(2.0) and video.frames[0].size == (56, 56)


class CrashOnArrival:
    """Limits whose unpickling kills the decoder process: a decoder crash, for real."""

    timeout_s = 30.0

    def __reduce__(self):
        return (os._exit, (3,))


def test_a_crashed_or_hung_decoder_costs_one_video_and_is_restarted(tmp_path):
    good = clip(tmp_path / "good.mp4", frames=4)
    crashing = VideoReader(CrashOnArrival())  # type: ignore[arg-type]
    with pytest.raises(RowRejected) as crash:
        crashing.read(good)
    assert crash.value.kind == "decoder_crashed" and "exit code 3" in str(crash.value)
    crashing.close()
    impatient = VideoReader(VideoLimits(**{**LIMITS.__dict__, "timeout_s": 1e-3}))
    with pytest.raises(RowRejected) as hang:
        impatient.read(good)  # the child has not even started
    assert hang.value.kind == "video_timeout"
    impatient.limits = LIMITS
    assert len(impatient.read(good)["frames"]) == 4  # a fresh decoder took over
    impatient.close()


def audio_only_mp4(path: Path) -> Path:
    """An MP4 whose video stream received no frames (only audio was written)."""
    import av

    with av.open(str(path), mode="w") as container:
        video = container.add_stream("libx264", rate=2)
        video.width = video.height = 56
        video.pix_fmt = "yuv420p"
        audio = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for stream, item in ((audio, frame), (audio, None), (video, None)):
            for packet in stream.encode(item):
                container.mux(packet)
    return path


def test_bad_videos_are_quarantined_with_their_reason_and_long_ones_sampled_down(tmp_path):
    media = tmp_path / "media"
    good = clip(media / "good.mp4", frames=4)
    truncated = media / "truncated.mp4"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (media / "not_a_video.mp4").write_bytes(os.urandom(4000))
    (media / "empty.mp4").write_bytes(b"")
    audio_only_mp4(media / "no_frames.mp4")
    clip(media / "long.mp4", frames=60, fps=2.0)  # 30 s: 60 frames wanted, max_frames=8 kept
    clip(media / "too_long.mp4", frames=150, fps=2.0)  # 75 s, over max_seconds=60
    (media / "pic.png").write_bytes(b"")
    Image.new("RGB", (56, 56), (10, 200, 30)).save(media / "pic.png")
    lines = [
        {"prompt": "Which colour first?", "video": "good.mp4", "answer": "red"},
        {"prompt": "<image> then <video>: same?", "image": "pic.png", "video": "long.mp4", "answer": "no"},
        {"prompt": "x", "video": "truncated.mp4", "answer": "a"},
        {"prompt": "x", "video": "not_a_video.mp4", "answer": "a"},
        {"prompt": "x", "video": "empty.mp4", "answer": "a"},
        {"prompt": "x", "video": "no_frames.mp4", "answer": "a"},
        {"prompt": "x", "video": "too_long.mp4", "answer": "a"},
        {"prompt": "x", "video": "missing.mp4", "answer": "a"},
        {"prompt": "x", "video": "../outside.mp4", "answer": "a"},
        {"prompt": "<video><video>", "video": "good.mp4", "answer": "a"},
    ]
    expected = ["corrupt_video", "corrupt_video", "empty_file", "empty_video", "video_too_long", "missing_file",
                "outside_image_dir", "placeholder_mismatch"]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    report = convert_jsonl(tmp_path / "data.jsonl", media, tmp_path / "out" / "rows.parquet",
                           tmp_path / "out" / "q.jsonl", min_pixels=28 * 28, max_pixels=56 * 56, video_limits=LIMITS)
    assert (report.num_in, report.num_written, report.num_quarantined) == (10, 2, 8)
    assert report.videos_sampled_down == 1 and "1 videos sampled down" in report.summary()
    quarantined = [json.loads(x) for x in (tmp_path / "out" / "q.jsonl").read_text().splitlines()]
    assert [q["kind"] for q in quarantined] == expected
    rows = read_parquet(tmp_path / "out" / "rows.parquet")
    assert [len(r["videos"][0]["frames"]) for r in rows] == [4, 8]
    assert rows[1]["messages"][0]["content"] == "<image> then <video>: same?" and len(rows[1]["images"]) == 1
    long = decode_video(rows[1]["videos"][0])
    assert long.timestamps[0] == 0.0 and long.timestamps[-1] == pytest.approx(29.5) and len(long.frames) == 8


def test_synthetic_video_tasks_need_time_and_go_through_the_converter(tmp_path):
    splits = build_splits({"first_colour": 0.5, "direction": 0.5}, {"train": 12, "test": 6}, seed=3,
                          video=VideoSynthesis(tmp_path / "media", ClipSpec(size=56, frames=4, fps=2.0)))
    rows = splits["train"] + splits["test"]
    assert len({r["id"] for r in rows}) == 18 and all((tmp_path / "media").rglob("*.mp4"))
    for row in rows:
        extra = json.loads(row["extra"])
        video = decode_video(row["videos"][0])
        assert video.timestamps == [0.0, 0.5, 1.0, 1.5] and video.frames[0].size == (56, 56)
        centre = [np.asarray(f).reshape(-1, 3) for f in video.frames]
        if row["data_source"] == "synthetic/first_colour":
            first, second = extra["colours"]
            assert row["answer"] == first != second
            # the answer's colour fills the first half of the clip, the other colour the second half
            near = [min(np.abs(px.astype(int) - COLOURS[c]).sum(1).min() for px in centre[:2]) for c in (first, second)]
            assert near[0] < 40 and min(np.abs(centre[0].astype(int) - COLOURS[second]).sum(1)) > 40
        else:
            xs = [p[0] for p in extra["path"]]
            ys = [p[1] for p in extra["path"]]
            moved = {"left": xs[-1] < xs[0], "right": xs[-1] > xs[0], "up": ys[-1] < ys[0], "down": ys[-1] > ys[0]}
            assert moved[row["answer"]] and sum(moved.values()) == 1


def test_a_parquet_written_before_videos_existed_reads_with_no_videos(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    old = pa.table({"id": ["a"], "messages": [[{"role": "user", "content": "q"}]], "images": [[]], "answer": ["x"],
                    "data_source": ["s"], "extra": ["{}"]})
    pq.write_table(old, tmp_path / "old.parquet")
    (row,) = read_parquet(tmp_path / "old.parquet")
    assert row["videos"] == [] and row["answer"] == "x"


def test_row_converter_rejects_a_line_without_any_media(tmp_path):
    images = ImageLimits(min_pixels=784, max_pixels=3136)
    with RowConverter(tmp_path, images, LIMITS) as converter, pytest.raises(RowRejected, match="no 'image'"):
        converter.convert({"prompt": "x", "answer": "a"}, "r")
