"""Bad rows of a peer's file, beside good ones: each is quarantined with its reason and its index, or (valid images
in other modes: CMYK, 16-bit grey, a palette with a transparent colour) converted to the RGB a user expects; the
good rows are written and the counts add up. The 20,000 x 20,000 image is refused from its header, never decoded."""

import io
import json
import struct
import zlib

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageFile

from data_prep.convert import convert_jsonl
from data_prep.pixels import encode_png, resize_to_budget
from mmrl.image_modes import to_rgb
from mmrl.schema import decode_image, read_parquet
from tests import peer_files

BUDGET = {"min_pixels": 28 * 28, "max_pixels": 56 * 56}


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` RGB pixels and holds almost none: only its header is sound."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def encoded(img: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def expected(img: Image.Image) -> bytes:
    """What a good RGB image becomes: fitted to the budget, PNG."""
    return encode_png(resize_to_budget(img, **BUDGET))


@pytest.fixture
def photo():
    return peer_files.photo(0, side=56)


def palette_with_transparency() -> Image.Image:
    """A palette image whose index 0 is transparent (its colour black) and index 1 red: left half transparent."""
    img = Image.new("P", (56, 56), 1)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    img.paste(0, (0, 0, 28, 56))
    return Image.open(io.BytesIO(encoded(img, "PNG", transparency=0)))


def test_bad_rows_are_quarantined_with_index_and_odd_modes_converted(tmp_path, photo, monkeypatch):
    from datasets import Dataset, Features, List, Value
    from datasets import Image as ImageFeature

    media = tmp_path / "media"
    (media / "folder.png").mkdir(parents=True)
    (media / "locked.png").write_bytes(encoded(photo, "PNG"))
    grey16 = np.asarray(photo.convert("L"), np.uint16) * 257  # the grey photo in 16 bits, 0..65535
    cases = [  # (image, answer, prompt, what happens)
        ({"bytes": encoded(photo, "JPEG", quality=95), "path": None}, "a", "<image>", "written"),
        ({"bytes": b"%PDF-1.4 not an image", "path": "scan.pdf"}, "a", "<image>", "corrupt"),
        ({"bytes": None, "path": None}, "a", "<image>", "bad_field"),  # neither bytes nor path
        ({"bytes": encoded(photo, "PNG"), "path": None}, "a", "<image><image>", "placeholder_mismatch"),
        ({"bytes": encoded(photo, "PNG"), "path": None}, None, "<image>", "missing_field"),
        ({"bytes": None, "path": "gone/photo.png"}, "a", "<image>", "missing_file"),
        ({"bytes": None, "path": "folder.png"}, "a", "<image>", "missing_file"),  # a folder, not a file
        ({"bytes": None, "path": "locked.png"}, "a", "<image>", "unreadable"),  # permission denied (below)
        ({"bytes": encoded(Image.new("RGB", (1, 1), "red"), "PNG"), "path": None}, "a", "<image>", "too_small"),
        ({"bytes": png_header(20_000, 20_000), "path": "huge.png"}, "a", "<image>", "too_large"),  # Pillow's guard
        ({"bytes": png_header(8_000, 8_000), "path": "big.png"}, "a", "<image>", "too_large"),  # mmrl's limit
        ({"bytes": encoded(photo.convert("CMYK"), "TIFF"), "path": None}, "a", "<image>", "written"),
        ({"bytes": encoded(Image.fromarray(grey16), "PNG"), "path": None}, "a", "<image>", "written"),
        ({"bytes": encoded(palette_with_transparency(), "PNG", transparency=0), "path": None}, "a", "<image>",
         "written"),
    ]
    features = Features({"problem": Value("string"), "answer": Value("string"), "images": List(ImageFeature())})
    data = Dataset.from_dict({"problem": [c[2] + "What is it?" for c in cases], "answer": [c[1] for c in cases],
                              "images": [[c[0]] for c in cases]}, features=features)
    # Written by pyarrow: datasets' to_parquet stats every path, and some of these point nowhere on purpose.
    pq.write_table(data.data.table, tmp_path / "bad.parquet")

    opened, real_open, real_load = [], Image.open, ImageFile.ImageFile.load

    def open_image(source, *args, **kwargs):
        if str(source).endswith("locked.png"):
            raise PermissionError(13, "Permission denied")  # as for a file of another user (tests run as root)
        return real_open(source, *args, **kwargs)

    def load(img):
        opened.append(img.size)
        return real_load(img)

    monkeypatch.setattr(Image, "open", open_image)
    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    out, quarantine = tmp_path / "out.parquet", tmp_path / "q.jsonl"
    report = convert_jsonl(tmp_path / "bad.parquet", media, out, quarantine, fmt="easyr1", **BUDGET)

    entries = [json.loads(line) for line in quarantine.read_text().splitlines()]
    rows = read_parquet(out)
    assert report.num_in == len(cases) == len(rows) + len(entries) == report.num_written + report.num_quarantined
    assert {e["index"]: e["kind"] for e in entries} == {i: c[3] for i, c in enumerate(cases) if c[3] != "written"}
    assert all(e["line"] == e["index"] + 1 for e in entries)
    reasons = {e["index"]: e["reason"] for e in entries}
    assert "decompression bomb" in reasons[9] and "over max_source_pixels=50000000" in reasons[10]
    assert "1x1 pixels" in reasons[8] and "is not a file" in reasons[6]
    assert (56, 56) in opened and not any(max(size) >= 8_000 for size in opened)  # the huge ones never decoded

    written = {int(r["id"].rsplit("-", 1)[1]) - 1: r["images"][0] for r in rows}
    assert sorted(written) == [0, 11, 12, 13]
    assert written[11] == expected(photo)  # CMYK: Pillow's conversion is exact for an image made from RGB
    grey = decode_image(written[12])
    assert written[12] == expected(photo.convert("L").convert("RGB"))  # 16 bits scaled to 8, not clipped
    assert np.asarray(grey).min() < 100  # clipping would have made every pixel white
    paletted = decode_image(written[13])
    assert paletted.getpixel((5, 28)) == (255, 255, 255) and paletted.getpixel((50, 28)) == (255, 0, 0)


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I"])
def test_16_bit_grey_is_scaled_to_8_bits(mode):
    values = np.array([[0, 257 * 100, 40000, 65535]], np.uint16)
    img = Image.fromarray(values) if mode == "I;16" else Image.fromarray(values.astype(">u2" if mode == "I;16B"
                                                                                        else np.int32))
    assert img.mode == mode
    assert [to_rgb(img).getpixel((x, 0)) for x in range(4)] == [(0,) * 3, (100,) * 3, (156,) * 3, (255,) * 3]
