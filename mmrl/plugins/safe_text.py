"""Text that user code returned (a tool's output, a plugin's error message, a judge's answer) made safe to
tokenise, store and print.

Two steps, each idempotent, applied where such text enters the driver:

:func:`clean` (no tokenizer needed) returns valid Unicode text, which the tokenizer accepts (its Rust side takes
only what encodes to UTF-8: a lone surrogate such as ``"\\ud800"`` raised ``TypeError: TextEncodeInput must
be ...``) and a terminal prints as text:

- each surrogate code point (a lone half of a UTF-16 pair; a Python ``str`` can hold one, UTF-8 cannot) becomes
  U+FFFD, the replacement character;
- terminal escape sequences are removed whole, introducer to final byte: CSI (``ESC [``, e.g. colours),
  OSC (``ESC ]``, e.g. window titles, hyperlinks), DCS/SOS/PM/APC strings, two-character escapes, and their
  8-bit C1 forms;
- ``\\r\\n`` and a lone ``\\r`` become ``\\n``; every other C0 control character but ``\\t`` and ``\\n`` (NUL
  included), DEL and the C1 controls (U+0080 to U+009F) are dropped;
- with ``max_chars``, text past it is cut (callers that refuse long text, such as a tool's ``too_large``, check
  the length first).

:func:`neutralise` replaces each occurrence of a reserved string (a tokenizer's special tokens, the strings its
processor expands into media tokens, mmrl's media placeholders: :func:`reserved_strings`) by a space, repeatedly,
until none is left: removing ``<|im_end|>`` from ``<|im_<|im_end|>end|>`` would otherwise join a new one. The
tokenizer matches special tokens in the raw text (their ``normalized`` flag is off in every family mmrl
supports), so text without their strings cannot be encoded into their ids.

Nothing here imports the rest of the library: the processor is read through its attributes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI: parameters, intermediates, final byte
    r"|\x1b[\]PX^_][^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC: a string to BEL or ST
    r"|\x1b[ -/]*[0-~]?"  # any other escape: intermediates, final byte
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
    r"|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"  # 8-bit string controls
)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 but \t and \n (\r is mapped first), DEL, C1


def clean(text: str, max_chars: int | None = None) -> str:
    """``text`` as valid Unicode without control characters or terminal escapes (see the module's docstring),
    cut to ``max_chars`` when given; always an exact ``str``."""
    text = _SURROGATE.sub(REPLACEMENT, str.__str__(text))
    text = _ESCAPE.sub("", text)
    text = _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    return text if max_chars is None or len(text) <= max_chars else text[:max_chars]


def neutralise(text: str, reserved: Iterable[str]) -> str:
    """``text`` with every occurrence of a ``reserved`` string replaced by a space, until none is left (a
    one-character string is removed instead). Each pass shortens the text, so this ends."""
    strings = sorted({s for s in reserved if s}, key=len, reverse=True)
    if not strings:
        return text
    pattern = re.compile("|".join(map(re.escape, strings)))
    while True:
        text, count = pattern.subn(lambda m: " " if len(m.group(0)) > 1 else "", text)
        if not count:
            return text


def made_safe(text: str, reserved: Iterable[str]) -> str:
    """:func:`clean`, then :func:`neutralise`: text that encodes into no reserved string's id."""
    return neutralise(clean(text), reserved)


def reserved_strings(processor: Any, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The strings a text must not hold to be encoded as plain text by ``processor`` (or a bare tokenizer): its
    special tokens (those it lists and the added tokens marked special), the tokens its processor expands into
    media tokens (``image_token``, ``video_token``) and ``extra`` (e.g. a family's vision tokens, mmrl's
    placeholders); longest first."""
    tokenizer = getattr(processor, "tokenizer", processor)
    found = set(tokenizer.all_special_tokens) | set(extra)
    found |= {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    found |= {getattr(processor, name) for name in ("image_token", "video_token")
              if isinstance(getattr(processor, name, None), str)}
    return tuple(sorted((s for s in found if s), key=len, reverse=True))
