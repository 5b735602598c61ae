"""Math answers: equivalence of the final answer with the ground truth, by the math-verify library.

The final answer is the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) whose braces balance,
else the ``<answer>`` content, else the whole response. The ground truth may be boxed too. Both are
parsed as LaTeX, so ``0.5``, ``1/2``, ``\\frac{1}{2}`` and ``\\dfrac12`` are equal, ``x=2`` matches
``2``, ``\\{1,2\\}`` matches ``\\{2,1\\}``. An answer holding ``$``, ``\\(`` or ``\\[`` around part of
it (``The answer is $2$``) is searched for its math; any other answer is read as one LaTeX expression,
so ``The answer is 2`` does not match ``2``: box the answer or tag it.

math-verify bounds its work with ``signal.alarm``, which only works in the main thread, and mmrl runs
reward functions in worker threads. So its timeouts are off here and hostile answers are refused before
they reach the slow parts instead, scoring 0:

* before parsing (parsing LaTeX costs up to tens of milliseconds per bracket): an answer over
  :data:`MAX_ANSWER_CHARS` characters, with over :data:`MAX_BRACKETS` opening brackets or nested over
  :data:`MAX_NESTING` deep;
* before comparing (SymPy computes exact numbers and expands polynomials): an expression that would build
  a number of over :data:`MAX_DIGITS` digits (``9^{9^{9^9}}``, ``10^{10^{10}}``, ``100000!``), raise an
  expression with variables to a power over :data:`MAX_VARIABLE_EXPONENT` (``(x+1)^{1000000}``), expand
  to over :data:`MAX_TERMS` terms (also over a common denominator), hold a set of over
  :data:`MAX_SET_ELEMENTS` elements with variables, or hold an unevaluated integral, sum, product, limit
  or derivative.

These limits are far above what a final answer needs. An answer math-verify cannot parse or compare
scores 0 (it reports that by an empty parse or a failed comparison, not by raising); an exception that
escapes is a fault, not a wrong answer, so it is raised and the reward stage counts it as an ``error``.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from math_verify import LatexExtractionConfig, parse, verify
from sympy import Basic, Derivative, FiniteSet, Integral, Limit, Pow, Product, Sum, cosh, exp, sinh
from sympy.functions.combinatorial.factorials import (
    FallingFactorial,
    RisingFactorial,
    binomial,
    factorial,
    factorial2,
    subfactorial,
)
from sympy.functions.combinatorial.numbers import fibonacci, lucas
from sympy.functions.special.gamma_functions import gamma
from sympy.matrices import MatrixBase
from sympy.matrices.expressions import MatPow

from mmrl.answer_format import extract_answer

MAX_ANSWER_CHARS = 1000
"""Final answers (and ground truths) longer than this score 0 without being parsed."""

MAX_BRACKETS = 64
"""The most opening brackets, ``(``, ``[`` or ``{``, a final answer may hold."""

MAX_NESTING = 10
"""The deepest a final answer's brackets may nest."""

MAX_DIGITS = 10_000
"""The most digits an exact number in a parsed answer may have (bounded from above, not computed)."""

MAX_VARIABLE_EXPONENT = 100
"""The largest constant power of an expression with variables, as in ``(x+1)^{100}``."""

MAX_TERMS = 1_000
"""The most terms a parsed answer may expand to (bounded from above, not computed)."""

MAX_SET_ELEMENTS = 10
"""The most elements a set with variables may have (comparing two sets compares every pair)."""

MAX_NODES = 5_000
"""The most SymPy nodes a parsed answer may have."""

_UNEVALUATED = (Integral, Sum, Product, Limit, Derivative)
_EXPONENTIAL = (exp, sinh, cosh)
_FAST_GROWING = (factorial, factorial2, subfactorial, gamma, binomial, RisingFactorial, FallingFactorial,
                 fibonacci, lucas)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)
_BRACKET = re.compile(r"[(\[{]|[)\]}]")
_MATH_DELIMITER = re.compile(r"\$|\\\(|\\\[")
# An answer that is one delimited formula: $...$, $$...$$, \(...\) or \[...\].
_WRAPPED = re.compile(
    r"\$\$([^$]*)\$\$|\$([^$]*)\$|\\\(((?:(?!\\\)).)*)\\\)|\\\[((?:(?!\\\]).)*)\\\]", re.DOTALL
)
_LATEX_ONLY = [LatexExtractionConfig()]


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` whose braces balance, or None."""
    starts = [match.end() - 1 for match in _BOXED.finditer(text)]  # the index of each box's "{"
    if not starts:
        return None
    closing = _matching_braces(text, starts[0])
    for start in reversed(starts):
        if start in closing:
            return text[start + 1 : closing[start]]
    return None


def _matching_braces(text: str, begin: int) -> dict[int, int]:
    """The index of the ``}`` closing each ``{`` from ``begin`` on; ``\\{`` and ``\\}`` do not count."""
    open_at: list[int] = []
    closing: dict[int, int] = {}
    for match in _BRACE_OR_ESCAPE.finditer(text, begin):
        if match[0] == "{":
            open_at.append(match.start())
        elif match[0] == "}" and open_at:
            closing[open_at.pop()] = match.start()
    return closing


def final_answer(response: str) -> str | None:
    """The last balanced ``\\boxed{}``'s content, else :func:`mmrl.answer_format.extract_answer`'s answer."""
    boxed = last_boxed(response)
    if boxed is None:
        return extract_answer(response)
    return boxed.strip() or None


def math_answer(response: str, ground_truth: str) -> float:
    """1.0 if the response's final answer is mathematically equal to the ground truth, else 0.0.

    See the module docstring for what counts as the final answer and which answers are refused.
    """
    if not isinstance(response, str):
        raise TypeError(f"math_answer expects the response as a str, got {type(response).__name__}")
    answer = final_answer(response)
    if answer is None:
        return 0.0
    truth = last_boxed(ground_truth)
    truth = ground_truth.strip() if truth is None else truth.strip()
    if not truth or not _is_small(answer) or not _is_small(truth):
        return 0.0
    gold, given = _parse(truth), _parse(answer)
    if not gold or not given or not all(_is_tame(expr) for expr in gold + given):
        return 0.0
    return 1.0 if verify(gold, given, timeout_seconds=None) else 0.0


def _is_small(answer: str) -> bool:
    """Whether ``answer`` is within the length and bracket limits, see the module docstring."""
    if len(answer) > MAX_ANSWER_CHARS:
        return False
    depth = opened = 0
    for bracket in _BRACKET.finditer(answer):
        if bracket[0] in "([{":
            depth, opened = depth + 1, opened + 1
            if depth > MAX_NESTING or opened > MAX_BRACKETS:
                return False
        else:
            depth = max(depth - 1, 0)
    return True


def _parse(answer: str) -> list:
    """math-verify's parse of one answer: its math if delimited, else the whole answer as LaTeX."""
    wrapped = _WRAPPED.fullmatch(answer)
    if wrapped is not None:
        answer = next(group for group in wrapped.groups() if group is not None)
    elif _MATH_DELIMITER.search(answer):
        return parse(answer, extraction_config=_LATEX_ONLY, parsing_timeout=None)
    return parse(f"\\boxed{{{answer}}}", extraction_config=_LATEX_ONLY, parsing_timeout=None)


class _TooHard(Exception):
    """An expression SymPy could take unbounded time or memory to compare."""


class _Size(NamedTuple):
    """Upper bounds on what SymPy may build from an expression."""

    digits: float  # digits of its exact value
    variable: bool  # whether it has variables
    log_terms: float  # log10 of the number of terms of its numerator, multiplied out
    log_denominator_terms: float  # the same for its denominator


_ONE_TERM = 0.0  # log10(1)


def _is_tame(expr: object) -> bool:
    """Whether comparing ``expr`` is cheap: see the module docstring. Strings always are."""
    if not isinstance(expr, (Basic, MatrixBase)):
        return True
    try:
        _size(expr, [0])
    except _TooHard:
        return False
    return True


def _size(expr: Basic | MatrixBase, nodes: list[int]) -> _Size:
    """The :class:`_Size` of ``expr``; raises _TooHard past the limits. ``nodes`` counts the nodes seen."""
    nodes[0] += 1
    if nodes[0] > MAX_NODES or isinstance(expr, _UNEVALUATED):
        raise _TooHard
    if isinstance(expr, MatrixBase):
        return _combine([_size(entry, nodes) for entry in expr], expr)
    if expr.is_Symbol:
        return _Size(1.0, True, _ONE_TERM, _ONE_TERM)
    if expr.is_Rational:
        return _constant(math.log10(max(abs(expr.p), 1)) + math.log10(expr.q))
    if expr.is_Float:
        _sign, _mantissa, exponent, bits = expr._mpf_
        return _constant(15 + abs(exponent + bits) * math.log10(2))
    if expr.is_Atom:  # pi, E, I, oo, ...
        return _constant(1.0)
    if isinstance(expr, (Pow, MatPow)):
        return _power_size(_size(expr.args[0], nodes), expr.args[1], _size(expr.args[1], nodes))
    parts = [_size(arg, nodes) for arg in expr.args]
    if isinstance(expr, _EXPONENTIAL) and len(parts) == 1:  # exp(a) is e^a
        return _power_size(_constant(1.0), expr.args[0], parts[0])
    if isinstance(expr, _FAST_GROWING) and not any(part.variable for part in parts):
        n = 10 ** min(max(part.digits for part in parts), 20.0)  # bounds every argument
        if n > MAX_DIGITS:
            raise _TooHard
        return _constant(n * math.log10(n + 1))
    if isinstance(expr, FiniteSet) and len(parts) > MAX_SET_ELEMENTS and any(part.variable for part in parts):
        raise _TooHard  # comparing two sets compares every pair of elements
    return _combine(parts, expr)


def _constant(digits: float) -> _Size:
    return _checked(_Size(digits, False, _ONE_TERM, _ONE_TERM))


def _combine(parts: list[_Size], expr: object) -> _Size:
    """The size of a sum, product, function, set, ... of ``parts``."""
    digits = sum(part.digits for part in parts)
    variable = any(part.variable for part in parts)
    if getattr(expr, "is_Add", False):
        # Over a common denominator: the product of the denominators, each numerator times the others.
        denominator = sum(part.log_denominator_terms for part in parts)
        if denominator > math.log10(MAX_TERMS):
            raise _TooHard
        numerator = math.log10(
            sum(10 ** (part.log_terms + denominator - part.log_denominator_terms) for part in parts)
        )
    elif getattr(expr, "is_Mul", False):
        numerator = sum(part.log_terms for part in parts)
        denominator = sum(part.log_denominator_terms for part in parts)
    else:  # a function, set, matrix, relation, ...: its largest argument
        numerator = max((part.log_terms for part in parts), default=_ONE_TERM)
        denominator = max((part.log_denominator_terms for part in parts), default=_ONE_TERM)
    return _checked(_Size(digits, variable, numerator, denominator))


def _power_size(base: _Size, exponent_expr: Basic, exponent: _Size) -> _Size:
    """The size of ``base ** exponent``."""
    if exponent.variable:  # 2^x stays as it is
        return _checked(_Size(base.digits + exponent.digits, True, _ONE_TERM, _ONE_TERM))
    if getattr(exponent_expr, "is_Number", False):
        power = abs(float(exponent_expr)) if exponent.digits <= 20 else math.inf  # float() would overflow
        negative = bool(exponent_expr.is_negative)
    else:
        power = 10 ** min(exponent.digits, 20.0)
        negative = None  # unknown: count the terms both ways
    if not base.variable:
        return _constant(power * max(base.digits, 0.5))
    if power > MAX_VARIABLE_EXPONENT:
        raise _TooHard
    n = math.ceil(power)
    numerator = _log_power_terms(base.log_terms, n)
    denominator = _log_power_terms(base.log_denominator_terms, n)
    if negative:
        numerator, denominator = denominator, numerator
    elif negative is None:
        numerator = denominator = max(numerator, denominator)
    return _checked(_Size(power * base.digits, True, numerator, denominator))


def _log_power_terms(log_terms: float, n: int) -> float:
    """log10 of the terms of a k-term sum to the n-th power, multiplied out: C(n + k - 1, k - 1)."""
    k = 10**log_terms
    return (math.lgamma(n + k) - math.lgamma(n + 1) - math.lgamma(k)) / math.log(10)


def _checked(size: _Size) -> _Size:
    # "not <=" also refuses NaN.
    limit = math.log10(MAX_TERMS)
    if not (size.digits <= MAX_DIGITS and size.log_terms <= limit and size.log_denominator_terms <= limit):
        raise _TooHard
    return size
