"""The built-in tools, the checks on a tool's result, the tool registry and the tool table (inline: fast)."""

from __future__ import annotations

import io
import math
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from mmrl.agent import registry
from mmrl.agent.builtin import MAX_ASPECT, calculator, crop, source_box, zoom_in
from mmrl.agent.calls import ToolCall
from mmrl.agent.executor import ToolExecutor
from mmrl.agent.outputs import ToolLimits, ToolOutput, check_outcome, to_plain
from mmrl.agent.schemas import tool
from mmrl.agent.table import build_tool_table
from mmrl.agent.worker import ToolInput


def coordinate_image(width: int, height: int) -> Image.Image:
    """Each pixel's colour encodes where it is: (x % 256, y % 256, 16 * (x // 256) + y // 256)."""
    img = Image.new("RGB", (width, height))
    img.putdata([(x % 256, y % 256, 16 * (x // 256) + y // 256) for y in range(height) for x in range(width)])
    return img


def where(pixel: tuple[int, int, int]) -> tuple[int, int]:
    r, g, b = pixel
    return r + 256 * (b // 16), g + 256 * (b % 16)


@pytest.mark.parametrize(("size", "seen", "box"), [
    ((448, 336), (112, 84), [10, 20, 30, 41]),  # the model saw it at a quarter of its size
    ((300, 300), (112, 112), [0.5, 0, 56, 112]),  # a scale that is not a whole number
    ((300, 200), (112, 84), [-5, 30, 200, 50.5]),  # a box past the image's edges is clipped
])
def test_crop_reads_the_region_the_model_named_at_full_resolution(size, seen, box) -> None:
    source = coordinate_image(*size)
    out = crop(box, images=[source], model_image_sizes=[seen], max_pixels=10**6)
    sx, sy = size[0] / seen[0], size[1] / seen[1]
    # The reference: every stored pixel whose area overlaps the named box, at the stored resolution.
    xs = [x for x in range(size[0]) if x + 1 > box[0] * sx and x < box[2] * sx]
    ys = [y for y in range(size[1]) if y + 1 > box[1] * sy and y < box[3] * sy]
    assert out.size == (len(xs), len(ys))
    assert [where(out.getpixel((i, j))) for j in range(out.height) for i in range(out.width)] == [
        (x, y) for y in ys for x in xs]


def test_crop_stays_within_the_budget_and_zoom_fills_it() -> None:
    source = Image.new("RGB", (400, 200), (200, 30, 30))
    seen = [(200, 100)]
    small = crop([0, 0, 200, 100], images=[source], model_image_sizes=seen, max_pixels=100 * 50)
    assert small.size == (100, 50)  # shrunk to the budget, the aspect kept
    zoomed = zoom_in([10, 10, 30, 20], images=[source], model_image_sizes=seen, max_pixels=120 * 60)
    assert zoomed.size == (120, 60) and zoomed.getpixel((60, 30)) == (200, 30, 30)  # 40x20 stored pixels, enlarged
    assert crop([10, 10, 30, 20], images=[source], model_image_sizes=seen, max_pixels=120 * 60).size == (40, 20)
    second = Image.new("RGB", (50, 50), (0, 0, 255))
    picked = crop([0, 0, 10, 10], image=1, images=[source, second], model_image_sizes=seen + [(50, 50)],
                  max_pixels=10**4)
    assert picked.getpixel((0, 0)) == (0, 0, 255)


@pytest.mark.parametrize(("box", "image", "fragment"), [
    ([30, 10, 10, 20], 0, "is empty"),
    ([10, 10, 10, 20], 0, "is empty"),
    ([300, 10, 400, 20], 0, "lies outside the image, which you see at 200x100"),
    ([0, 0, 200, 1], 0, f"at most {MAX_ASPECT:g} times longer"),
    ([0, 0, 10, 10], 1, "image 1 does not exist: the conversation has 1 image(s)"),
])
def test_a_bad_box_is_an_error_that_says_what_to_fix(box, image, fragment) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        zoom_in(box, image=image, images=[Image.new("RGB", (400, 200))], model_image_sizes=[(200, 100)],
                max_pixels=10**4)


def test_source_box_maps_corners_outward() -> None:
    assert source_box([1, 1, 2, 2], (10, 10), (30, 30)) == (3, 3, 6, 6)
    assert source_box([1.2, 1.2, 1.4, 1.4], (10, 10), (30, 30)) == (3, 3, 5, 5)  # never an empty crop


@pytest.mark.parametrize(("expression", "expected"), [
    ("(3 + 4) * 2.5", "17.5"), ("2 ** 100", str(2**100)), ("7 // 2 - -1", "4"), ("1 / 3", "0.333333333333"),
    ("10 % 4", "2"),
])
def test_calculator(expression: str, expected: str) -> None:
    assert calculator(expression) == expected


@pytest.mark.parametrize(("expression", "error"), [
    ("9 ** 9 ** 9", "too large"), ("__import__('os')", "unsupported expression"), ("2 +", "not an arithmetic"),
    ("1 / 0", "division by zero"), ("(-8) ** 0.5", "not a real number"), ("1" * 150, "too large"),
])
def test_calculator_refuses_what_it_cannot_do_quickly(expression: str, error: str) -> None:
    with pytest.raises((ValueError, ZeroDivisionError), match=error):
        calculator(expression)


# --- results ------------------------------------------------------------------------------------------

LIMITS = ToolLimits(max_text_chars=100, max_images=2, max_image_pixels=300 * 300, max_pixels=100 * 100)


def png(img: Image.Image) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return buffer.getvalue()


def claims_size(data: bytes, width: int, height: int) -> bytes:
    """A PNG whose header claims another size (a decompression bomb: small file, huge image)."""
    ihdr = struct.pack(">II", width, height) + data[24:29]
    chunk = b"IHDR" + ihdr
    return data[:8] + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk)) + data[33:]


def back(result: object) -> ToolOutput:
    return check_outcome(to_plain(result, LIMITS), LIMITS, "t")


def test_good_results_come_back_as_text_and_capped_images() -> None:
    assert back("42") == ToolOutput(text="42")
    out = back({"text": "two", "images": [Image.new("RGB", (200, 50), "red"), Image.new("L", (20, 20))]})
    assert out.text == "two" and [i.size for i in out.images] == [(200, 50), (20, 20)]
    big = back(Image.new("RGB", (200, 50), "red"))
    assert big.failure is None and big.images[0].size == (200, 50)
    capped = check_outcome(to_plain(Image.new("RGB", (250, 100), "red"), LIMITS), LIMITS, "t")
    assert capped.images[0].width * capped.images[0].height <= LIMITS.max_pixels and capped.images[0].mode == "RGB"


def test_bad_results_are_failures_of_their_kind() -> None:
    half_png = png(Image.new("RGB", (64, 64), "red"))
    corrupt = Image.open(io.BytesIO(half_png[: len(half_png) // 2]))  # lazily loaded: fails when read
    cases = [
        (None, "bad_type"), (3.0, "bad_type"), (["a"], "bad_type"), ((), "bad_type"), (b"bytes", "bad_type"),
        ({"txt": "a"}, "bad_type"), ({"images": ["not an image"]}, "bad_type"),
        ({"text": "a", "images": "b"}, "bad_type"),
        ("x" * 101, "too_large"), ({"images": [Image.new("RGB", (4, 4))] * 3}, "too_large"),
        (Image.new("L", (301, 300)), "too_large"), (corrupt, "bad_image"),
    ]
    for result, kind in cases:
        out = back(result)
        assert out.failure == kind, result
        assert out.text.startswith("Error: tool t failed: returned") and len(out.text) < 320


def test_the_driver_checks_what_a_worker_sends() -> None:
    from mmrl.plugins.outcome import Outcome

    bomb = claims_size(png(Image.new("RGB", (8, 8))), 40_000, 40_000)
    for value, kind in [({"text": "a", "images": [b"not a png"]}, "bad_image"),
                        ({"text": "a", "images": [bomb]}, "too_large"),
                        ({"text": 1, "images": []}, "bad_type"), ("text", "bad_type"),
                        ({"text": "a" * 101, "images": []}, "too_large")]:
        assert check_outcome(Outcome(value=value), LIMITS, "t").failure == kind, value
    failed = check_outcome(Outcome(failure="error", message="ValueError: empty box"), LIMITS, "zoom_in")
    assert failed == ToolOutput(text="Error: tool zoom_in failed: ValueError: empty box", failure="error",
                                detail="ValueError: empty box")
    assert check_outcome(Outcome(failure="timeout", message="x"), LIMITS, "z").text == (
        "Error: tool z failed: it did not finish in time")


# --- registry and table -------------------------------------------------------------------------------

USER_TOOL = '''
from mmrl.agent import tool

@tool("Count the images of the conversation.", {"type": "object", "properties": {"plus": {"type": "integer"}}})
def count_images(plus=0, *, images):
    return str(len(images) + plus)

def no_schema():
    return "x"
'''


@pytest.fixture
def user_tools(tmp_path: Path) -> Path:
    path = tmp_path / "my_tools.py"
    path.write_text(USER_TOOL)
    return path


def test_specs_resolve_built_ins_files_and_entry_points(user_tools: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert registry.resolve("crop") is crop
    assert registry.resolve(f"{user_tools}:count_images")(images=[1, 2]) == "2"
    with pytest.raises(TypeError, match="has no schema"):
        registry.resolve(f"{user_tools}:no_schema")
    with pytest.raises(ValueError, match="has no function 'nope'; define it there or use one of"):
        registry.resolve(f"{user_tools}:nope")
    for spec, error in [("rotate", "unknown tool 'rotate'"), (f"{tmp_path}/missing.py:f", "not found"),
                        (str(user_tools), "names a file but no function")]:
        with pytest.raises(ValueError, match=error):
            registry.check_spec(spec)
    dist = tmp_path / "mmrl_tool_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mmrl-tool-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mmrl.tools]\ncounter = my_tools:count_images\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "counter" in registry.available()
    assert registry.resolve("counter")(images=[1]) == "1"


def test_schemas_are_checked_when_declared() -> None:
    def f(**kwargs: object) -> str:
        return ""

    for parameters, kwargs, error in [
        ({"type": "object", "properties": {"images": {"type": "array"}}}, {}, "context keywords"),
        ({"type": "array"}, {}, '"type": "object"'),
        ({"type": "object", "properties": {"a": {"type": "nonsense"}}}, {}, "not a valid JSON schema"),
        ({"type": "object"}, {"name": "two words"}, "name 'two words' must be"),
    ]:
        with pytest.raises(ValueError, match=error):
            tool("x", parameters, **kwargs)(f)
    with pytest.raises(ValueError, match="description"):
        tool(" ", {"type": "object"})(f)
    assert tool("x", {"type": "object"})(f).__mmrl_tool_schema__["name"] == "f"


def test_a_table_of_built_in_and_user_tools_runs_calls_inline(user_tools: Path) -> None:
    with ToolExecutor(isolation="inline", timeout_s=5.0) as executor:
        table = build_tool_table(["crop", "calculator", f"{user_tools}:count_images"], executor)
        assert table.names == ["crop", "calculator", "count_images"]
        assert [d["function"]["name"] for d in table.definitions()] == table.names
        assert table.definitions()[0]["type"] == "function"
        with pytest.raises(ValueError, match="two tools are named 'crop'"):
            build_tool_table(["crop", "crop"], executor)
        calls = table.parse('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
                            '<tool_call>{"name": "count_images", "arguments": {"plus": 1}}</tool_call>'
                            '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [5, 5, 1, 1]}}</tool_call>')
        assert all(isinstance(c, ToolCall) for c in calls)
        image = Image.new("RGB", (64, 64))
        inputs = [(c.name, table[c.name].spec, ToolInput(arguments=c.arguments, images=[image],
                                                          model_image_sizes=[(32, 32)])) for c in calls]
        outputs = executor.run(inputs)
        assert [o.text for o in outputs[:2]] == ["42", "2"]
        assert outputs[2].failure == "error" and "is empty" in outputs[2].text


def test_tool_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_images"):
        ToolLimits(max_images=0)
    with pytest.raises(ValueError, match="exceeds max_image_pixels"):
        ToolLimits(max_pixels=10, max_image_pixels=5)
    assert math.isclose(ToolLimits().max_pixels, 448 * 448)
