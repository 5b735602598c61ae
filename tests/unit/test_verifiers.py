"""Unit tests of the built-in verifiers: correct, wrong and hostile answers, each with its exact score."""

from __future__ import annotations

import inspect
import random
import threading
import time

import pytest
from PIL import Image

from rewards import answer_match, format_reward, normalize, resolve
from rewards.choice import choice_letter, multiple_choice
from rewards.counting import count_match, single_count
from rewards.grounding import box_iou, grounding_hit, grounding_iou, parse_box
from rewards.math_answer import MAX_ANSWER_CHARS, final_answer, last_boxed, math_answer
from rewards.numeric import find_numbers, numeric
from rewards.shaping import overlong_penalty, think_format
from rewards.text import clean_text, normalize_text, strip_trailing_special
from rewards.verifiers import BUILTINS

MB = 1_000_000
CYRILLIC_E = "\u0435"  # looks like the Latin "e"


# --- text normalisation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ｒｅｄ", "red"),  # fullwidth letters
        ("ＲＥＤ", "red"),
        ("\ufb01ne", "fine"),  # the "fi" ligature
        ("r\u200bed", "red"),  # zero-width space
        ("\ufeffred\u2060", "red"),  # byte-order mark, word joiner
        ("r\u200c\u200ded", "red"),  # zero-width (non-)joiner
        ("dark\u00a0red", "dark red"),  # non-breaking space
        ("dark\u3000\u2009 red", "dark red"),  # ideographic and thin spaces
        ("  Dark \n\t Red  ", "dark red"),
        ("Straße", "strasse"),  # casefold, not lower
        ("１２３", "123"),
        (f"r{CYRILLIC_E}d", f"r{CYRILLIC_E}d"),  # homoglyphs are not mapped
        ("", ""),
    ],
)
def test_normalize_text(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


def test_clean_text_keeps_case() -> None:
    assert clean_text(" Ｄark\u00a0\u200bRed ") == "Dark Red"


def test_normalize_text_rejects_non_string() -> None:
    with pytest.raises(TypeError, match="str"):
        normalize_text(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("＂Ｒｅｄ＂．", "red"),  # fullwidth quotes and full stop
        ("'red\u200b'", "red"),
        ("red\u00a0!", "red"),
        ("DARK\nRED.", "dark red"),
    ],
)
def test_normalize_uses_unicode_normalisation(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<answer>ｒｅｄ</answer>", 1.0),
        ("<answer>r\u200bed</answer>", 1.0),
        ("<answer>\n\n  RED \n</answer>", 1.0),
        ("<answer>\u00a0red\u00a0</answer>", 1.0),
        (f"<answer>r{CYRILLIC_E}d</answer>", 0.0),  # Cyrillic homoglyph
        ("<answer>r ed</answer>", 0.0),
    ],
)
def test_answer_match_unicode(response: str, expected: float) -> None:
    assert answer_match(response, "red") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("red<|im_end|>", "red"),
        ("red <|im_end|>\n<|endoftext|>  ", "red"),
        ("red<|a|b|>", "red<|a|b|>"),  # not a special token
        ("red|>", "red|>"),
        ("<|im_end|>", ""),
        ("", ""),
    ],
)
def test_strip_trailing_special(text: str, expected: str) -> None:
    assert strip_trailing_special(text) == expected


@pytest.mark.timeout(20)
def test_format_reward_on_hostile_tails() -> None:
    assert format_reward("<answer>red</answer>" + "<|im_end|>" * 100_000) == 1.0
    assert format_reward(" " * MB + "x") == 0.0
    assert format_reward("<answer>red</answer>" + " \n" * (MB // 2)) == 1.0


# --- multiple_choice ---------------------------------------------------------------------------

CHOICE_CASES = [
    ("B", 1.0),
    ("(B)", 1.0),
    ("[B]", 1.0),
    ("B.", 1.0),
    ("b)", 1.0),
    ("B:", 1.0),
    ("Option B", 1.0),
    ("answer: B", 1.0),
    ("Answer: Option (B)", 1.0),
    ("The answer is (B).", 1.0),
    ("B. the cat", 1.0),
    ("(B) A cat on a mat", 1.0),  # "A" starts the option's text, it is not option A
    ("B) the cat", 1.0),
    ("**B**", 1.0),
    ("\\boxed{B}", 1.0),
    ("（Ｂ）", 1.0),  # fullwidth
    ("  B \n", 1.0),
    ("A", 0.0),
    ("(C)", 0.0),
    ("A or B", 0.0),  # several letters
    ("A, C", 0.0),
    ("B, C", 0.0),
    ("(A) (B)", 0.0),
    ("B. or C", 0.0),
    ("(B) or (C)", 0.0),
    ("B. vitamin C.", 0.0),  # documented: a trailing capital letter reads as another option
    ("AB", 0.0),
    ("Bx", 0.0),
    ("a cat", 0.0),
    ("B the cat", 0.0),  # a letter followed by text needs a delimiter
    ("Options: B", 0.0),
    ("I think B", 0.0),
    ("\u0412", 0.0),  # Cyrillic capital Ve looks like B
    ("", 0.0),
]


@pytest.mark.parametrize(("answer", "expected"), CHOICE_CASES)
def test_multiple_choice(answer: str, expected: float) -> None:
    assert multiple_choice(f"<answer>{answer}</answer>", "B") == expected


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("<answer>B</answer>", "(B)", 1.0),
        ("<answer>b</answer>", "B", 1.0),
        ("B", "B", 1.0),  # bare answer
        ("<answer>A</answer> <answer>B</answer>", "B", 1.0),  # the last answer counts
        ("<answer>B</answer> <answer>A</answer>", "B", 0.0),
        ("<answer>B", "B", 0.0),  # unclosed
        ("<answer><answer>B</answer>", "B", 1.0),  # nested: the inner pair
        ("<answer>B</answer>", "", 0.0),
        ("<answer>B</answer>", "B or C", 0.0),  # a ground truth naming two options matches nothing
    ],
)
def test_multiple_choice_tags_and_ground_truth(response: str, truth: str, expected: float) -> None:
    assert multiple_choice(response, truth) == expected


def test_choice_letter() -> None:
    assert choice_letter("(d) the dog") == "D"
    assert choice_letter("A or B") is None


@pytest.mark.timeout(20)
def test_multiple_choice_hostile() -> None:
    assert multiple_choice("x" * MB + "<answer>(B)</answer>", "B") == 1.0
    assert multiple_choice("<answer>B. " + "the cat " * 100_000 + "</answer>", "B") == 1.0
    assert multiple_choice("<answer>B. " + "A. " * 300_000 + "</answer>", "B") == 0.0
    assert multiple_choice("<answer>" + "(" * MB + "</answer>", "B") == 0.0


# --- numeric -----------------------------------------------------------------------------------

NUMERIC_CASES = [
    ("42", "42", 1.0),
    ("42.0", "42", 1.0),
    ("+42", "42", 1.0),
    ("-3.5", "-3.5", 1.0),
    ("\u22123.5", "-3.5", 1.0),  # Unicode minus
    ("3.5", "-3.5", 0.0),
    (".5", "0.5", 1.0),
    ("1,234", "1234", 1.0),
    ("1,234,567.5", "1234567.5", 1.0),
    ("1e-3", "0.001", 1.0),
    ("2.5E3", "2500", 1.0),
    ("１２", "12", 1.0),  # fullwidth digits
    ("x = 42", "42", 1.0),
    ("42 km", "42", 1.0),
    ("42 apples, that is 42", "42", 1.0),  # repeating the number is fine
    ("42.0000001", "42", 1.0),  # within the default relative tolerance 1e-6
    ("42.001", "42", 0.0),
    ("43", "42", 0.0),
    ("3 or 4", "3", 0.0),  # several numbers
    ("1,2345", "12345", 0.0),  # not a thousands separator: the numbers 1 and 2345
    ("3,5", "3.5", 0.0),  # a decimal comma reads as two numbers
    ("2/4", "0.5", 0.0),  # fractions are two numbers
    ("x2", "2", 0.0),  # digits glued to a letter are not a number
    ("inf", "1", 0.0),
    ("nan", "1", 0.0),
    ("1e999", "1", 0.0),  # overflows to inf
    ("9" * 400, "1", 0.0),
    ("", "1", 0.0),
    ("forty-two", "42", 0.0),
    # Percentages: "50%" is 0.5 unless the ground truth is a percentage.
    ("50%", "0.5", 1.0),
    ("50 %", "0.5", 1.0),
    ("50%", "50", 0.0),
    ("50%", "50%", 1.0),
    ("50", "50%", 1.0),
    ("0.5", "50%", 0.0),
]


@pytest.mark.parametrize(("answer", "truth", "expected"), NUMERIC_CASES)
def test_numeric(answer: str, truth: str, expected: float) -> None:
    assert numeric(f"<answer>{answer}</answer>", truth) == expected


@pytest.mark.parametrize(
    ("answer", "extra", "expected"),
    [
        ("3.14", {"rel_tol": 1e-3}, 1.0),  # |3.14 - 3.14159| / 3.14159 = 5.1e-4
        ("3.14", {"rel_tol": 1e-4}, 0.0),
        ("3.14", {"abs_tol": 0.002}, 1.0),
        ("3.14", {"abs_tol": 0.001}, 0.0),
        ("3.14", {"rel_tol": None, "abs_tol": float("nan")}, 0.0),  # unset: the defaults
        ("3.14159", {}, 1.0),
    ],
)
def test_numeric_tolerance(answer: str, extra: dict, expected: float) -> None:
    assert numeric(f"<answer>{answer}</answer>", "3.14159", extra) == expected


@pytest.mark.parametrize(
    "extra", [{"rel_tol": -1}, {"abs_tol": "0.1"}, {"rel_tol": float("inf")}, {"abs_tol": True}]
)
def test_numeric_rejects_bad_tolerance(extra: dict) -> None:
    with pytest.raises(ValueError, match="numeric verifier"):
        numeric("<answer>1</answer>", "1", extra)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("<answer>1</answer> <answer>2</answer>", "2", 1.0),
        ("<answer>2", "2", 0.0),  # unclosed
        ("The total is 7", "7", 1.0),  # a bare answer is the whole text
        ("<answer>7</answer>", "seven", 0.0),  # the ground truth has no number
        ("<answer>7</answer>", "7 or 8", 0.0),
    ],
)
def test_numeric_tags_and_ground_truth(response: str, truth: str, expected: float) -> None:
    assert numeric(response, truth) == expected


def test_find_numbers() -> None:
    assert find_numbers("a -1,000.5 b 2e3 and 7 %") == [(-1000.5, False), (2000.0, False), (7.0, True)]


@pytest.mark.timeout(20)
def test_numeric_hostile() -> None:
    assert numeric("x" * MB + "<answer>42</answer>", "42") == 1.0
    assert numeric("<answer>" + "1 " * (MB // 2) + "</answer>", "1") == 1.0
    assert numeric("<answer>" + "1 2 " * (MB // 4) + "</answer>", "1") == 0.0
    assert numeric("<answer>" + "9" * MB + "</answer>", "1") == 0.0
    assert numeric("<answer>" + "1," * (MB // 2) + "</answer>", "1") == 1.0  # "1,1,1,...": only 1s


# --- math --------------------------------------------------------------------------------------

MATH_CASES = [
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("<answer>0.5</answer>", "\\frac{1}{2}", 1.0),
    ("<answer>1/2</answer>", "\\frac12", 1.0),
    ("<answer>\\dfrac{2}{4}</answer>", "1/2", 1.0),
    ("<answer>x=2</answer>", "2", 1.0),
    ("<answer>2</answer>", "x=2", 1.0),
    ("\\boxed{2x+1}", "1+2x", 1.0),
    ("\\boxed{\\{1,2\\}}", "\\{2,1\\}", 1.0),
    ("\\boxed{(1,2)}", "(1,2)", 1.0),
    ("The answer is $\\frac{\\sqrt2}{2}$", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("<answer>3</answer>", "$3$", 1.0),
    ("<answer>3</answer>", "\\boxed{3}", 1.0),
    ("<answer>1,000</answer>", "1000", 1.0),
    ("We get \\boxed{4}.<|im_end|>", "4", 1.0),
    ("<answer>so \\boxed{4}</answer>", "4", 1.0),
    ("\\boxed{3} then \\boxed{4}", "4", 1.0),  # the last box
    ("\\boxed{3} then \\boxed{4}", "3", 0.0),
    ("\\boxed{\\boxed{4}}", "4", 1.0),
    ("\\boxed{4} \\boxed{5", "4", 1.0),  # the last box whose braces balance
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("\\boxed{[0,1)}", "(0,1)", 0.0),
    ("\\boxed{x+1}", "x+2", 0.0),
    ("<answer>4</answer>", "5", 0.0),
    ("The answer is 2", "2", 0.0),  # documented: box or tag the answer
    ("<answer>2", "2", 0.0),  # unclosed tag, no box
    ("\\boxed{}", "2", 0.0),
    ("<answer>2</answer>", "", 0.0),
]


@pytest.mark.parametrize(("response", "truth", "expected"), MATH_CASES)
def test_math_answer(response: str, truth: str, expected: float) -> None:
    assert math_answer(response, truth) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a \\boxed{1} b \\boxed{\\frac{2}{3}} c", "\\frac{2}{3}"),
        ("\\boxed{\\{1\\}}", "\\{1\\}"),  # escaped braces do not count
        ("\\boxed {x}", "x"),
        ("\\fbox{7}", "7"),
        ("\\boxed{1} \\boxed{2", "1"),
        ("\\boxed{", None),
        ("no box", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_final_answer_falls_back_to_the_answer_tag() -> None:
    assert final_answer("<answer> 7 </answer>") == "7"
    assert final_answer("<answer>1</answer> \\boxed{2}") == "2"


HOSTILE_MATH = [
    "9^9^9^9^9",
    "10**10**10",
    "9^{9^{9^{9^9}}}",
    "10^{10^{10}}",
    "2^{2^{2^{2^{2^{2}}}}}",
    "100000!",
    "((3!)!)!",
    "\\binom{10^6}{5000}",
    "1e999999",
    "(x+1)^{1000000}",
    "\\left(\\frac{1}{3}\\right)^{1000000}",
    "\\begin{pmatrix}1&1\\\\1&0\\end{pmatrix}^{1000000}",
    "e^{e^{e^{e^{e^{e}}}}}",
    "\\sinh(\\sinh(\\sinh(\\sinh(\\sinh(9)))))",
    "\\prod_{i=1}^{10^9} i",
    "\\int_0^1 x^{1000000} dx",
    "".join(f"(x+{i})^{{9}}" for i in range(20)),  # expands to 10^20 terms
    "+".join(f"\\frac{{1}}{{x+{i}}}" for i in range(20)),  # a common denominator of 2^20 terms
    "\\{" + ",".join(f"x_{i}" for i in range(20)) + "\\}",  # sets compare every pair of elements
    "{" * 400 + "1" + "}" * 400,
    "(" * 300 + "1" + ")" * 300,
    "x^{" * 100 + "1" + "}" * 100,
    ",".join(["[1]"] * 200),  # too many brackets
    "1+" * 600 + "1",  # too long
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("expression", HOSTILE_MATH)
def test_math_answer_refuses_hostile_expressions_quickly(expression: str) -> None:
    start = time.monotonic()
    assert math_answer(f"\\boxed{{{expression}}}", "2") == 0.0
    assert math_answer("<answer>2</answer>", expression) == 0.0  # a hostile ground truth too
    assert time.monotonic() - start < 10


def test_math_answer_keeps_large_but_tame_numbers() -> None:
    assert math_answer("\\boxed{2^{1000}}", "2^{1000}") == 1.0
    assert math_answer("\\boxed{(x+1)^{2}}", "x^2+2x+1") == 1.0
    assert math_answer("\\boxed{20!}", "2432902008176640000") == 1.0


def test_math_answer_length_limit() -> None:
    assert math_answer("\\boxed{" + "1" * MAX_ANSWER_CHARS + "}", "1" * MAX_ANSWER_CHARS) == 1.0
    assert math_answer("\\boxed{" + "1" * (MAX_ANSWER_CHARS + 1) + "}", "1" * (MAX_ANSWER_CHARS + 1)) == 0.0


def test_math_answer_works_outside_the_main_thread() -> None:
    # math-verify's own timeouts use signal.alarm, which raises in a worker thread.
    results: list[float] = []
    thread = threading.Thread(target=lambda: results.append(math_answer("\\boxed{\\frac{1}{2}}", "0.5")))
    thread.start()
    thread.join(timeout=20)
    assert results == [1.0]


def test_math_answer_unparsable_is_wrong_but_a_fault_is_a_counted_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import rewards.math_answer as module
    from rewards import RewardInput, RewardManager

    unparsable = [RewardInput(response=r, ground_truth="2") for r in ("\\boxed{\\frac{}{}}", "<answer>$$</answer>", "\\boxed{=}")]
    result = RewardManager(["math"], isolation="inline").score(unparsable)["math"]
    assert result.scores == [0.0, 0.0, 0.0] and not any(result.failed)

    def broken(*args: object, **kwargs: object) -> bool:  # no real answer makes math-verify raise: a fault injected
        raise RuntimeError("sympy fault")

    monkeypatch.setattr(module, "verify", broken)
    with pytest.raises(RuntimeError, match="sympy fault"):
        math_answer("\\boxed{2}", "2")
    result = RewardManager(["math"], isolation="inline").score([RewardInput(response="\\boxed{2}", ground_truth="2")])["math"]
    assert result.failures["error"] == 1 and "sympy fault" in result.errors[0]


@pytest.mark.timeout(20)
def test_math_answer_hostile_responses() -> None:
    assert math_answer("x" * MB + "\\boxed{4}", "4") == 1.0
    assert math_answer("\\boxed{" * 140_000, "4") == 0.0
    assert math_answer("{" * MB + "\\boxed{4}", "4") == 1.0
    assert math_answer("<answer>" * 100_000, "4") == 0.0
    assert math_answer("\\boxed{4}" + "}" * MB, "4") == 1.0


# --- count -------------------------------------------------------------------------------------

COUNT_CASES = [
    ("3", 1.0),
    ("three", 1.0),
    ("Three.", 1.0),
    ("THREE", 1.0),
    ("3 circles", 1.0),
    ("There are three circles.", 1.0),
    ("three (3)", 1.0),
    ("3.0", 1.0),
    ("３", 1.0),  # fullwidth
    ("4", 0.0),
    ("3 or 4", 0.0),
    ("3 circles, one of them red", 0.0),  # documented: any second number
    ("-3", 0.0),
    ("2.5", 0.0),
    ("3%", 0.0),
    ("thr\u0435e", 0.0),  # Cyrillic "e"
    ("threefold", 0.0),
    ("", 0.0),
]


@pytest.mark.parametrize(("answer", "expected"), COUNT_CASES)
def test_count_match(answer: str, expected: float) -> None:
    assert count_match(f"<answer>{answer}</answer>", "3") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("twenty", 20), ("Zero", 0), ("0", 0), ("1,000", 1000), ("twenty-one", None), ("seventeen", 17),
        ("none", None),
    ],
)
def test_single_count(text: str, expected: int | None) -> None:
    assert single_count(text) == expected


def test_count_match_ground_truth_in_words() -> None:
    assert count_match("<answer>7</answer>", "seven") == 1.0
    assert count_match("<answer>7</answer>", "") == 0.0


@pytest.mark.timeout(20)
def test_count_match_hostile() -> None:
    assert count_match("x" * MB + "<answer>three</answer>", "3") == 1.0
    assert count_match("<answer>" + "three " * 150_000 + "</answer>", "3") == 1.0
    assert count_match("<answer>" + "three four " * 100_000 + "</answer>", "3") == 0.0
    assert count_match("<answer>" + "1" * MB + "</answer>", "3") == 0.0


# --- grounding ---------------------------------------------------------------------------------

ORIGINAL = [Image.new("RGB", (400, 200))]  # width 400, height 200
MODEL_SIZES = [(200, 100)]  # the processor halved it


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[10, 20, 30, 40]", (10.0, 20.0, 30.0, 40.0)),
        ("(10,20,30,40)", (10.0, 20.0, 30.0, 40.0)),
        ("[10 20 30 40]", (10.0, 20.0, 30.0, 40.0)),
        ("(10,20),(30,40)", (10.0, 20.0, 30.0, 40.0)),
        ("(10, 20) (30, 40)", (10.0, 20.0, 30.0, 40.0)),
        ("10 20 30 40", (10.0, 20.0, 30.0, 40.0)),
        ("10, 20, 30, 40", (10.0, 20.0, 30.0, 40.0)),
        ("[10.5, 20, 30.25, 40]", (10.5, 20.0, 30.25, 40.0)),
        ('```json\n[{"bbox_2d": [10, 20, 30, 40], "label": "cat 2"}]\n```', (10.0, 20.0, 30.0, 40.0)),
        ("[1, 2, 3, 4] no, [10, 20, 30, 40]", (10.0, 20.0, 30.0, 40.0)),  # several boxes: the last
        ("[[[[10, 20, 30, 40]]]]", (10.0, 20.0, 30.0, 40.0)),
        ("［１０，２０，３０，４０］", (10.0, 20.0, 30.0, 40.0)),  # fullwidth
        ("[10, 20, 30]", None),
        ("[10, 20, 30, 40, 50]", None),
        ("the box is 10 20 30 40", None),  # bare numbers only as the whole answer
        ("[" + "9" * 400 + ", 0, 1, 1]", None),  # not finite
        ("", None),
    ],
)
def test_parse_box(text: str, expected: tuple | None) -> None:
    assert parse_box(text) == expected


def test_box_iou_by_hand() -> None:
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert box_iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0  # touching
    assert box_iou((10, 0, 0, 10), (0, 0, 10, 10)) == 0.0  # inverted


def test_grounding_rescales_from_model_coordinates() -> None:
    # Model box (50, 25)-(100, 75) in a 200x100 image is (100, 50)-(200, 150) in the 400x200 original.
    response = "<answer>[50, 25, 100, 75]</answer>"
    exact = grounding_iou(response, "[100, 50, 200, 150]", ORIGINAL, MODEL_SIZES)
    assert exact == {"score": 1.0, "iou": 1.0, "hit": 1.0}
    # Against (150, 50)-(250, 150): intersection 50 x 100 = 5000, union 10000 + 10000 - 5000 = 15000.
    shifted = grounding_iou(response, "[150, 50, 250, 150]", ORIGINAL, MODEL_SIZES)
    assert shifted == pytest.approx({"score": 1 / 3, "iou": 1 / 3, "hit": 0.0})
    # Without model sizes the box is taken in original pixels: (50, 25)-(100, 75) misses (100, 50)-(200, 150).
    unscaled = grounding_iou(response, "[100, 50, 200, 150]", ORIGINAL, [])
    assert unscaled == {"score": 0.0, "iou": 0.0, "hit": 0.0}


def test_grounding_model_sizes_need_images() -> None:
    with pytest.raises(ValueError, match="images"):
        grounding_iou("<answer>[1, 2, 3, 4]</answer>", "[1, 2, 3, 4]", [], MODEL_SIZES)
    with pytest.raises(ValueError, match="model_image_sizes"):
        grounding_iou("<answer>[1, 2, 3, 4]</answer>", "[1, 2, 3, 4]", ORIGINAL, [(0, 100)])


@pytest.mark.parametrize(
    ("answer", "truth", "iou"),
    [
        # Clipped to the 400x200 image: (300, 100)-(500, 300) becomes (300, 100)-(400, 200).
        ("[300, 100, 500, 300]", "[300, 100, 400, 200]", 1.0),
        ("[-100, -100, 200, 100]", "[0, 0, 200, 100]", 1.0),
        ("[500, 300, 600, 400]", "[300, 100, 400, 200]", 0.0),  # entirely outside: degenerate
        ("[500, 300, 600, 400]", "[500, 300, 600, 400]", 0.0),  # both outside
        ("[30, 40, 10, 20]", "[10, 20, 30, 40]", 0.0),  # inverted corners
        ("[10, 20, 10, 40]", "[10, 20, 10, 40]", 0.0),  # zero width
        ("[0, 0, 100, 50]", "[0, 0, 100, 100]", 0.5),  # the hit threshold exactly
        ("no box here", "[0, 0, 100, 100]", 0.0),
        ("[0, 0, 100, 100]", "no box", 0.0),
    ],
)
def test_grounding_clipping_and_degenerate_boxes(answer: str, truth: str, iou: float) -> None:
    result = grounding_iou(f"<answer>{answer}</answer>", truth, ORIGINAL)
    assert result == {"score": iou, "iou": iou, "hit": 1.0 if iou >= 0.5 else 0.0}


def test_grounding_without_images_compares_as_written() -> None:
    assert grounding_iou("<answer>[500, 300, 600, 400]</answer>", "[500, 300, 600, 400]")["score"] == 1.0


def test_grounding_hit() -> None:
    truth = "[0, 0, 100, 100]"
    assert grounding_hit("<answer>[0, 0, 100, 50]</answer>", truth, ORIGINAL) == {"score": 1.0, "iou": 0.5}
    assert grounding_hit("<answer>[0, 0, 100, 49]</answer>", truth, ORIGINAL) == {"score": 0.0, "iou": 0.49}
    assert grounding_hit("<answer>[0, 0, 100, 50]", truth, ORIGINAL) == {"score": 0.0, "iou": 0.0}


@pytest.mark.timeout(20)
def test_grounding_hostile() -> None:
    truth = "[0, 0, 100, 100]"
    assert grounding_iou("x" * MB + "<answer>[0, 0, 100, 100]</answer>", truth, ORIGINAL)["score"] == 1.0
    assert grounding_iou("<answer>" + "[" * MB + "</answer>", truth, ORIGINAL)["score"] == 0.0
    many = "<answer>" + "[1, 2, 3, 4]" * 80_000 + "[0,0,100,100]</answer>"  # the last box counts
    assert grounding_iou(many, truth, ORIGINAL)["score"] == 1.0
    assert grounding_iou("<answer>[1" + " " * MB + "</answer>", truth, ORIGINAL)["score"] == 0.0
    assert grounding_iou("<answer>" + "(1,2)," * 150_000 + "</answer>", truth, ORIGINAL)["score"] == 0.0


# --- think_format / overlong_penalty -----------------------------------------------------------

THINK_CASES = [
    ("<think>look</think><answer>red</answer>", 1.0),
    ("  <think>\nlook\n</think>\n\n<answer> red </answer>\n<|im_end|>", 1.0),
    ("<THINK>look</Think><answer>red</answer>", 1.0),
    ("<think>a < b</think><answer>red</answer>", 1.0),
    ("<think></think><answer>red</answer>", 0.0),  # empty thought
    ("<think>look</think><answer> </answer>", 0.0),  # empty answer
    ("<answer>red</answer>", 0.0),
    ("<think>look</think>", 0.0),
    ("<answer>red</answer><think>look</think>", 0.0),  # wrong order
    ("<think>look</think> so <answer>red</answer>", 0.0),  # text between
    ("I see. <think>look</think><answer>red</answer>", 0.0),  # text before
    ("<think>look</think><answer>red</answer> done", 0.0),  # text after
    ("<think>look <think>again</think></think><answer>red</answer>", 0.0),  # nested
    ("<think>look</think><answer>red</answer><answer>blue</answer>", 0.0),  # extra pair
    ("<think>look <answer>x</answer></think><answer>red</answer>", 0.0),
    ("<think>look</think><answer>red", 0.0),  # unclosed
    ("<think>look<answer>red</answer>", 0.0),
    ("<|im_start|><think>look</think><answer>red</answer>", 0.0),
    ("", 0.0),
]


@pytest.mark.parametrize(("response", "expected"), THINK_CASES)
def test_think_format(response: str, expected: float) -> None:
    assert think_format(response) == expected


def test_think_format_rejects_non_string() -> None:
    with pytest.raises(TypeError, match="str"):
        think_format(None)  # type: ignore[arg-type]


@pytest.mark.timeout(20)
def test_think_format_hostile() -> None:
    assert think_format("<think>" + "x" * MB + "</think><answer>red</answer>") == 1.0
    assert think_format("<think>" + "</think><answer>" * 60_000) == 0.0
    assert think_format("<answer>" * 100_000) == 0.0
    assert think_format("<think>a</think><answer>b</answer>" + "<|im_end|>" * 100_000) == 1.0


@pytest.mark.parametrize(
    ("length", "max_length", "extra", "expected"),
    [
        # L_max = 100, default cache = 100 // 4 = 25: free up to 75 tokens.
        (0, 100, None, 0.0),
        (75, 100, None, 0.0),
        (76, 100, None, -1 / 25),  # (75 - 76) / 25
        (90, 100, None, -15 / 25),
        (100, 100, None, -1.0),  # (75 - 100) / 25
        (101, 100, None, -1.0),
        (5000, 100, None, -1.0),
        # cache = 10: free up to 90 tokens.
        (90, 100, {"overlong_cache": 10}, 0.0),
        (95, 100, {"overlong_cache": 10}, -0.5),
        (100, 100, {"overlong_cache": 10}, -1.0),
        (95, 100, {"overlong_cache": None}, -20 / 25),  # unset: the default
        (95, 100, {"overlong_cache": float("nan")}, -20 / 25),
        # L_max = 3: cache = max(1, 3 // 4) = 1.
        (2, 3, None, 0.0),
        (3, 3, None, -1.0),
        # Unknown L_max.
        (10_000, 0, None, 0.0),
    ],
)
def test_overlong_penalty(length: int, max_length: int, extra: dict | None, expected: float) -> None:
    assert overlong_penalty(length, max_length, extra) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("length", "max_length", "extra"),
    [(-1, 100, None), (10, -5, None), (1.5, 100, None), (10, 100, {"overlong_cache": 0}),
     (10, 100, {"overlong_cache": 101}), (10, 100, {"overlong_cache": "25"})],
)
def test_overlong_penalty_rejects_bad_values(length: object, max_length: object, extra: dict | None) -> None:
    with pytest.raises(ValueError, match="overlong_penalty"):
        overlong_penalty(length, max_length, extra)  # type: ignore[arg-type]


# --- registry and robustness of every verifier -------------------------------------------------

REGISTERED = {
    "answer_match", "format", "multiple_choice", "numeric", "math", "count",
    "grounding_iou", "grounding_hit", "think_format", "overlong_penalty",
}


def test_every_verifier_is_registered() -> None:
    assert set(BUILTINS) == REGISTERED
    for name, fn in BUILTINS.items():
        assert resolve(name) is fn


def _call(name: str, response: str) -> float:
    """Score ``response`` with verifier ``name`` against a ground truth it can parse."""
    fn = BUILTINS[name]
    truth = {"multiple_choice": "B", "grounding_iou": "[0, 0, 100, 100]", "grounding_hit": "[0, 0, 100, 100]",
             "answer_match": "red"}.get(name, "3")
    offered = {
        "response": response, "ground_truth": truth, "images": ORIGINAL, "model_image_sizes": MODEL_SIZES,
        "extra": {}, "response_tokens": 10, "max_response_tokens": 100,
    }
    params = inspect.signature(fn).parameters
    result = fn(**{key: value for key, value in offered.items() if key in params})
    return result["score"] if isinstance(result, dict) else result


HOSTILE_RESPONSES = [
    "<answer>" * 100_000,
    "x" * MB,
    "[" * MB,
    "(" * MB,
    "{" * MB,
    "<" * MB,
    "\\" * MB,
    "$" * MB,
    " " * MB + "x",
    "\u200b" * MB,
    "<answer>" + "x" * MB,
    "</answer>" * 100_000,
    "<|im_end|>" * 100_000 + "x",
    "\\boxed{" * 140_000,
    "<think>" * 100_000,
    "A. " * 300_000,
    "1e" * 500_000,
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(REGISTERED - {"overlong_penalty"}))
def test_every_verifier_scores_hostile_responses_zero(name: str) -> None:
    for response in HOSTILE_RESPONSES:
        start = time.monotonic()
        assert _call(name, response) == 0.0, response[:20]
        assert time.monotonic() - start < 5, response[:20]


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("answer_match", "red"), ("multiple_choice", "(B)"), ("numeric", "3"), ("math", "\\frac{6}{2}"),
        ("count", "three"), ("grounding_iou", "[0, 0, 50, 50]"), ("grounding_hit", "[0, 0, 50, 50]"),
    ],
)
@pytest.mark.timeout(20)
def test_every_verifier_finds_an_answer_after_a_megabyte(name: str, answer: str) -> None:
    # Model box (0, 0)-(50, 50) in the 200x100 image is (0, 0)-(100, 100) in the original.
    assert _call(name, "x" * MB + f"<answer>{answer}</answer>") == 1.0


def test_every_verifier_rejects_non_string_response() -> None:
    for name in sorted(REGISTERED - {"overlong_penalty"}):
        with pytest.raises(TypeError):
            _call(name, None)  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_every_verifier_survives_random_text() -> None:
    pieces = [
        "<answer>", "</answer>", "<think>", "</think>", "<|im_end|>", "\\boxed{", "{", "}", "(", ")", "[",
        "]", ",", " ", "\n", "1", "-2.5", "1e9", "%", "three", "B", "(C)", "^", "!", "\\frac", "$", "x", "=",
        "\u200b", "ｒ", "\u0435", "/", ".",
    ]
    rng = random.Random(0)
    for _ in range(40):
        response = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        for name in sorted(REGISTERED - {"overlong_penalty"}):
            score = _call(name, response)
            assert 0.0 <= score <= 1.0, (name, response)
