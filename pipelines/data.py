"""Stage ``make data``: write the prompt parquet files (one per split) under ``data.dir``.

By default it generates the synthetic visual tasks of ``data.tasks`` with ``data.sizes`` rows per
split. With ``data.jsonl`` set it converts a user's own JSONL + image folder instead, applying the pixel
budget and quarantining bad rows (``<data.dir>/<split>.quarantine.jsonl``); image sides are rounded to
multiples of the patch size of the processor at ``model.path``, so that checkpoint must exist.

    python -m pipelines.data --config configs/demo.yaml seed=1
    python -m pipelines.data data.jsonl=my.jsonl data.image_dir=imgs/ data.split=train
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tqdm import tqdm

from data_prep.convert import convert_jsonl
from data_prep.schema import write_parquet
from data_prep.synthetic import build_splits
from mmrl.config import Config
from mmrl.models.encoding import encode_prompt
from mmrl.models.loading import load_processor, patch_factor
from pipelines.cli import parse


def synthetic(cfg: Config) -> None:
    splits = build_splits(cfg.data.tasks, cfg.data.sizes, cfg.seed, cfg.data.image_size, cfg.data.max_count)
    for split, rows in tqdm(splits.items(), desc="data: writing splits"):
        path = Path(cfg.data.dir) / f"{split}.parquet"
        write_parquet(rows, path)
        mix = Counter(r["data_source"] for r in rows)
        tqdm.write(f"data: {split:5s} {len(rows):5d} rows {dict(mix)} -> {path}")


def convert(cfg: Config) -> None:
    out = Path(cfg.data.dir)
    processor = load_processor(cfg.model.path)  # sizes the images and counts the prompt tokens

    def count_tokens(prompt: str, images: list) -> int:
        return len(encode_prompt(processor, [{"role": "user", "content": prompt}], images))

    report = convert_jsonl(
        cfg.data.jsonl, cfg.data.image_dir or Path(cfg.data.jsonl).parent, out / f"{cfg.data.split}.parquet",
        out / f"{cfg.data.split}.quarantine.jsonl", min_pixels=cfg.data.min_pixels, max_pixels=cfg.data.max_pixels,
        factor=patch_factor(processor.image_processor), count_tokens=count_tokens,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
    )
    print(report.summary())


def main(argv: list[str] | None = None) -> None:
    cfg = parse(__doc__, argv)
    convert(cfg) if cfg.data.jsonl else synthetic(cfg)


if __name__ == "__main__":
    main()
