"""Numeric answers: one number, compared with a tolerance.

A number is written with an optional sign (``-``, ``+`` or the Unicode minus ``−``), digits with optional
thousands separators (``1,234``: a comma must be followed by exactly three digits, so ``3,5`` is the two
numbers 3 and 5), an optional decimal part (``.5``, ``2.50``), an optional exponent (``1e-3``) and an
optional percent sign. Digits glued to a letter (``x2``, ``km2``) are not numbers; units after a space are
ignored (``5 km``). Fractions like ``1/2`` are two numbers; use the ``math`` verifier for those.

Percentages: when the ground truth is a percentage (``"50%"``), the answer is compared as written with
or without its percent sign (``50`` and ``50%`` both match). Otherwise an answer ``"50%"`` means 0.5.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping

from mmrl.answer_format import extract_answer
from rewards.text import clean_text

DEFAULT_REL_TOL = 1e-6

_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-+]?)"
    r"(?P<digits>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?P<exponent>[eE][-+]?\d+)?"
    r"(?P<percent> ?%)?"
)


def find_numbers(text: str) -> list[tuple[float, bool]]:
    """Every number in ``text`` as (value as written, whether it had a percent sign), in order.

    A value too large for a float is ``inf``.
    """
    text = clean_text(text).replace("\u2212", "-")
    return [
        (
            float(f"{m['sign']}{m['digits'].replace(',', '')}{m['exponent'] or ''}"),
            m["percent"] is not None,
        )
        for m in _NUMBER.finditer(text)
    ]


def single_number(text: str) -> tuple[float, bool] | None:
    """The one finite number in ``text`` (repeating it is fine), or None if it has none or several."""
    distinct = set(find_numbers(text))
    if len(distinct) != 1:
        return None
    value, percent = distinct.pop()
    return (value, percent) if math.isfinite(value) else None


def numeric(response: str, ground_truth: str, extra: Mapping | None = None) -> float:
    """1.0 if the answer's one number equals the ground truth's within tolerance, else 0.0.

    The tolerance is ``math.isclose``'s: relative ``extra["rel_tol"]`` (default 1e-6) and absolute
    ``extra["abs_tol"]`` (default 0). An answer with no number, several different numbers or a
    non-finite one (``1e999``) scores 0.
    """
    rel_tol = _tolerance(extra, "rel_tol", DEFAULT_REL_TOL)
    abs_tol = _tolerance(extra, "abs_tol", 0.0)
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    truth, given = single_number(ground_truth), single_number(answer)
    if truth is None or given is None:
        return 0.0
    (truth_value, truth_percent), (value, percent) = truth, given
    if percent and not truth_percent:
        value /= 100
    return 1.0 if math.isclose(value, truth_value, rel_tol=rel_tol, abs_tol=abs_tol) else 0.0


def _tolerance(extra: Mapping | None, key: str, default: float) -> float:
    value = None if extra is None else extra.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"numeric verifier: extra[{key!r}] must be a finite number >= 0, got {value!r}")
    # A data set where only some rows set a tolerance has NaN in the others.
    if math.isnan(value):
        return default
    if not 0 <= value < math.inf:
        raise ValueError(f"numeric verifier: extra[{key!r}] must be a finite number >= 0, got {value!r}")
    return float(value)
