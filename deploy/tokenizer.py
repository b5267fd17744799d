"""The instruction tokenizer of a deployed VLA policy, on the robot side.

A VLA policy file names a ``tokenizers`` JSON file next to it and records its sha256
(``instruction_input`` in :mod:`deploy.metadata`). :class:`InstructionTokenizer` loads
it with the ``tokenizers`` package only (no torch, no transformers, nothing of
``policies``), refuses a file whose hash differs from the one the policy was exported
with (a tokenizer of another vocabulary gives ids the network never saw, and nothing
downstream could notice), and turns one instruction into the int64 ids the graph takes:
right-padded with ``pad_id`` to ``max_tokens``.

It encodes as :func:`policies.vla_tokenizer.encode_instructions` does on the training
side (no special tokens added, padded to the maximum, not to the longest), so the same
file gives the same ids on both sides (tested). Instead of a silent ``[UNK]`` or a
silent truncation, an unknown word or an over-long instruction is a ValueError that
names it: the policy was never trained on either.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from deploy.metadata import PolicyLoadError, PolicyMetadata

__all__ = ["InstructionTokenizer", "TokenizerFileError", "file_sha256", "tokenizer_path"]

_UNK_FALLBACK = "[UNK]"
_PAD_NAMES = ("[PAD]",)


class TokenizerFileError(PolicyLoadError):
    """The tokenizer file of a policy is missing, differs from the exported one, cannot
    be parsed, or does not fit the policy's vocabulary or padding id."""


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes (what ``instruction_input.tokenizer_sha256`` holds)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tokenizer_path(policy_path: str | os.PathLike[str], meta: PolicyMetadata) -> Path:
    """Where the tokenizer of the policy file at ``policy_path`` lives: next to it, under
    the name its metadata records."""
    if meta.instruction_input is None:
        raise ValueError(f"policy family {meta.policy_family!r} has no instruction input")
    return Path(policy_path).parent / meta.instruction_input["tokenizer_file"]


def _require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as exc:  # pragma: no cover - depends on the robot's environment
        raise ImportError(
            "a VLA policy's instructions need the `tokenizers` package (no torch): "
            "pip install tokenizers"
        ) from exc
    return tokenizers


class InstructionTokenizer:
    """A ``tokenizer.json`` checked against a policy, encoding instructions to ids.

    Args:
        path: the tokenizer JSON file.
        max_tokens: length of the id row the graph takes (``instruction_input.max_tokens``).
        pad_id: id filling the row after the instruction.
        vocab_size: rows of the model's token embedding; every id of the tokenizer must
            be below it. None: not checked.
        sha256: the hex digest the file must have; None: not checked.
        what: how errors name the file's origin (e.g. the metadata key that names it).

    Raises:
        TokenizerFileError: the file is missing, has another hash, is not a tokenizer
            file, has ids beyond ``vocab_size``, or its ``[PAD]`` is not ``pad_id``.

    Attributes: ``sha256`` (of the loaded bytes), ``vocab_size`` (largest id + 1),
    ``unk_id`` (the id an unknown word maps to, or None if the model has none).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_tokens: int,
        pad_id: int,
        vocab_size: int | None = None,
        sha256: str | None = None,
        what: str = "tokenizer file",
    ) -> None:
        tk = _require_tokenizers()
        self.path = Path(path)
        self.max_tokens = int(max_tokens)
        self.pad_id = int(pad_id)
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not self.path.is_file():
            raise TokenizerFileError(f"{what} {str(self.path)!r} does not exist")
        # The bytes that are hashed are the bytes that are parsed (from_str): a file
        # replaced between a hash check and a from_file load cannot slip through.
        data = self.path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if sha256 is not None and digest != sha256:
            raise TokenizerFileError(
                f"{what} {str(self.path)!r} has sha256 {digest}, the policy was exported "
                f"with {sha256}: it is another tokenizer (or was modified); copy the one "
                "exported with the policy"
            )
        self.sha256 = digest
        try:
            tok = tk.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise TokenizerFileError(
                f"{what} {str(self.path)!r} is not a tokenizers JSON file: {exc}"
            ) from exc
        # the full length must be seen to refuse an over-long instruction, and the
        # padding is ours (to max_tokens, with the policy's pad id)
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        vocab = tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values(), default=-1) + 1
        if vocab_size is not None and self.vocab_size > vocab_size:
            raise TokenizerFileError(
                f"{what} {str(self.path)!r} has ids up to {self.vocab_size - 1} but the "
                f"policy embeds only {vocab_size} tokens"
            )
        for name in _PAD_NAMES:
            tid = tok.token_to_id(name)
            if tid is not None and tid != self.pad_id:
                raise TokenizerFileError(
                    f"{what} {str(self.path)!r} maps {name} to id {tid} but the policy pads "
                    f"with id {self.pad_id}"
                )
        unk = getattr(tok.model, "unk_token", None) or _UNK_FALLBACK
        self.unk_id = tok.token_to_id(unk)

    @classmethod
    def for_policy(
        cls, policy_path: str | os.PathLike[str], meta: PolicyMetadata
    ) -> InstructionTokenizer:
        """The tokenizer that the metadata of the policy file at ``policy_path`` names,
        hash-checked. Raises TokenizerFileError naming the metadata key on any problem."""
        spec = meta.instruction_input
        if spec is None:
            raise ValueError(f"policy family {meta.policy_family!r} has no instruction input")
        return cls(
            tokenizer_path(policy_path, meta),
            max_tokens=spec["max_tokens"],
            pad_id=spec["pad_id"],
            vocab_size=spec["vocab_size"],
            sha256=spec["tokenizer_sha256"],
            what="tokenizer file (metadata sim2real.instruction_input.tokenizer_file)",
        )

    def encode(self, text: str) -> np.ndarray:
        """Ids ``[max_tokens]`` int64 of one instruction, right-padded with ``pad_id``.

        Raises a ValueError naming the word when a word is unknown to the tokenizer,
        naming the token count when the instruction is longer than ``max_tokens``, and
        when it is empty or holds the padding token itself (the model would mask it).
        """
        if not isinstance(text, str):
            raise TypeError(f"an instruction must be a string, got {type(text).__name__}")
        enc = self._tok.encode(text, add_special_tokens=False)
        ids = enc.ids
        if self.unk_id is not None and self.unk_id in ids:
            start, end = enc.offsets[ids.index(self.unk_id)]
            raise ValueError(
                f"instruction {text!r} has a word the tokenizer does not know: "
                f"{text[start:end]!r} (the policy was trained on a vocabulary of "
                f"{self.vocab_size} tokens; see {self.path.name})"
            )
        if not ids:
            raise ValueError(f"instruction {text!r} is empty (no tokens)")
        if len(ids) > self.max_tokens:
            raise ValueError(
                f"instruction {text!r} has {len(ids)} tokens, more than the policy's "
                f"max_tokens={self.max_tokens}"
            )
        if self.pad_id in ids:
            raise ValueError(
                f"instruction {text!r} contains the padding token (id {self.pad_id}), which "
                "the policy ignores"
            )
        out = np.full(self.max_tokens, self.pad_id, dtype=np.int64)
        out[: len(ids)] = ids
        return out

    def encode_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Ids ``[B, max_tokens]`` int64 of several instructions (:meth:`encode` each)."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of instructions, got one string")
        out = np.full((len(texts), self.max_tokens), self.pad_id, dtype=np.int64)
        for i, text in enumerate(texts):
            out[i] = self.encode(text)
        return out
