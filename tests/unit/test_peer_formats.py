"""verl's and EasyR1's parquet layouts and a Hugging Face datasets folder, converted through mmrl's checks and
quarantine: files the tests write in each documented layout, bad rows included; in = written + quarantined."""

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mmrl.schema import decode_image, read_parquet
from tests import peer_files


def png(colour, size=(60, 40)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def convert(tmp_path, source, fmt, split="train"):
    return peer_files.convert_checked(tmp_path, source, fmt, split, tmp_path / "media")


@pytest.fixture
def media(tmp_path):
    folder = tmp_path / "media"
    folder.mkdir()
    (folder / "blue.png").write_bytes(png((0, 0, 255)))
    (tmp_path / "outside.png").write_bytes(png((9, 9, 9)))
    return folder


def test_verl_parquet(tmp_path, media):
    def row(prompt, images, truth="red", **extra):
        return {"data_source": "geo3k", "prompt": prompt, "images": images, "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"index": 7, "split": "train"},
                **extra}

    system = {"role": "system", "content": "Answer briefly."}
    user = {"role": "user", "content": "<image>What colour?"}
    rows = [
        row([system, user], [{"bytes": png((255, 0, 0)), "path": "red.png"}]),  # 1: bytes, with a system message
        row([user], [{"bytes": None, "path": "blue.png"}], truth="blue"),  # 2: a path in the media folder
        row([user], [{"bytes": png((0, 255, 0)), "path": None}], truth=None),  # 3: no ground truth
        row([user], [{"bytes": b"not an image", "path": "junk.png"}]),  # 4: corrupt bytes
        row([user], [{"bytes": None, "path": "../outside.png"}]),  # 5: a path out of the media folder
        row([user, {"role": "assistant", "content": "red"}, user], [{"bytes": png((1, 2, 3)), "path": None}]),  # 6
        row([{"role": "user", "content": "<image><image>Same?"}], [{"bytes": png((5, 5, 5)), "path": None}]),  # 7
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    report, written, quarantined = convert(tmp_path, tmp_path / "train.parquet", "verl")

    assert (report.num_in, report.num_written) == (7, 2)
    assert {line: e["kind"] for line, e in quarantined.items()} == {
        3: "missing_field", 4: "corrupt", 5: "outside_image_dir", 6: "bad_field", 7: "placeholder_mismatch"}
    assert "<15 bytes>" not in quarantined[4]["text"] and "<12 bytes>" in quarantined[4]["text"]  # bytes abbreviated
    first, second = written["train-1"], written["train-2"]
    assert first["messages"] == [system, user] and first["answer"] == "red" and first["data_source"] == "geo3k"
    assert json.loads(first["extra"]) == {"ability": "math", "extra_info": {"index": 7, "split": "train"}}
    image = decode_image(first["images"][0])
    assert image.size == (56, 28) and image.getpixel((10, 10)) == (255, 0, 0)  # fitted to the budget
    assert second["answer"] == "blue" and decode_image(second["images"][0]).getpixel((5, 5)) == (0, 0, 255)


def test_easyr1_parquet_with_a_video_of_frames(tmp_path, media):
    frames = [png((200, 20, 20), (56, 56))] * 2 + [png((20, 200, 20), (56, 56))] * 2
    rows = [
        {"problem": "<image>How many?", "answer": "3", "images": [png((0, 0, 0))], "videos": None, "level": 2},
        {"problem": "<image><image>Same colour?", "answer": "yes", "images": [png((1, 1, 1)), png((2, 2, 2))],
         "videos": None, "level": 1},
        {"problem": "<video>Which colour first?", "answer": "red", "images": None, "videos": [frames], "level": 3},
        {"problem": "<image>How many?", "answer": None, "images": [png((0, 0, 0))], "videos": None, "level": 2},
        {"problem": "<image>Where is <|im_end|>?", "answer": "x", "images": [png((0, 0, 0))], "videos": None,
         "level": 2},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "easy.parquet")
    report, written, quarantined = convert(tmp_path, tmp_path / "easy.parquet", "easyr1")

    assert (report.num_in, report.num_written) == (5, 3)
    assert {line: e["kind"] for line, e in quarantined.items()} == {4: "missing_field", 5: "control_token"}
    assert written["easy-1"]["messages"] == [{"role": "user", "content": "<image>How many?"}]
    assert json.loads(written["easy-1"]["extra"]) == {"level": 2} and written["easy-1"]["data_source"] == "user"
    assert len(written["easy-2"]["images"]) == 2
    video = written["easy-3"]["videos"][0]
    assert len(video["frames"]) == 4 and video["timestamps"] == [0.0, 0.5, 1.0, 1.5]  # data.video_fps=2 by default
    assert decode_image(video["frames"][0]).getpixel((3, 3)) == (200, 20, 20)


def test_a_datasets_folder_in_either_layout_and_a_dataset_dict_split(tmp_path, media):
    from datasets import Dataset, DatasetDict, Features, Sequence, Value
    from datasets import Image as ImageFeature

    features = Features({"problem": Value("string"), "answer": Value("string"),
                         "images": Sequence(ImageFeature())})
    easy = Dataset.from_dict({"problem": ["<image>Colour?", "<image>Colour?", "<image>Colour?"],
                              "answer": ["red", "green", "blue"],
                              "images": [[{"bytes": png((255, 0, 0)), "path": None}],
                                         [{"bytes": b"junk", "path": None}],
                                         [{"bytes": None, "path": str(media / "blue.png")}]]}, features=features)
    easy.save_to_disk(tmp_path / "easy_ds")
    # An absolute path inside the media folder is accepted; the corrupt image is quarantined.
    report, written, quarantined = convert(tmp_path, tmp_path / "easy_ds", "hf")
    assert (report.num_in, report.num_written) == (3, 2) and quarantined[2]["kind"] == "corrupt"
    assert decode_image(written["easy_ds-3"]["images"][0]).getpixel((1, 1)) == (0, 0, 255)

    verl = Dataset.from_list([
        {"data_source": "chartqa", "prompt": [{"role": "user", "content": [{"type": "image", "text": None},
                                                                            {"type": "text", "text": "Value?"}]}],
         "images": [{"bytes": png((9, 9, 9)), "path": None}], "reward_model": {"ground_truth": "42"}},
    ])
    DatasetDict({"train": verl, "test": verl}).save_to_disk(tmp_path / "verl_ds")
    report, written, _ = convert(tmp_path, tmp_path / "verl_ds", "hf", split="test")
    assert report.num_written == 1
    [row] = written.values()
    assert row["messages"] == [{"role": "user", "content": "<image>Value?"}] and row["answer"] == "42"
    assert row["data_source"] == "chartqa"
    with pytest.raises(ValueError, match=r"splits \['test', 'train'\], none of them data.split='val'.*"
                                         r"validation, valid, dev.*set data.split to one of"):
        convert(tmp_path, tmp_path / "verl_ds", "hf", split="val")
    with pytest.raises(ValueError, match="not a folder"):
        convert(tmp_path, tmp_path / "easy.parquet", "hf")


def test_make_data_converts_a_peer_file_with_the_models_sizes(tmp_path, media, tiny_model_dir, capsys):
    """``make data ARGS="data.format=easyr1 data.jsonl=..."``: the stage reads the layout, sizes the images as
    qwen-vl-utils would for the tiny Qwen2.5-VL, writes the split and prints the counts."""
    from qwen_vl_utils.vision_process import smart_resize

    from pipelines import data

    rows = [{"problem": "<image>Colour?", "answer": "red", "images": [png((255, 0, 0), (300, 97))]},
            {"problem": "<image><image>Colour?", "answer": "red", "images": [png((255, 0, 0))]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "easy.parquet")
    data.main([f"model.path={tiny_model_dir}", f"data.dir={tmp_path / 'out'}", "data.format=easyr1",
               f"data.jsonl={tmp_path / 'easy.parquet'}", "data.max_pixels=12544"])
    assert "convert: in=2 written=1 quarantined=1 (placeholder_mismatch=1)" in capsys.readouterr().out
    [row] = read_parquet(tmp_path / "out" / "train.parquet")
    height, width = smart_resize(97, 300, 28, min_pixels=28 * 28, max_pixels=12544)
    assert decode_image(row["images"][0]).size == (width, height)
