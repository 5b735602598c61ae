"""Unicode-aware text normalisation shared by the verifiers.

Models write the same answer in many byte sequences: fullwidth letters
(``ｒｅｄ``), ligatures (``ﬁ``), non-breaking or ideographic spaces,
invisible zero-width characters. :func:`clean_text` folds these to one
spelling; :func:`normalize_text` also case-folds.

Letters from other scripts that merely look alike are *not* mapped: a
Cyrillic ``е`` in ``rеd`` stays Cyrillic and the word does not match
``red``. Unicode's compatibility normalisation (NFKC) does not treat them as
the same character, and mapping look-alikes by hand would also map genuine
Greek or Cyrillic answers onto Latin ones.

NFKC also rewrites some characters a reader may not expect: superscripts
become plain digits (``x²`` -> ``x2``), ``½`` becomes ``1⁄2`` (with a
fraction slash), ``①`` becomes ``1``.

:func:`strip_trailing_special` drops what a chat template leaves after a
response (``<|im_end|>``, whitespace), for the verifiers that check a layout.
"""

from __future__ import annotations

import unicodedata

from mmrl.answer_format import SPECIAL_TOKEN as _SPECIAL_TOKEN

# Invisible characters that NFKC keeps and str.split() does not treat as spaces.
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
_DROP_ZERO_WIDTH = dict.fromkeys(map(ord, ZERO_WIDTH))


def clean_text(text: str) -> str:
    """``text`` in NFKC form without zero-width characters, whitespace runs collapsed to one space.

    Any Unicode space (non-breaking, ideographic, thin, ...) and newline
    counts as whitespace. Case is kept.
    """
    if not isinstance(text, str):
        raise TypeError(f"clean_text expects a str, got {type(text).__name__}")
    # Zero-width characters go first so that the characters around them can compose under NFKC.
    text = unicodedata.normalize("NFKC", text.translate(_DROP_ZERO_WIDTH))
    return " ".join(text.split())


def normalize_text(text: str) -> str:
    """:func:`clean_text`, case-folded (``"Straße"`` -> ``"strasse"``)."""
    return clean_text(text).casefold()


def strip_trailing_special(text: str) -> str:
    """``text`` without trailing whitespace and special tokens such as ``<|im_end|>``."""
    # Index arithmetic rather than one regex anchored at the end, or slicing in the loop: both would be
    # quadratic on hostile text (a long whitespace run, thousands of special tokens).
    end = len(text)
    while True:
        while end and text[end - 1].isspace():
            end -= 1
        start = text.rfind("<|", 0, end - 2) if text.endswith("|>", 0, end) else -1
        if start < 0 or not _SPECIAL_TOKEN.fullmatch(text, start, end):
            return text[:end]
        end = start
