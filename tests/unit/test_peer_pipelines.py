"""The peers' files as their own pipelines write them (tests/peer_files.py: ``datasets`` on real images), converted:
each field reaches its place (the prompt and its system message, the answer, ``data_source``, ``extra_info`` and
the other columns, every image and video), a DatasetDict's splits land where mmrl reads them, and what mmrl cannot
carry is named. Two GRPO steps on each layout: tests/integration/test_peer_training.py."""

import json
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from data_prep.convert import convert_splits
from data_prep.peer_formats import hf_layout
from data_prep.splits import plan_splits
from mmrl.schema import decode_image, read_parquet
from tests import peer_files

BUDGET = {"min_pixels": 28 * 28, "max_pixels": 56 * 56}


def convert(tmp_path, source, fmt, split="train", media=None):
    return peer_files.convert_checked(tmp_path, source, fmt, split, media)


def looks_like(stored: bytes, source: Image.Image) -> float:
    """Mean absolute grey difference (0..255) between a stored image shrunk to the source's size and the source."""
    small = decode_image(stored).convert("L").resize(source.size, Image.Resampling.BOX)
    return float(np.abs(np.asarray(small, float) - np.asarray(source.convert("L"), float)).mean())


def test_verl_preprocessing_output_reaches_every_place(tmp_path):
    path = peer_files.verl_parquet(tmp_path, "train", 3, start=10)
    report, written, quarantined = convert(tmp_path, path, "verl")
    assert (report.num_written, quarantined, report.notes) == (3, {}, [])
    for row_number, index in zip((1, 2, 3), (10, 11, 12)):
        row = written[f"train-{row_number}"]
        assert row["messages"] == [{"role": "system", "content": peer_files.SYSTEM},
                                   {"role": "user", "content": peer_files.DIGIT_QUESTION}]
        assert row["answer"] == peer_files.digit_label(index) and row["data_source"] == "sklearn/digits"
        # ability and extra_info as verl's preprocessing wrote them: a reward function's `extra_info` parameter
        # receives extra["extra_info"] (rewards.types: a parameter that is not a field is a row column).
        assert json.loads(row["extra"]) == {"ability": "vision", "extra_info": {"split": "train",
                                                                                "index": row_number - 1}}
        [image] = row["images"]
        assert decode_image(image).size == (28, 28)  # the 8x8 scan, grown to the budget's smallest size
        assert looks_like(image, peer_files.digit(index)) < 25  # the digit's strokes, not a flat square


def test_verl_rows_with_several_images_and_videos_as_frames_or_a_path(tmp_path):
    from datasets import Dataset, Features, List, Value
    from datasets import Image as ImageFeature

    from data_prep.synthetic_video import write_mp4

    frames = [peer_files.digit(i).convert("RGB").resize((56, 56)) for i in range(4)]
    (tmp_path / "clips").mkdir()
    write_mp4([np.asarray(f) for f in frames], tmp_path / "clips" / "digits.mp4", fps=2.0)
    features = Features({"prompt": List({"role": Value("string"), "content": Value("string")}),
                         "images": List(ImageFeature()), "videos": List(List(ImageFeature())),
                         "reward_model": {"style": Value("string"), "ground_truth": Value("string")},
                         "data_source": Value("string")})
    rows = [{"prompt": [{"role": "user", "content": "<image><image>Same digit?"}], "images": [frames[0], frames[1]],
             "videos": None, "reward_model": {"style": "rule", "ground_truth": "no"}, "data_source": "pairs"},
            {"prompt": [{"role": "user", "content": "<video>Which digit comes last?"}], "images": None,
             "videos": [frames], "reward_model": {"style": "rule", "ground_truth": "3"}, "data_source": "clips"}]
    Dataset.from_list(rows, features=features).to_parquet(str(tmp_path / "mixed.parquet"))
    pa_rows = [{"prompt": [{"role": "user", "content": "<video>Which digit comes last?"}],
                "videos": [{"video": "clips/digits.mp4"}], "reward_model": {"ground_truth": "3"}}]
    pq.write_table(pa.Table.from_pylist(pa_rows), tmp_path / "paths.parquet")

    _, written, _ = convert(tmp_path, tmp_path / "mixed.parquet", "verl")
    pair, clip = written["mixed-1"], written["mixed-2"]
    assert [looks_like(b, frames[i].resize((8, 8))) < 25 for i, b in enumerate(pair["images"])] == [True, True]
    assert clip["images"] == [] and len(clip["videos"][0]["frames"]) == 4
    assert clip["videos"][0]["timestamps"] == [0.0, 0.5, 1.0, 1.5]  # frames taken at data.video_fps
    _, written, _ = convert(tmp_path, tmp_path / "paths.parquet", "verl")
    video = written["paths-1"]["videos"][0]
    assert len(video["frames"]) == 4 and looks_like(video["frames"][3], frames[3].resize((8, 8))) < 40


def test_easyr1_images_as_paths_under_its_image_dir(tmp_path):
    media = tmp_path / "media"
    path = peer_files.easyr1_parquet_with_paths(tmp_path, media, "train", 2)
    _, written, quarantined = convert(tmp_path, path, "easyr1", media=media)
    assert quarantined == {}
    first = written["train-1"]
    assert first["messages"] == [{"role": "user", "content": "<image><image>Which photograph shows a flower, the "
                                                             "first or the second?"}]
    assert first["answer"] == "second" and json.loads(first["extra"]) == {"difficulty": 1}
    china, flower = (decode_image(b) for b in first["images"])
    assert china.size == flower.size == (56, 56)
    assert looks_like(first["images"][1], peer_files.photo(1).resize((56, 56))) < 10
    assert looks_like(written["train-2"]["images"][0], peer_files.photo(1).resize((56, 56))) < 10  # swapped order
    # Without the image_dir the paths point nowhere: each row quarantined with its index and the fix.
    _, _, quarantined = convert(tmp_path, path, "easyr1", media=tmp_path)
    assert {line: (e["index"], e["kind"]) for line, e in quarantined.items()} == {1: (0, "missing_file"),
                                                                                 2: (1, "missing_file")}


@pytest.mark.parametrize("parts", [True, False])
def test_trl_conversational_layout(tmp_path, parts):
    """grpo_vlm.py's preparation: a system message and the user's (typed parts, or a string TRL puts the image
    before), one ``image``, the ``solution`` its reward functions read."""
    path = peer_files.trl_parquet(tmp_path, "train", 2, start=20, parts=parts)
    report, written, quarantined = convert(tmp_path, path, "trl")
    assert (report.num_written, quarantined) == (2, {})
    row = written["train-2"]
    assert row["messages"] == [{"role": "system", "content": peer_files.SYSTEM},
                               {"role": "user", "content": "<image>Which digit is written here?"}]
    assert row["answer"] == peer_files.digit_label(21) and row["data_source"] == "user" and row["extra"] == "{}"
    assert looks_like(row["images"][0], peer_files.digit(21)) < 25


def test_trl_rows_it_cannot_take_are_quarantined_and_a_standard_prompt_is_auto_detected(tmp_path):
    from datasets import Dataset, Features, List, Value
    from datasets import Image as ImageFeature

    photo = peer_files.photo(0)
    rows = [{"prompt": "Two photographs: which is the temple?", "images": [photo, peer_files.photo(1)],
             "ground_truth": "first", "source": "web"},
            {"prompt": "<image>What is this?", "images": [photo], "ground_truth": None, "source": "web"},
            {"prompt": "<image><image>What is this?", "images": [photo], "ground_truth": "a temple", "source": "web"}]
    features = Features({"prompt": Value("string"), "images": List(ImageFeature()), "ground_truth": Value("string"),
                         "source": Value("string")})
    Dataset.from_list(rows, features=features).save_to_disk(str(tmp_path / "standard"))
    report, written, quarantined = convert(tmp_path, tmp_path / "standard", "hf")  # detected: TRL's layout
    assert report.num_written == 1
    assert {line: (e["index"], e["kind"]) for line, e in quarantined.items()} == {
        2: (1, "missing_field"), 3: (2, "placeholder_mismatch")}
    assert "'ground_truth' (the answer) is missing" in quarantined[2]["reason"]
    [row] = written.values()
    assert row["messages"][0]["content"] == "<image><image>Two photographs: which is the temple?"
    assert row["answer"] == "first" and json.loads(row["extra"]) == {"source": "web"} and len(row["images"]) == 2

    multi_turn = [{"prompt": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "Hello"},
                              {"role": "user", "content": "Colour?"}], "image": {"bytes": None, "path": "a.png"},
                   "solution": "red"},
                  {"prompt": [{"role": "user", "content": "<image>Colour?"}], "image": {"bytes": None, "path": "a.png"},
                   "other": "x"}]
    pq.write_table(pa.Table.from_pylist(multi_turn[:1]), tmp_path / "turns.parquet")
    _, _, quarantined = convert(tmp_path, tmp_path / "turns.parquet", "trl")
    assert quarantined[1]["kind"] == "bad_field" and "single-turn" in quarantined[1]["reason"]
    pq.write_table(pa.Table.from_pylist(multi_turn[1:]), tmp_path / "no_truth.parquet")
    _, _, quarantined = convert(tmp_path, tmp_path / "no_truth.parquet", "trl")
    assert "['answer', 'solution', 'ground_truth']" in quarantined[1]["reason"]
    no_image = [{"prompt": [{"role": "user", "content": "<image>Colour?"}], "image": {"bytes": None, "path": None},
                 "solution": "red"}]
    pq.write_table(pa.Table.from_pylist(no_image), tmp_path / "no_image.parquet")
    _, _, quarantined = convert(tmp_path, tmp_path / "no_image.parquet", "trl")
    assert quarantined[1]["kind"] == "bad_field" and quarantined[1]["reason"].startswith("image[0] is {")


def test_hf_folders_are_told_apart_by_their_columns():
    string_list = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    tables = {
        "verl": pa.table({"prompt": pa.array([[]], string_list), "reward_model": [{"ground_truth": "1"}]}),
        "easyr1": pa.table({"problem": ["q"], "answer": ["a"]}),
        "trl": pa.table({"prompt": pa.array([[]], string_list), "solution": ["a"]}),
        "jsonl": pa.table({"prompt": ["q"], "answer": ["a"], "image": ["a.png"]}),
    }
    assert {name: hf_layout(table) for name, table in tables.items()} == {n: n for n in tables}
    assert hf_layout(pa.table({"prompt": ["q"], "solution": ["a"]})) == "trl"  # TRL's standard (string) prompt


def test_a_dataset_dict_writes_each_split_where_mmrl_reads_it(tmp_path):
    path = peer_files.easyr1_dataset_dict(tmp_path, {"train": 3, "validation": 2, "test": 1})
    reports = convert_splits(path, tmp_path, tmp_path / "out", fmt="hf", **BUDGET)
    assert {split: r.num_written for split, r in reports.items()} == {"train": 3, "val": 2, "test": 1}
    answers = {split: [r["answer"] for r in read_parquet(tmp_path / "out" / f"{split}.parquet")]
               for split in ("train", "val", "test")}
    labels = [peer_files.digit_label(i) for i in range(6)]
    assert answers == {"train": labels[:3], "val": labels[3:5], "test": labels[5:]}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "test.parquet", "test.quarantine.jsonl", "train.parquet", "train.quarantine.jsonl", "val.parquet",
        "val.quarantine.jsonl"]
    for asked in ("val", "validation", "dev"):  # one split, by any of its names, to mmrl's name
        reports = convert_splits(path, tmp_path, tmp_path / asked, fmt="hf", split=asked, **BUDGET)
        assert {s: r.num_written for s, r in reports.items()} == {"val": 2}
    with pytest.raises(ValueError, match=r"splits \['test', 'train', 'validation'\], none of them "
                                         r"data.split='sft'.*leave it empty to convert them all"):
        convert_splits(path, tmp_path, tmp_path / "sft", fmt="hf", split="sft", **BUDGET)


def test_split_plans_name_the_splits_and_the_fix():
    assert plan_splits(None, "", "f") == [("train", "train")]
    assert plan_splits(None, "validation", "f") == [("validation", "val")]
    assert plan_splits(None, "test_hard", "f") == [("test_hard", "test_hard")]
    assert plan_splits(["test", "valid", "train"], "", "d") == [("train", "train"), ("valid", "val"), ("test", "test")]
    assert plan_splits(["train", "extra"], "extra", "d") == [("extra", "extra")]
    with pytest.raises(ValueError, match=r"d holds the splits \['extra', 'train'\]; mmrl does not read \['extra'\] "
                                         r"\(its splits: train, val \(validation, valid, dev\), test, sft\).*"
                                         r"data.split=<name>"):
        plan_splits(["train", "extra"], "", "d")
    with pytest.raises(ValueError, match=r"splits \['dev', 'validation'\], which all mean \['val'\]"):
        plan_splits(["train", "validation", "dev"], "", "d")
    with pytest.raises(ValueError, match=r"of which \['dev', 'validation'\] all mean 'val'; set data.split"):
        plan_splits(["train", "validation", "dev"], "val", "d")


def test_what_mmrl_cannot_carry_is_named_not_dropped_silently(tmp_path):
    """An extra column of images (its bytes cannot go into extra's JSON), a column named as one of mmrl's fields
    (verl's answer is reward_model.ground_truth) and a reward_model style other than rule: each a warning and a note
    of the report; the rows are still written, their other columns kept."""
    from datasets import Dataset, Features, List, Value
    from datasets import Image as ImageFeature

    digit = peer_files.digit(0)
    features = Features({"prompt": List({"role": Value("string"), "content": Value("string")}),
                         "images": List(ImageFeature()), "mask": ImageFeature(),
                         "reward_model": {"style": Value("string"), "ground_truth": Value("string")},
                         "extra_info": {"index": Value("int64")}, "split_name": Value("string"),
                         "answer": Value("string")})
    rows = [{"prompt": [{"role": "user", "content": "<image>Digit?"}], "images": [digit], "mask": digit,
             "reward_model": {"style": style, "ground_truth": "0"}, "extra_info": {"index": i}, "split_name": "train",
             "answer": "A zero: one closed loop."} for i, style in enumerate(("rule", "model"))]
    Dataset.from_list(rows, features=features).to_parquet(str(tmp_path / "train.parquet"))
    with pytest.warns(UserWarning) as caught:
        report, written, _ = convert(tmp_path, tmp_path / "train.parquet", "verl")
    messages = [str(w.message) for w in caught]
    assert any("columns ['mask'] hold binary data" in m for m in messages)
    assert any("reward_model.style ['model'] is not used" in m for m in messages)
    assert any("columns ['answer'] are not read" in m for m in messages)
    assert len(report.notes) == 3 and all(note in report.summary() for note in report.notes)
    assert report.num_written == 2 and written["train-1"]["answer"] == "0"
    assert json.loads(written["train-2"]["extra"]) == {"extra_info": {"index": 1}, "split_name": "train"}
    (tmp_path / "clean").mkdir()
    clean = peer_files.verl_parquet(tmp_path / "clean", "train", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a file with nothing to say warns nothing
        report, _, _ = convert(tmp_path, clean, "verl")
    assert report.notes == [] and "note:" not in report.summary()


def test_a_verl_style_reward_function_receives_the_rows_source_and_extra_info(tmp_path):
    """verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info)``; mmrl binds the same
    names from the converted row (the response as ``response``), as its reward stage does."""
    from mmrl.trainer.dataset import rows_to_batch
    from rewards import RewardInput
    from rewards.types import bind, plan_call

    def compute_score(data_source, response, ground_truth, extra_info):
        return float(response == ground_truth)

    _, written, _ = convert(tmp_path, peer_files.verl_parquet(tmp_path, "train", 2, start=5), "verl")
    batch = rows_to_batch([written["train-2"]])
    sample = RewardInput(response="7", ground_truth=batch["answer"][0], data_source=batch["data_source"][0],
                         extra=batch["extra"][0])
    assert bind(plan_call(compute_score), sample, "compute_score") == {
        "data_source": "sklearn/digits", "response": "7", "ground_truth": peer_files.digit_label(6),
        "extra_info": {"split": "train", "index": 1}}
