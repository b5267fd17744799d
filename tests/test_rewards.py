"""Verifiable rewards: answer normalization, numeric tolerance, format, and the guard that
keeps a failing or NaN-returning reward function from turning into a number."""

import math

import numpy as np
import pytest

from training.rewards import (
    RewardError,
    RewardModel,
    exact_match,
    extract_answer,
    format_match,
    normalize_answer,
    numeric_match,
    parse_number,
    per_sample,
    resolve,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("  42 ", "42"),
        ("The answer is 42.", "42"),
        ("$1,234$", "1234"),
        ("Paris!", "paris"),
        ("\\text{Paris}", "paris"),
        ("7.0", "7"),
        ("+7", "7"),
        ("-3", "-3"),
        ("a   b", "a b"),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_extract_answer_prefers_boxed_then_hashes_then_answer_marker():
    assert extract_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_answer("work... #### 18") == " 18"
    assert extract_answer("blah. Answer: 12") == "12"
    assert extract_answer("the answer is 5") == "5"
    assert extract_answer("just 3") == "just 3"


def test_parse_number_forms():
    assert parse_number("x = 1,234.5 apples") == 1234.5
    assert parse_number("3/4") == 0.75
    assert parse_number("-2e-3") == -0.002
    assert parse_number("first 1 then 2", "last") == 2.0
    assert parse_number("none here") is None
    assert parse_number("1/0") is None


def test_exact_match_normalizes_both_sides():
    out = exact_match(["q"] * 4, ["The answer is 7.", "7", " 8", "\\boxed{7}"], answer=["7"] * 4)
    assert out == [1.0, 1.0, 0.0, 1.0]


def test_numeric_match_tolerance_absolute_and_relative():
    f = numeric_match(0.01)
    assert f(["q"] * 4, ["3.005", "3.02", "no number", "answer: 3"], answer=["3"] * 4) == [
        1.0,
        0.0,
        0.0,
        1.0,
    ]
    rel = numeric_match(0.01, relative=True)
    assert rel(["q"] * 2, ["1005", "1020"], answer=["1000", "1000"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="not a number"):
        f(["q"], ["3"], answer=["three"])
    with pytest.raises(ValueError):
        numeric_match(-1.0)


def test_format_match_whole_completion():
    f = format_match(r"<think>.*</think>\s*\d+")
    assert f(["q"] * 3, ["<think>a\nb</think> 12", "12", "<think></think>x"]) == [1.0, 0.0, 0.0]


def test_resolve_library_and_import_path():
    assert resolve("exact_match") is exact_match
    assert resolve("numeric", numeric_tolerance=0.5)(["q"], ["2.4"], answer=["2"]) == [1.0]
    assert resolve("format", format_pattern=r"\d")(["q"], ["5"]) == [1.0]
    fn = resolve("training.rewards:exact_match")
    assert fn is exact_match
    with pytest.raises(ValueError, match="unknown reward function"):
        resolve("nope")
    with pytest.raises(ValueError, match="cannot be imported"):
        resolve("no_such_module_xyz:f")


def test_reward_model_weights_and_per_function_values():
    rm = RewardModel([exact_match, format_match(r"\d+")], weights=[1.0, 0.5])
    s = rm(["q", "q"], ["7", "x"], {"answer": ["7", "7"]})
    np.testing.assert_allclose(s.total, [1.5, 0.0])
    assert s.per_function["exact_match"].tolist() == [1.0, 0.0]
    assert s.num_invalid == 0


def test_reward_model_isolates_a_raising_sample_and_marks_it_nan():
    def flaky(prompts, completions, **kw):
        out = []
        for c in completions:
            if c == "boom":
                raise RuntimeError("cannot score this")
            out.append(1.0)
        return out

    rm = RewardModel([flaky])
    s = rm(["q"] * 3, ["a", "boom", "b"], {"answer": ["x"] * 3})
    assert s.invalid.tolist() == [False, True, False]
    assert math.isnan(s.total[1]) and s.total[0] == 1.0 and s.total[2] == 1.0
    assert any(i == 1 and "cannot score this" in msg for _, i, msg in s.errors)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None, "high"])
def test_reward_model_non_numbers_are_invalid_not_numbers(bad):
    rm = RewardModel([lambda prompts, completions, **kw: [1.0, bad]])
    s = rm(["q", "q"], ["a", "b"], {"answer": ["x", "x"]})
    assert s.invalid.tolist() == [False, True]
    assert math.isnan(s.total[1])
    assert s.errors and s.errors[0][1] == 1


def test_reward_model_wrong_length_is_a_clear_error():
    rm = RewardModel([lambda prompts, completions, **kw: [1.0]])
    with pytest.raises(RewardError, match="returned 1 values for 2 completions"):
        rm(["q", "q"], ["a", "b"], {"answer": ["x", "x"]})


def test_reward_model_passes_only_accepted_columns_and_per_sample():
    def strict(prompts, completions, answer):
        return [float(c == a) for c, a in zip(completions, answer)]

    rm = RewardModel([strict, per_sample(lambda c, a: float(len(c)))])
    s = rm(["q", "q"], ["1", "22"], {"answer": ["1", "2"], "difficulty": [1, 2]})
    np.testing.assert_allclose(s.total, [2.0, 2.0])


def test_reward_model_validation():
    with pytest.raises(ValueError):
        RewardModel([])
    with pytest.raises(ValueError, match="weights"):
        RewardModel([exact_match], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="same|values"):
        RewardModel([exact_match])(["q"], ["a"], {"answer": ["a", "b"]})
