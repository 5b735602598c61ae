"""Stage ``make data``: write the prompt parquet files (one per split) under ``data.dir``.

By default it generates the synthetic tasks of ``data.tasks`` with ``data.sizes`` rows per split: image
tasks drawn directly, video tasks written as MP4 clips under ``<data.dir>/media/`` and read back through
the same converter as a user's videos. With ``data.jsonl`` set it converts a user's own JSONL + media folder
instead, applying the pixel and video budgets and quarantining bad rows
(``<data.dir>/<split>.quarantine.jsonl``); image sides are rounded to multiples of the patch size of the
processor at ``model.path``, which also counts each prompt's tokens, so that checkpoint must exist.

    python -m pipelines.data --config configs/demo.yaml seed=1
    python -m pipelines.data --config configs/video_demo.yaml
    python -m pipelines.data data.jsonl=my.jsonl data.image_dir=media/ data.split=train
"""

from __future__ import annotations

import dataclasses

from collections import Counter
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from data_prep.convert import convert_splits
from data_prep.digits_task import TASK as DIGITS
from data_prep.digits_task import digits_splits
from data_prep.parquet import write_parquet
from data_prep.records import ImageLimits
from data_prep.synthetic import VideoSynthesis, build_splits
from data_prep.synthetic_video import ClipSpec
from data_prep.video import VideoLimits
from data_prep.zoom_task import TASK as ZOOM
from data_prep.zoom_task import ZoomTaskSpec, write_zoom_splits
from mmrl.config import Config
from mmrl.models.encoding import encode_prompt
from mmrl.models.families import family_of_processor
from mmrl.models.loading import load_processor, patch_factor
from mmrl.schema import IMAGE_PLACEHOLDER, Video
from pipelines.cli import parse


def video_synthesis(cfg: Config) -> VideoSynthesis:
    clip = ClipSpec(size=cfg.data.video_size, frames=cfg.data.video_frames, fps=cfg.data.video_fps)
    return VideoSynthesis(media_dir=Path(cfg.data.dir) / "media", clip=clip)


def zoom_board(cfg: Config, **view: int) -> ZoomTaskSpec:
    """The zoom task's board as the config sets it (``data.image_size``, ``data.zoom.grid``, ``.shapes``, ``.spot``,
    ``.cell_names``); ``view`` gives the view fields (``view_side``, ``zoom_max_pixels``), else their defaults."""
    zoom = cfg.data.zoom
    return ZoomTaskSpec(image_size=cfg.data.image_size, grid=zoom.grid, shapes_per_cell=zoom.shapes,
                        spot_side=zoom.spot, cell_names=zoom.cell_names, **view)


def zoom_spec(cfg: Config) -> ZoomTaskSpec:
    """The zoom task for this run: its board (:func:`zoom_board`), the view the model at ``model.path`` gets
    of it (its processor's resize), the run's zoom budget (``rollout.agent.max_pixels``) and its family's tool-call
    format (the demonstrations' and guides' calls)."""
    from mmrl.agent.chat import ChatFormat

    processor = load_processor(cfg.model.path)
    side = cfg.data.image_size
    encoded = encode_prompt(processor, [{"role": "user", "content": IMAGE_PLACEHOLDER}], [Image.new("RGB", (side, side))])
    chat = ChatFormat(processor)
    view = chat.model_image_sizes(encoded)[0]
    return dataclasses.replace(zoom_board(cfg, view_side=min(view), zoom_max_pixels=cfg.rollout.agent.max_pixels),
                               tool_calls=chat.calls)


def zoom(cfg: Config) -> None:
    others = {task: f for task, f in cfg.data.tasks.items() if task != ZOOM and f > 0}
    if others:
        raise ValueError(f"data.tasks: the zoom task is generated alone (its sft split holds demonstrations); got "
                         f"also {others}: set data.tasks={{zoom: 1.0}}")
    spec = zoom_spec(cfg)
    zoom = cfg.data.zoom
    splits = write_zoom_splits(cfg.data.dir, cfg.data.sizes, cfg.seed, spec, call_share=zoom.call_share,
                               call_cells=zoom.call_cells, direct_share=zoom.direct_share,
                               direct_by_kind=zoom.direct_by_kind)
    for split, report in splits.items():
        print(f"data: {split:5s} {report.summary()} -> {Path(cfg.data.dir) / f'{split}.parquet'}")


def digits(cfg: Config) -> None:
    """The digits task (:mod:`data_prep.digits_task`): real scans fitted to the pixel budget of the processor at
    ``model.path``, as a user's images are."""
    others = sorted(t for t, share in cfg.data.tasks.items() if t != DIGITS and share > 0)
    if others:
        raise ValueError(f"data.tasks: the digits task is generated alone (its rows are real scans, not drawn); got "
                         f"also {others}: set data.tasks={{digits: 1.0}}")
    processor = load_processor(cfg.model.path)
    factor, sizing = patch_factor(processor), family_of_processor(processor).media_sizing
    limits = ImageLimits(min_pixels=cfg.data.min_pixels, max_pixels=cfg.data.max_pixels, factor=factor,
                         sizing=sizing)
    splits = digits_splits(cfg.data.sizes, cfg.seed, limits, video_limits(cfg, factor, sizing))
    for split, rows in splits.items():
        path = Path(cfg.data.dir) / f"{split}.parquet"
        write_parquet(rows, path)
        print(f"data: {split:5s} {len(rows):5d} digit scans -> {path}")


def synthetic(cfg: Config) -> None:
    if cfg.data.tasks.get(ZOOM, 0) > 0:
        return zoom(cfg)
    if cfg.data.tasks.get(DIGITS, 0) > 0:
        return digits(cfg)
    splits = build_splits(cfg.data.tasks, cfg.data.sizes, cfg.seed, cfg.data.image_size, cfg.data.max_count,
                          video=video_synthesis(cfg))
    for split, rows in tqdm(splits.items(), desc="data: writing splits"):
        path = Path(cfg.data.dir) / f"{split}.parquet"
        write_parquet(rows, path)
        mix = Counter(r["data_source"] for r in rows)
        tqdm.write(f"data: {split:5s} {len(rows):5d} rows {dict(mix)} -> {path}")


def video_limits(cfg: Config, factor: int, sizing: str = "mmrl") -> VideoLimits:
    data = cfg.data
    return VideoLimits(min_pixels=data.min_pixels, frame_max_pixels=data.video_frame_max_pixels,
                       total_max_pixels=data.video_max_pixels, factor=factor, fps=data.video_fps,
                       min_frames=data.video_min_frames, max_frames=data.video_max_frames,
                       max_seconds=data.max_video_seconds, timeout_s=data.video_timeout_s, sizing=sizing)


def convert(cfg: Config) -> None:
    out = Path(cfg.data.dir)
    processor = load_processor(cfg.model.path)  # sizes the media and counts the prompt tokens
    factor = patch_factor(processor)
    sizing = family_of_processor(processor).media_sizing  # qwen-vl-utils' sizes for the Qwen families

    def count_tokens(prompt: str, images: list, videos: list[Video]) -> int:
        return len(encode_prompt(processor, [{"role": "user", "content": prompt}], images, videos))

    reports = convert_splits(
        cfg.data.jsonl, cfg.data.image_dir or Path(cfg.data.jsonl).parent, out, fmt=cfg.data.format,
        split=cfg.data.split, min_pixels=cfg.data.min_pixels, max_pixels=cfg.data.max_pixels, factor=factor,
        count_tokens=count_tokens, max_prompt_tokens=cfg.data.max_prompt_tokens,
        video_limits=video_limits(cfg, factor, sizing), sizing=sizing,
    )
    for split, report in reports.items():
        print(f"data: {split} -> {out / f'{split}.parquet'}\n{report.summary()}")


def main(argv: list[str] | None = None) -> None:
    cfg = parse(__doc__, argv)
    convert(cfg) if cfg.data.jsonl else synthetic(cfg)


if __name__ == "__main__":
    main()
