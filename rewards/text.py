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
"""

from __future__ import annotations

import unicodedata

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
