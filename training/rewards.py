"""Verifiable rewards for language-model fine-tuning, and the guard around any reward.

A reward function is any Python callable with the batched signature TRL uses too:

    fn(prompts: list[str], completions: list[str], **columns) -> list[float]

where ``columns`` holds every field of the prompt rows (``answer`` and any extra ones),
each as a list aligned with ``completions``. ``per_sample`` adapts a function of one
completion, ``fn(completion, answer) -> float``.

The library: ``exact_match`` (answer equality after normalization), ``numeric_match``
(a number within a tolerance), ``format_match`` (a regular expression). ``resolve``
turns a name ("exact_match", "numeric", "format") or an import path
("package.module:function") into a callable.

``RewardModel`` calls the functions, weights and sums them, and never lets a failure
turn into a number: a function that raises is retried one sample at a time to isolate
the culprit, and a sample whose reward raised, is NaN/inf, or is not a number is marked
invalid (NaN in the output) and counted; the learner decides what to do with it.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

RewardFn = Callable[..., Sequence[Any]]

_BOXED = re.compile(r"\\boxed\{")
_NUMBER = re.compile(
    r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+"
)
_PUNCT = string.punctuation.replace("-", "").replace(".", "").replace("/", "")
_TEXT = re.compile(r"\\text\{([^}]*)\}")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_SPACES = re.compile(r"\s+")
_ANSWER_PREFIX = re.compile(r"^(?:the )?answer(?: is)?:? ?")
_TRAILING_ZEROS = re.compile(r"[-+]?\d+\.0+")


class RewardError(RuntimeError):
    """A reward function that cannot be used: wrong output length, or too many failures."""


# ---------------------------------------------------------------------- answers
def _boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, braces balanced."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def extract_answer(text: str) -> str:
    """The part of a completion that states the answer.

    In order: the content of the last ``\\boxed{...}``; what follows the last ``####``
    (GSM8K); what follows the last "answer:" / "answer is" (any case); else the text.
    """
    boxed = _boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        return text.rsplit("####", 1)[1]
    m = list(re.finditer(r"answer\s*(?:is|:)\s*", text, flags=re.IGNORECASE))
    if m:
        return text[m[-1].end() :]
    return text


def normalize_answer(text: str) -> str:
    """Lower case, no surrounding space or punctuation, single spaces, no "$", "\\text{}",
    thousands separators or trailing ".0"; "The answer is" is not part of an answer."""
    s = str(text).strip().lower()
    if "\\text{" in s:
        s = _TEXT.sub(r"\1", s)
    s = s.replace("$", "").replace("\\!", "").replace("\\,", "")
    if "," in s:
        s = _THOUSANDS.sub("", s)
    s = _SPACES.sub(" ", s).strip()
    s = s.strip(_PUNCT + " ").rstrip(".").strip()
    if "answer" in s:
        s = _ANSWER_PREFIX.sub("", s)
    if _TRAILING_ZEROS.fullmatch(s):
        s = s.split(".")[0]
    if s.startswith("+"):
        s = s[1:]
    return s


def parse_number(text: str, which: str = "first") -> float | None:
    """The first (or last) number in ``text``: integers, decimals, "1,234", "3/4", "1e-3"."""
    if which not in ("first", "last"):
        raise ValueError(f"which must be 'first' or 'last', got {which!r}")
    found = _NUMBER.findall(str(text))
    if not found:
        return None
    raw = (found[0] if which == "first" else found[-1]).replace(",", "").replace(" ", "")
    try:
        if "/" in raw:
            num, den = raw.split("/")
            if float(den) == 0:
                return None
            return float(Fraction(num) / Fraction(den))
        return float(raw)
    except (ValueError, ZeroDivisionError):
        return None


# ---------------------------------------------------------------------- library
def _answers(columns: dict[str, Any], n: int, name: str) -> list[Any]:
    if "answer" not in columns:
        raise KeyError(f"{name} needs an 'answer' field in every prompt row")
    answers = list(columns["answer"])
    if len(answers) != n:
        raise ValueError(f"{name}: {len(answers)} answers for {n} completions")
    return answers


def exact_match(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
    """1.0 where the normalized extracted answer equals the normalized reference."""
    answers = _answers(columns, len(completions), "exact_match")
    return [
        float(normalize_answer(extract_answer(c)) == normalize_answer(a))
        for c, a in zip(completions, answers)
    ]


def numeric_match(
    tolerance: float = 1e-6, *, relative: bool = False, which: str = "first"
) -> RewardFn:
    """A reward: 1.0 where the extracted answer's number is within ``tolerance`` of the
    reference (absolute, or relative to |reference| when ``relative``); 0.0 otherwise,
    also when the completion has no number. A reference that is not a number is an error.
    """
    if tolerance < 0 or not math.isfinite(tolerance):
        raise ValueError(f"tolerance must be finite and >= 0, got {tolerance}")

    def numeric(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        answers = _answers(columns, len(completions), "numeric_match")
        out = []
        for c, a in zip(completions, answers):
            ref = parse_number(str(a), "first")
            if ref is None:
                raise ValueError(f"numeric_match: the reference answer {a!r} is not a number")
            got = parse_number(extract_answer(c), which)
            if got is None or not math.isfinite(got):
                out.append(0.0)
                continue
            bound = tolerance * abs(ref) if relative else tolerance
            out.append(float(abs(got - ref) <= bound))
        return out

    numeric.__name__ = "numeric_match"
    return numeric


def format_match(pattern: str, *, score: float = 1.0) -> RewardFn:
    """A reward: ``score`` where the whole completion (stripped) matches ``pattern``."""
    regex = re.compile(pattern, flags=re.DOTALL)

    def fmt(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        return [score if regex.fullmatch(c.strip()) else 0.0 for c in completions]

    fmt.__name__ = "format_match"
    return fmt


def per_sample(fn: Callable[[str, Any], float]) -> RewardFn:
    """Adapt ``fn(completion, answer) -> float`` to the batched signature."""

    def batched(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        answers = _answers(columns, len(completions), getattr(fn, "__name__", "reward"))
        return [fn(c, a) for c, a in zip(completions, answers)]

    batched.__name__ = getattr(fn, "__name__", "per_sample")
    return batched


LIBRARY = ("exact_match", "numeric", "format")


def resolve(
    spec: str | RewardFn,
    *,
    numeric_tolerance: float = 1e-6,
    format_pattern: str = r".+",
) -> RewardFn:
    """A reward callable from a library name or "package.module:function"."""
    if callable(spec):
        return spec
    if spec == "exact_match":
        return exact_match
    if spec == "numeric":
        return numeric_match(numeric_tolerance)
    if spec == "format":
        return format_match(format_pattern)
    if ":" in spec:
        module, _, attr = spec.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"reward function {spec!r} cannot be imported: {e}") from e
        if not callable(obj):
            raise ValueError(f"reward function {spec!r} is not callable")
        return obj
    raise ValueError(
        f"unknown reward function {spec!r}; use one of {list(LIBRARY)} or 'package.module:function'"
    )


# ---------------------------------------------------------------------- the guard
@dataclass
class RewardScores:
    """Weighted total per sample (NaN where invalid), per-function values, failures.

    errors: (function name, sample index or None for the whole batch, message).
    """

    total: np.ndarray
    per_function: dict[str, np.ndarray]
    invalid: np.ndarray
    errors: list[tuple[str, int | None, str]] = field(default_factory=list)

    @property
    def num_invalid(self) -> int:
        return int(self.invalid.sum())


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _to_float(v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float | np.integer | np.floating):
        return float(v)
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:  # 0-d tensor or array
        return float(v.item())
    return float("nan")  # None, strings, lists: not a reward


class RewardModel:
    """Weighted sum of reward functions, with every failure caught, isolated and counted."""

    def __init__(
        self, functions: Sequence[RewardFn], weights: Sequence[float] | None = None
    ) -> None:
        if not functions:
            raise ValueError("at least one reward function is needed")
        for fn in functions:
            if not callable(fn):
                raise ValueError(f"reward function {fn!r} is not callable")
        if weights is None or len(weights) == 0:
            weights = [1.0] * len(functions)
        if len(weights) != len(functions):
            raise ValueError(f"{len(weights)} reward weights for {len(functions)} reward functions")
        if not all(math.isfinite(w) for w in weights):
            raise ValueError(f"reward weights must be finite, got {list(weights)}")
        self.functions = list(functions)
        self.weights = [float(w) for w in weights]
        names: list[str] = []
        for fn in self.functions:
            base, k = _name(fn), 1
            name = base
            while name in names:
                k += 1
                name = f"{base}_{k}"
            names.append(name)
        self.names = names
        self._accepts_kwargs = [self._takes_kwargs(fn) for fn in self.functions]

    @staticmethod
    def _takes_kwargs(fn: Any) -> bool:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return True
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)

    def _call(
        self, k: int, prompts: list[str], completions: list[str], columns: dict
    ) -> list[float]:
        fn = self.functions[k]
        if not self._accepts_kwargs[k]:
            params = inspect.signature(fn).parameters
            columns = {c: v for c, v in columns.items() if c in params}
        out = fn(prompts, completions, **columns)
        try:
            values = list(out)
        except TypeError:
            raise RewardError(
                f"reward function {self.names[k]!r} returned {type(out).__name__}, "
                f"expected a list of {len(completions)} numbers"
            ) from None
        if len(values) != len(completions):
            raise RewardError(
                f"reward function {self.names[k]!r} returned {len(values)} values for "
                f"{len(completions)} completions"
            )
        return [_to_float(v) for v in values]

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], columns: dict[str, Sequence[Any]]
    ) -> RewardScores:
        n = len(completions)
        prompts, completions = list(prompts), list(completions)
        columns = {c: list(v) for c, v in columns.items()}
        for c, v in columns.items():
            if len(v) != n:
                raise ValueError(f"column {c!r} has {len(v)} values for {n} completions")
        errors: list[tuple[str, int | None, str]] = []
        per_fn: dict[str, np.ndarray] = {}
        invalid = np.zeros(n, dtype=bool)
        total = np.zeros(n, dtype=np.float64)
        for k, name in enumerate(self.names):
            try:
                values = np.asarray(self._call(k, prompts, completions, columns), dtype=np.float64)
            except RewardError:
                raise
            except Exception as e:  # isolate the failing samples
                errors.append((name, None, f"{type(e).__name__}: {e}"))
                values = np.full(n, np.nan)
                for i in range(n):
                    one = {c: [v[i]] for c, v in columns.items()}
                    try:
                        values[i] = self._call(k, [prompts[i]], [completions[i]], one)[0]
                    except RewardError:
                        raise
                    except Exception as e1:
                        errors.append((name, i, f"{type(e1).__name__}: {e1}"))
            bad = ~np.isfinite(values)
            for i in np.flatnonzero(bad):
                if not any(err[1] == i and err[0] == name for err in errors):
                    errors.append((name, int(i), f"returned {values[i]!r}, not a finite number"))
            invalid |= bad
            per_fn[name] = values
            total = total + self.weights[k] * np.where(bad, 0.0, values)
        total = np.where(invalid, np.nan, total)
        return RewardScores(total=total, per_function=per_fn, invalid=invalid, errors=errors)


__all__ = [
    "LIBRARY",
    "RewardError",
    "RewardFn",
    "RewardModel",
    "RewardScores",
    "exact_match",
    "extract_answer",
    "format_match",
    "normalize_answer",
    "numeric_match",
    "parse_number",
    "per_sample",
    "resolve",
]
