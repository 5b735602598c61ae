"""What one tool call gives the episode (:class:`ToolOutput`), and the checks on its way back.

A tool returns a ``str`` (text), a PIL image, or a dict with ``"text"`` and/or ``"images"`` (a list of PIL
images). In the worker, :func:`to_plain` turns that into plain data (the text, each image as an upright RGB PNG
of its first frame: :func:`~mmrl.agent.images.upright_rgb`) and refuses what is wrong before anything crosses
the process boundary: another type (``bad_type``), text or images past the limits (``too_large``), an image that
cannot be read (``bad_image``). In the driver, :func:`check_outcome` checks the plain data again (never trusting
a worker), decodes each image without letting a decompression bomb expand (``bad_image`` / ``too_large``),
refuses one of an extreme aspect ratio (``bad_image``) and fits it to the pixel budget
(:func:`~mmrl.agent.images.fitted`), and cleans the text (:func:`mmrl.plugins.safe_text.clean`: valid Unicode,
no control characters or terminal escapes). What it changed is a *repair* (:data:`TOOL_REPAIR_KINDS`), counted
but not a failure; the chat format neutralises special-token strings before the turn is encoded
(:meth:`mmrl.agent.chat.ChatFormat.safe`).

A failure becomes a :class:`ToolOutput` whose ``text`` is the short message the model reads in the tool turn
(cleaned too: an exception's message is the tool's text).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from PIL import Image

from mmrl.agent.images import fitted, upright_rgb
from mmrl.plugins.outcome import Outcome
from mmrl.plugins.safe_text import clean

TOOL_FAILURE_KINDS: tuple[str, ...] = ("timeout", "error", "crashed", "memory", "bad_type", "too_large", "bad_image")
"""How a tool call can fail: the kinds of the plugin pool (:mod:`mmrl.plugins`), then the checks of its result."""
TOOL_REPAIR_KINDS: tuple[str, ...] = ("unsafe_text", "animated_image")
"""What the checks can make safe instead of failing a call: text with invalid Unicode, control characters,
terminal escapes or special-token strings (cleaned, neutralised); an animated image (its first frame kept)."""
MESSAGE_CHARS = 300  # of an error message the model reads
DETAIL_CHARS = 4000  # of an error message kept for logs


@dataclass(frozen=True)
class ToolLimits:
    """Bounds on what one tool call may give back."""

    max_text_chars: int = 8192
    """Longer text is refused (``too_large``)."""
    max_images: int = 4
    """More images are refused (``too_large``)."""
    max_image_pixels: int = 4096 * 4096
    """An image with more pixels is refused (``too_large``): enormous, not just over the budget."""
    max_pixels: int = 448 * 448
    """The pixel budget: a returned image over it is shrunk to it (aspect kept)."""

    def __post_init__(self) -> None:
        for name in ("max_text_chars", "max_images", "max_image_pixels", "max_pixels"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"ToolLimits.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.max_pixels > self.max_image_pixels:
            raise ValueError(f"ToolLimits.max_pixels={self.max_pixels} exceeds max_image_pixels="
                             f"{self.max_image_pixels}; the budget must lie within what is accepted")


@dataclass(frozen=True)
class ToolOutput:
    """One call's result for the tool turn: text and/or RGB images, or a failure (``failure`` one of
    :data:`TOOL_FAILURE_KINDS` or of :data:`mmrl.agent.calls.CALL_ERROR_KINDS`; ``text`` then the short message
    the model reads, ``detail`` the full one for logs); ``repairs``: what was made safe in it, each one of
    :data:`TOOL_REPAIR_KINDS`."""

    text: str = ""
    images: tuple[Image.Image, ...] = ()
    failure: str | None = None
    detail: str = ""
    repairs: tuple[str, ...] = ()

    @classmethod
    def failed(cls, kind: str, message: str, detail: str = "") -> ToolOutput:
        """A failure of ``kind``; ``message`` and ``detail`` cleaned (they may quote the tool) and cut."""
        message = clean(message)
        short = message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 3] + "..."
        return cls(text=f"Error: {short}", failure=kind, detail=clean(detail or message, DETAIL_CHARS))


# --- in the worker --------------------------------------------------------------------------------------


def to_plain(result: object, limits: ToolLimits) -> Outcome:
    """A tool's return value -> ``Outcome(value={"text": str, "images": [PNG bytes], "repairs": [kind]})``, or
    its failure."""
    if isinstance(result, str):
        text, images = result, []
    elif isinstance(result, Image.Image):
        text, images = "", [result]
    elif isinstance(result, Mapping) and result and set(result) <= {"text", "images"}:
        text, images = result.get("text", ""), result.get("images", [])
        if not isinstance(text, str) or not isinstance(images, (list, tuple)):
            return _bad_type(f"a dict with text of type {type(text).__name__} and images of type "
                             f"{type(images).__name__}")
    else:
        return _bad_type(f"a {type(result).__name__}")
    if len(text) > limits.max_text_chars:
        return _too_large(f"{len(text)} characters of text, over max_text_chars={limits.max_text_chars}")
    if len(images) > limits.max_images:
        return _too_large(f"{len(images)} images, over max_images={limits.max_images}")
    encoded, repairs = [], []
    for image in images:
        if not isinstance(image, Image.Image):
            return _bad_type(f"an image of type {type(image).__name__} (not a PIL image)")
        if image.width * image.height > limits.max_image_pixels:
            return _too_large(f"a {image.width}x{image.height} image, over max_image_pixels={limits.max_image_pixels}")
        try:
            rgb, made = upright_rgb(image)
            buffer = io.BytesIO()
            rgb.save(buffer, format="PNG")
        except Exception as exc:  # a lazily loaded image whose data is corrupt fails here
            return Outcome(failure="bad_image", message=f"returned an image that cannot be read ({type(exc).__name__}: "
                                                        f"{exc})")
        encoded.append(buffer.getvalue())
        repairs += made
    return Outcome(value={"text": str.__str__(text), "images": encoded, "repairs": repairs})


def _bad_type(what: str) -> Outcome:
    return Outcome(failure="bad_type", message=f"returned {what}; return a str, a PIL image, or a dict with "
                                               "'text' (str) and/or 'images' (list of PIL images)")


def _too_large(what: str) -> Outcome:
    return Outcome(failure="too_large", message=f"returned {what}")


# --- in the driver --------------------------------------------------------------------------------------


def check_outcome(outcome: Outcome, limits: ToolLimits, tool: str) -> ToolOutput:
    """The driver's side of :func:`to_plain`: the call's output for the tool turn, images decoded and capped to
    ``limits.max_pixels`` and its text cleaned (what was made safe in its ``repairs``), or the failure (its
    message naming ``tool``)."""
    if outcome.failure is not None:
        return ToolOutput.failed(outcome.failure, f"tool {tool} failed: {_reason(outcome)}", outcome.message)
    value = outcome.value
    if (not isinstance(value, dict) or not isinstance(value.get("text"), str)
            or not isinstance(value.get("images"), list) or not all(isinstance(b, bytes) for b in value["images"])):
        return ToolOutput.failed("bad_type", f"tool {tool} failed: its worker sent {type(value).__name__}, not text "
                                             "and PNG images")
    if len(value["text"]) > limits.max_text_chars or len(value["images"]) > limits.max_images:
        return ToolOutput.failed("too_large", f"tool {tool} failed: its result is over the limits")
    sent = value.get("repairs")
    repairs = {kind for kind in sent if kind in TOOL_REPAIR_KINDS} if isinstance(sent, list) else set()
    images = []
    for data in value["images"]:
        image = _decode(data, limits)
        if isinstance(image, ToolOutput):
            return ToolOutput.failed(image.failure or "bad_image", f"tool {tool} failed: {image.detail}")
        image, made = image
        repairs.update(made)
        image = fitted(image, limits.max_pixels)
        if isinstance(image, str):
            return ToolOutput.failed("bad_image", f"tool {tool} failed: {image}")
        images.append(image)
    text = clean(value["text"])
    repairs |= {"unsafe_text"} if text != value["text"] else set()
    return ToolOutput(text=text, images=tuple(images), repairs=tuple(k for k in TOOL_REPAIR_KINDS if k in repairs))


def _reason(outcome: Outcome) -> str:
    """What the model is told of a failure: the kind in words, and the error's own message for an error."""
    if outcome.failure == "error":
        return outcome.message
    return {"timeout": "it did not finish in time", "crashed": "its process crashed",
            "memory": "it used too much memory"}.get(outcome.failure or "", outcome.message)


def _decode(data: bytes, limits: ToolLimits) -> tuple[Image.Image, tuple[str, ...]] | ToolOutput:
    """PNG bytes -> an upright RGB image and its repairs (:func:`~mmrl.agent.images.upright_rgb`), its size
    checked before its pixels are expanded."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                if image.width * image.height > limits.max_image_pixels:
                    return ToolOutput(failure="too_large", detail=f"returned a {image.width}x{image.height} image, "
                                                                  f"over max_image_pixels={limits.max_image_pixels}")
                return upright_rgb(image)
    except Image.DecompressionBombError as exc:
        return ToolOutput(failure="too_large", detail=f"returned an enormous image ({exc})")
    except Exception as exc:  # PIL raises many kinds for corrupt data
        return ToolOutput(failure="bad_image", detail=f"returned an image that cannot be read ({type(exc).__name__}: "
                                                      f"{exc})")
