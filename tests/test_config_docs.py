"""Config field docs: attribute docstrings read from source, and the --help listing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import pytest

from policies.diffusion import DiffusionConfig
from policies.gaussian import ActorCriticConfig
from sim.randomization import SimToRealConfig
from training.config_docs import (
    FieldHelp,
    class_summary,
    config_fields,
    field_docs,
    format_config_help,
    format_type,
    undocumented_fields,
)
from training.grpo.config import GRPOTrainConfig


@dataclass
class _Base:
    """Base section."""

    alpha: int = 1
    """Alpha, the first field."""
    beta: float = 0.5  # a comment is not a doc
    gamma: str = "g"
    """Gamma spans
    two lines   of    source."""


@dataclass
class _Child(_Base):
    """Child section.

    More text that is not part of the summary.
    """

    gamma: str = "h"  # redeclared without a doc: the base's doc stays
    delta: tuple[int, ...] = (1, 2)
    """Delta sizes."""


@dataclass
class _Optim:
    """Optimizer settings."""

    lr: float = 3e-4
    """Learning rate of the optimizer, a number that this long doc describes at such length
    that it has to be wrapped onto a second line of the listing."""
    eps: float = 1e-5
    """Adam epsilon."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule."""


@dataclass
class _Train:
    name: str = "run"
    """Name of the run."""
    optim: _Optim = field(default_factory=_Optim)
    """The optimizer."""
    steps: int | None = None
    """Training steps; None: until stopped."""
    extra: dict[str, Any] = field(default_factory=dict)


def test_field_docs_reads_attribute_docstrings():
    assert field_docs(_Base) == {
        "alpha": "Alpha, the first field.",
        "beta": "",
        "gamma": "Gamma spans two lines of source.",
    }


def test_field_docs_inheritance_and_cache():
    docs = field_docs(_Child)
    assert list(docs) == ["alpha", "beta", "gamma", "delta"]
    assert docs["alpha"] == "Alpha, the first field."
    assert docs["gamma"] == "Gamma spans two lines of source."
    assert docs["delta"] == "Delta sizes."
    assert docs["beta"] == ""
    docs["alpha"] = "changed"  # callers get a copy; the cache is untouched
    assert field_docs(_Child)["alpha"] == "Alpha, the first field."


def test_field_docs_rejects_non_dataclasses():
    with pytest.raises(TypeError):
        field_docs(int)
    with pytest.raises(TypeError):
        field_docs(_Base())


def test_class_summary():
    assert class_summary(_Child) == "Child section."
    assert class_summary(_Train) == ""  # dataclass's generated signature is no summary


@pytest.mark.parametrize(
    ("tp", "text"),
    [
        (int, "int"),
        (bool, "bool"),
        (str, "str"),
        (float | None, "float | None"),
        (Optional[int], "int | None"),  # noqa: UP045 - the typing spelling on purpose
        (tuple[int, ...], "tuple[int, ...]"),
        (tuple[float, float] | None, "tuple[float, float] | None"),
        (dict[str, Any], "dict[str, Any]"),
        (list[str], "list[str]"),
        (Literal["a", "b"], "{a,b}"),
        (Literal[1, 2] | None, "{1,2} | None"),
        (_Optim, "_Optim"),
    ],
)
def test_format_type(tp, text):
    assert format_type(tp) == text


def test_config_fields_nested():
    cfg = dataclasses.replace(_Train(), optim=_Optim(lr=1e-3), steps=10)
    fields = config_fields(cfg)
    assert [f.path for f in fields] == [
        "name",
        "optim.lr",
        "optim.eps",
        "optim.schedule",
        "steps",
        "extra",
    ]
    by_path = {f.path: f for f in fields}
    assert by_path["optim.lr"] == FieldHelp(
        "optim.lr",
        "float",
        1e-3,
        "Learning rate of the optimizer, a number that this long doc describes at such "
        "length that it has to be wrapped onto a second line of the listing.",
        "optim",
    )
    assert by_path["optim.schedule"].type == "{constant,cosine}"
    assert by_path["steps"].type == "int | None"
    assert by_path["steps"].value == 10  # the instance's value, not the default
    assert by_path["extra"].type == "dict[str, Any]"
    assert by_path["name"].section == ""
    with pytest.raises(TypeError):
        config_fields(_Train)


def test_format_config_help_nested():
    text = format_config_help(_Train(), title="train demo")
    lines = text.splitlines()
    assert lines[0] == "train demo"
    assert "optim: Optimizer settings." in lines
    # path: type = value, then the doc
    name = next(s for s in lines if s.startswith("  name:"))
    assert name.startswith("  name: str = 'run'") and name.endswith("Name of the run.")
    steps = next(s for s in lines if s.startswith("  steps:"))
    assert steps.startswith("  steps: int | None = None") and "Training steps;" in steps
    eps = next(s for s in lines if s.startswith("  optim.eps:"))
    assert eps.startswith("  optim.eps: float = 1e-05") and eps.endswith("Adam epsilon.")
    lr_i = next(i for i, s in enumerate(lines) if s.startswith("  optim.lr:"))
    assert lines[lr_i].startswith("  optim.lr: float = 0.0003")
    assert "  optim.schedule: {constant,cosine} = 'constant'" in text
    assert "  extra: dict[str, Any] = {}" in lines  # no doc: nothing after the value
    # the docs share one column; a long doc wraps under it, within ~100 columns
    col = lines[lr_i].index("Learning rate")
    assert eps.index("Adam epsilon.") == col
    assert lines[lr_i + 1].startswith(" " * col) and lines[lr_i + 1][col] != " "
    assert all(len(s) <= 100 for s in lines)
    # the top level's own fields come under the title, each section under its heading
    assert lines.index("optim: Optimizer settings.") > next(
        i for i, s in enumerate(lines) if s.startswith("  steps:")
    )


def test_format_config_help_headings_without_title():
    text = format_config_help(_Child())
    assert text.splitlines()[0] == "_Child: Child section."
    assert "  delta: tuple[int, ...] = (1, 2)" in text


def test_undocumented_fields():
    assert undocumented_fields(_Train()) == ["extra"]
    assert undocumented_fields(_Child()) == ["beta"]


@pytest.mark.parametrize(
    "cfg",
    [ActorCriticConfig(), DiffusionConfig(), SimToRealConfig()],
    ids=lambda c: type(c).__name__,
)
def test_configs_fully_documented(cfg):
    assert undocumented_fields(cfg) == []


def test_grpo_config_documented():
    # model (LanguageModelConfig) is declared in policies/language_model.py; see below
    missing = undocumented_fields(GRPOTrainConfig())
    assert [p for p in missing if not p.startswith("model.")] == []
    assert all(field_docs(GRPOTrainConfig).values())  # the section fields too


def test_grpo_model_section_documented():
    assert undocumented_fields(GRPOTrainConfig()) == []


def test_real_config_help_renders():
    text = format_config_help(ActorCriticConfig())
    assert text.startswith("ActorCriticConfig: Network shapes and the action distribution.")
    assert "  min_std: float = 0.001" in text
    assert "  rnn_type: str | None = None" in text
    help_grpo = format_config_help(GRPOTrainConfig(), title="sim2real train grpo")
    assert "  algo.lr: float = 1e-05" in help_grpo
    assert "  reward.functions: tuple[str, ...] = ('exact_match',)" in help_grpo
