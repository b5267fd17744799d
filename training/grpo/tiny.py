"""A tiny, randomly initialised causal LM and a character-level tokenizer, built in process.

For tests, benchmarks and a first try of ``sim2real train grpo`` without downloading
anything: ``build_tiny_model(dir)`` writes a directory that ``--model`` loads with
``from_pretrained(local_files_only=True)``; ``addition_prompts`` writes a synthetic
verifiable task.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
DIGITS = "0123456789"
DEFAULT_CHARS = DIGITS + "+-*=?:., abcdefghijklmnopqrstuvwxyz"


def build_tokenizer(chars: str = DEFAULT_CHARS):
    """A character-level fast tokenizer: one token per character, plus pad/bos/eos/unk."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if len(set(chars)) != len(chars):
        raise ValueError("build_tokenizer: characters must be unique")
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *chars])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
    )


def build_tiny_model(
    path: str | os.PathLike,
    *,
    chars: str = DEFAULT_CHARS,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 256,
    seed: int = 0,
) -> Path:
    """Save a random Llama-architecture model and its tokenizer under ``path``."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = build_tokenizer(chars)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    finally:
        torch.random.set_rng_state(state)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def addition_rows(max_sum: int = 9) -> list[dict[str, str]]:
    """Every "a+b=" with single digits a, b and a + b <= max_sum; answer is str(a + b)."""
    return [
        {"prompt": f"{a}+{b}=", "answer": str(a + b)}
        for a in range(10)
        for b in range(10)
        if a + b <= max_sum
    ]


def write_jsonl(path: str | os.PathLike, rows: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


__all__ = ["addition_rows", "build_tiny_model", "build_tokenizer", "write_jsonl"]
