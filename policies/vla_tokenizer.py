"""Instruction tokenizers for vision-language-action policies (:mod:`policies.vla`).

A task's instructions use a few dozen words, so a tiny VLA gets a word-level tokenizer
over exactly those words: every id is a word the model was trained on, and a typo or a
word from another task is an error at encode time instead of a silent ``[UNK]`` the
policy never saw. It is a plain ``tokenizers`` file, ``tokenizer.json``, that loads on a
robot with ``tokenizers.Tokenizer.from_file`` (no torch, no transformers) and on the
training side with ``transformers.PreTrainedTokenizerFast(tokenizer_file=...)``.

Normalization: lowercase; pre-tokenization: ``Whitespace`` (runs of word characters,
and runs of punctuation, are separate tokens: "cube." is "cube" and ".").

This module imports neither torch nor anything of the project, so that the robot side
(``deploy``, which may not import ``policies``) can use it as it is.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

PAD = "[PAD]"
"""Padding token; id 0 in a tokenizer built here (VLAConfig.pad_token_id's default)."""
UNK = "[UNK]"
"""What the word-level model maps an unknown word to; id 1 here. Never fed to a policy:
:func:`encode_instructions` refuses it."""
TOKENIZER_FILE = "tokenizer.json"
"""File name of a saved tokenizer inside a directory."""

__all__ = [
    "PAD",
    "TOKENIZER_FILE",
    "UNK",
    "build_word_tokenizer",
    "encode_instructions",
    "instruction_vocabulary",
    "load_tokenizer",
]


def _require_tokenizers():
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("instruction tokenizers need `tokenizers`: pip install tokenizers") from e
    return tokenizers


def _split(text: str) -> list[str]:
    """The words of ``text`` as a tokenizer built here sees them (lowercased, split)."""
    tk = _require_tokenizers()
    norm = tk.normalizers.Lowercase().normalize_str(text)
    return [w for w, _ in tk.pre_tokenizers.Whitespace().pre_tokenize_str(norm)]


def instruction_vocabulary(texts: Iterable[str]) -> list[str]:
    """The sorted distinct words of ``texts``, split as a tokenizer built here splits them
    (a vocabulary for :func:`build_word_tokenizer`)."""
    return sorted({w for t in texts for w in _split(t)})


def _tokenizer_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / TOKENIZER_FILE if p.is_dir() or not p.suffix else p


def build_word_tokenizer(words: Iterable[str], path: str | os.PathLike | None = None) -> Any:
    """A word-level ``tokenizers.Tokenizer``: ``[PAD]`` = 0, ``[UNK]`` = 1, then
    ``words`` in the given order (lowercased, duplicates dropped).

    Each word must be one token after normalization and pre-tokenization ("red" and "."
    are words; "red cube" and "cube." are not: a ValueError names them). path: where to
    save it, a ``.json`` file or a directory (then ``<path>/tokenizer.json``, the
    directory created); None: not saved.
    """
    tk = _require_tokenizers()
    vocab = {PAD: 0, UNK: 1}
    for word in words:
        if not isinstance(word, str):
            raise TypeError(f"vocabulary words must be strings, got {word!r}")
        pieces = _split(word)
        if len(pieces) != 1:
            raise ValueError(
                f"vocabulary word {word!r} is not one token (splits into {pieces}); "
                "instruction_vocabulary(texts) gives the words of a set of instructions"
            )
        if pieces[0] in (PAD.lower(), UNK.lower()):
            raise ValueError(f"vocabulary word {word!r} collides with a special token")
        vocab.setdefault(pieces[0], len(vocab))
    tok = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token=UNK))
    tok.normalizer = tk.normalizers.Lowercase()
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tok.add_special_tokens([PAD, UNK])
    if path is not None:
        file = _tokenizer_path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(file))
    return tok


def load_tokenizer(path: str | os.PathLike) -> Any:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` file or a directory holding
    one; a FileNotFoundError naming the file if it is not there."""
    tk = _require_tokenizers()
    file = _tokenizer_path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"tokenizer file {file} does not exist (build one with build_word_tokenizer)"
        )
    return tk.Tokenizer.from_file(str(file))


def encode_instructions(
    tokenizer: Any, texts: Sequence[str], max_tokens: int, pad_id: int | None = None
) -> np.ndarray:
    """Token ids [B, max_tokens] int64 of ``texts``, right-padded with ``pad_id``.

    tokenizer: a ``tokenizers.Tokenizer`` or a transformers fast tokenizer (its backend
    is used). pad_id: None takes the id of ``[PAD]``. Padded to ``max_tokens`` (not to
    the longest) so that every batch has the shape the exported graph takes. Raises a
    ValueError naming the instruction and the word when a word maps to ``[UNK]``, naming
    the instruction when it has more than ``max_tokens`` tokens or none.
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of instructions, got one string")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if pad_id is None:
        pad_id = backend.token_to_id(PAD)
        if pad_id is None:
            raise ValueError(f"the tokenizer has no {PAD} token; pass pad_id")
    unk_id = backend.token_to_id(UNK)
    texts = list(texts)
    out = np.full((len(texts), max_tokens), pad_id, dtype=np.int64)
    for i, (text, enc) in enumerate(
        zip(texts, backend.encode_batch(texts, add_special_tokens=False), strict=True)
    ):
        ids = enc.ids
        if unk_id is not None and unk_id in ids:
            start, end = enc.offsets[ids.index(unk_id)]
            raise ValueError(
                f"instruction {text!r} has a word the tokenizer does not know: "
                f"{text[start:end]!r} (vocabulary of {backend.get_vocab_size()} tokens)"
            )
        if not ids:
            raise ValueError(f"instruction {i} ({text!r}) is empty")
        if len(ids) > max_tokens or enc.overflowing:
            raise ValueError(
                f"instruction {text!r} has {len(ids)} tokens, more than max_tokens={max_tokens}"
            )
        out[i, : len(ids)] = ids
    return out
