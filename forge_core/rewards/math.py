"""Math answer extraction and numeric comparison. Model output is parsed with regexes, never evaluated as code."""

from __future__ import annotations

import math
import re
from fractions import Fraction

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
GSM8K_MARK = re.compile(r"####\s*([^\n]*)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
FRAC = re.compile(r"\\[dt]?frac\{\s*(-?[\d.]+)\s*\}\{\s*(-?[\d.]+)\s*\}")
EXTRACTORS = ("answer_tag", "boxed", "gsm8k", "last_number")


def find_boxed(text: str) -> str | None:
    r"""Content of the last \boxed{...} (balanced braces), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth, j = 0, i
    while j < len(text):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def parse_number(text: str) -> float | None:
    r"""First number in `text` as float: handles $1,234, -5, 3.25, 3/4, \frac{3}{4}, 12%, trailing units; else None."""
    if text is None:
        return None
    s = text.strip().replace("$", "").replace("\\!", "").replace("\\,", "")
    frac = FRAC.search(s)
    if frac:
        num, den = float(frac.group(1)), float(frac.group(2))
        return num / den if den != 0 else None
    m = NUMBER.search(s.replace("−", "-"))
    if not m:
        return None
    token = m.group(0).replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return float(Fraction(int(num), int(den))) if int(den) != 0 else None
        return float(token)
    except (ValueError, ZeroDivisionError):
        return None


def extract_answer(text: str, extractors: tuple[str, ...] = EXTRACTORS) -> str | None:
    """The answer span of a response, trying extractors in order (answer tag, boxed, #### N, last number)."""
    for name in extractors:
        if name == "answer_tag":
            found = ANSWER_TAG.findall(text)
            if found:
                return found[-1].strip()
        elif name == "boxed":
            boxed = find_boxed(text)
            if boxed is not None:
                return boxed.strip()
        elif name == "gsm8k":
            found = GSM8K_MARK.findall(text)
            if found:
                return found[-1].strip()
        elif name == "last_number":
            numbers = NUMBER.findall(text.replace("−", "-"))
            if numbers:
                return numbers[-1]
        else:
            raise ValueError(f"unknown answer extractor {name!r}; choose from {EXTRACTORS}")
    return None


def parse_target(target: str) -> float | None:
    r"""Numeric value of a reference answer: a GSM8K answer ('... #### 42'), \boxed{}, or a plain number."""
    for extractors in (("gsm8k",), ("boxed",), ("answer_tag",)):
        span = extract_answer(target, extractors)
        if span is not None:
            return parse_number(span)
    return parse_number(target)


def numbers_match(a: float, b: float, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> bool:
    """Numeric equality with tolerance."""
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


class MathReward:
    """1.0 when the extracted answer equals the target numerically, else `format_score` if an answer was found, else 0."""

    def __init__(self, extractors: tuple[str, ...] | list[str] = EXTRACTORS, rel_tol: float = 1e-6,
                 abs_tol: float = 1e-6, format_score: float = 0.0, correct_score: float = 1.0) -> None:
        unknown = [e for e in extractors if e not in EXTRACTORS]
        if unknown:
            raise ValueError(f"rewards.math.extractors has unknown {unknown}; choose from {EXTRACTORS}")
        self.extractors = tuple(extractors)
        self.rel_tol, self.abs_tol = rel_tol, abs_tol
        self.format_score, self.correct_score = format_score, correct_score

    def __call__(self, prompt: str, response: str, target: str) -> float:
        """Score one response against its target."""
        expected = parse_target(target)
        if expected is None:
            raise ValueError(f"target {target!r} has no number; check the dataset's answer column")
        span = extract_answer(response, self.extractors)
        got = parse_number(span) if span is not None else None
        if got is None:
            return 0.0
        return self.correct_score if numbers_match(got, expected, self.rel_tol, self.abs_tol) else self.format_score


class DigitMatchReward:
    """Partial credit for integer answers: the fraction of digit positions (aligned from the units) that match the
    target, 0 when the sign differs or no answer is found. A denser signal than exact match on arithmetic: a
    response that gets the units right but misses a carry earns something. Non-integers score like MathReward."""

    def __init__(self, extractors: tuple[str, ...] | list[str] = EXTRACTORS) -> None:
        self.exact = MathReward(extractors)

    def __call__(self, prompt: str, response: str, target: str) -> float:
        expected = parse_target(target)
        if expected is None:
            raise ValueError(f"target {target!r} has no number; check the dataset's answer column")
        span = extract_answer(response, self.exact.extractors)
        got = parse_number(span) if span is not None else None
        if got is None:
            return 0.0
        if got != int(got) or expected != int(expected):
            return self.exact(prompt, response, target)
        if (got < 0) != (expected < 0):
            return 0.0
        a, b = str(abs(int(got)))[::-1], str(abs(int(expected)))[::-1]
        width = max(len(a), len(b))
        return sum(x == y for x, y in zip(a.ljust(width, "_"), b.ljust(width, "_"))) / width
