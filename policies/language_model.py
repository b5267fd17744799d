"""A language-model policy over Hugging Face causal LMs, for GRPO-family learners.

The policy samples G completions per prompt in one batch (temperature, top-p, top-k,
a length limit; a KV cache, so each new token costs one forward of one position), scores
stored completions token by token (prompt and padding masked) and gives reference
log-probabilities from a frozen copy of the starting weights or, with a LoRA adapter,
from the same weights with the adapter switched off.

Layout of a batch: prompts are left-padded to a common length L and completions
right-padded to a common length T, so that column j of the completion block is the j-th
generated token of every row. Position ids count only real tokens (a left-padded row
starts at position 0), in sampling and in scoring alike, so a row's log-probabilities do
not depend on what it was batched with. A completion ends with its EOS token, which is
scored; tokens after it are padding (mask 0).

Needs the ``llm`` extra (transformers; peft for LoRA).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

REFERENCES = ("auto", "copy", "adapter_disabled", "none")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LanguageModelConfig:
    """How to load and wrap the model.

    lora_r: 0 trains all weights; > 0 adds a LoRA adapter (peft) of this rank and
        trains only the adapter.
    lora_target: "all-linear" or a comma-separated list of module names (q_proj,v_proj).
    reference: where reference log-probabilities come from: "copy" (a frozen copy of
        the starting weights), "adapter_disabled" (the base weights, LoRA switched off;
        needs lora_r > 0), "none", or "auto" (adapter_disabled with LoRA, else copy).
    disable_dropout: set every dropout probability to 0, so that log-probabilities are
        a deterministic function of the weights (the ratio is exactly 1 on-policy).
    logprob_batch_size: rows per forward when scoring; 0 scores the whole batch at once.
    """

    path: str = ""
    dtype: str = "float32"
    lora_r: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target: str = "all-linear"
    reference: str = "auto"
    disable_dropout: bool = True
    logprob_batch_size: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r} is unknown; choose one of {list(DTYPES)}")
        if self.reference not in REFERENCES:
            raise ValueError(
                f"model.reference={self.reference!r} is unknown; choose one of {list(REFERENCES)}"
            )
        if self.lora_r < 0:
            raise ValueError(f"model.lora_r must be >= 0, got {self.lora_r}")
        if self.reference == "adapter_disabled" and self.lora_r == 0:
            raise ValueError(
                "model.reference='adapter_disabled' needs a LoRA adapter (model.lora_r > 0)"
            )
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"model.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.logprob_batch_size < 0:
            raise ValueError(
                f"model.logprob_batch_size must be >= 0, got {self.logprob_batch_size}"
            )


@dataclass
class Rollout:
    """Sampled completions, in the batch layout described in the module docstring.

    prompt_ids/prompt_mask [N, L] (left-padded), completion_ids/completion_mask [N, T]
    (right-padded, EOS included in the mask), truncated [N] (no EOS within the limit),
    sample_logp [N, T] (log-probabilities at sampling time under the temperature, 0 on
    padding; a diagnostic, the learner re-scores), group [N] (index of the prompt in the
    call, so rows i*G..i*G+G-1 share a prompt).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    truncated: torch.Tensor
    sample_logp: torch.Tensor
    group: torch.Tensor
    extras: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    def select(self, rows: torch.Tensor) -> Rollout:
        """The rows ``rows`` (indices or a boolean mask), padding columns trimmed."""
        out = Rollout(
            self.prompt_ids[rows],
            self.prompt_mask[rows],
            self.completion_ids[rows],
            self.completion_mask[rows],
            self.truncated[rows],
            self.sample_logp[rows],
            self.group[rows],
        )
        return out.trimmed()

    def trimmed(self) -> Rollout:
        """Drop prompt columns that are padding in every row, and completion columns too."""
        if len(self) == 0:
            return self
        keep_p = self.prompt_mask.any(0)
        first = int(keep_p.nonzero()[0]) if bool(keep_p.any()) else self.prompt_mask.shape[1]
        keep_c = self.completion_mask.any(0)
        last = int(keep_c.nonzero()[-1]) + 1 if bool(keep_c.any()) else 0
        return Rollout(
            self.prompt_ids[:, first:],
            self.prompt_mask[:, first:],
            self.completion_ids[:, :last],
            self.completion_mask[:, :last],
            self.truncated,
            self.sample_logp[:, :last],
            self.group,
        )

    @staticmethod
    def concat(parts: Sequence[Rollout], pad_id: int) -> Rollout:
        """Stack rollouts with different lengths (prompts re-padded left, completions right)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValueError("Rollout.concat needs at least one non-empty rollout")
        L = max(p.prompt_ids.shape[1] for p in parts)
        T = max(p.completion_ids.shape[1] for p in parts)

        def left(x: torch.Tensor, n: int, value: float) -> torch.Tensor:
            return nn.functional.pad(x, (n - x.shape[1], 0), value=value)

        def right(x: torch.Tensor, n: int, value: float) -> torch.Tensor:
            return nn.functional.pad(x, (0, n - x.shape[1]), value=value)

        offset, groups = 0, []
        for p in parts:
            groups.append(p.group + offset)
            offset += int(p.group.max()) + 1 if len(p) else 0
        return Rollout(
            torch.cat([left(p.prompt_ids, L, pad_id) for p in parts]),
            torch.cat([left(p.prompt_mask, L, 0) for p in parts]),
            torch.cat([right(p.completion_ids, T, pad_id) for p in parts]),
            torch.cat([right(p.completion_mask, T, 0) for p in parts]),
            torch.cat([p.truncated for p in parts]),
            torch.cat([right(p.sample_logp, T, 0.0) for p in parts]),
            torch.cat(groups),
        )


def _require_transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the language-model policy needs the llm extra: pip install 'sim2real[llm]'"
        ) from e
    return transformers


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions that count only real tokens: 0 at each row's first unmasked token."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Keep the top_k tokens and the smallest set whose probability reaches top_p."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop[..., 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


class LanguageModelPolicy(nn.Module):
    """A causal LM (optionally with a LoRA adapter), its tokenizer and its reference."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        cfg: LanguageModelConfig | None = None,
        ref_model: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg or LanguageModelConfig()
        self.model = model
        self.tokenizer = tokenizer
        # a frozen copy is not a submodule: it is neither trained nor checkpointed
        self._ref = [ref_model] if ref_model is not None else []
        self.is_peft = hasattr(model, "disable_adapter") and hasattr(model, "peft_config")
        self.reference = self._resolve_reference()
        if self.reference == "copy" and ref_model is None:
            raise ValueError("reference='copy' needs ref_model")
        if self.reference == "adapter_disabled" and not self.is_peft:
            raise ValueError("reference='adapter_disabled' needs a peft model with an adapter")
        pad = getattr(tokenizer, "pad_token_id", None)
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError("the tokenizer has no eos_token; generation could never stop")
        self.pad_id = int(pad) if pad is not None else int(eos)
        eos_ids = {int(eos)}
        gen_eos = getattr(getattr(self.base_model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            eos_ids.add(gen_eos)
        elif isinstance(gen_eos, list | tuple):
            eos_ids.update(int(e) for e in gen_eos)
        self.eos_ids = torch.tensor(sorted(eos_ids), dtype=torch.long)
        self._cache_kwarg = self._find_cache_kwarg()
        if self.cfg.disable_dropout:
            for m in [self.model, *self._ref]:
                for sub in m.modules():
                    if isinstance(sub, nn.Dropout):
                        sub.p = 0.0

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        cfg: LanguageModelConfig | None = None,
        *,
        need_reference: bool,
    ) -> LanguageModelPolicy:
        """Load model and tokenizer from a local directory (nothing is downloaded)."""
        transformers = _require_transformers()
        cfg = cfg or LanguageModelConfig()
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"model directory {path} does not exist")
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"{path} has no config.json; --model must be a directory saved with save_pretrained"
            )
        dtype = DTYPES[cfg.dtype]
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=dtype
        )
        return cls.wrap(model, tokenizer, cfg, need_reference=need_reference)

    @classmethod
    def wrap(
        cls,
        model: nn.Module,
        tokenizer: Any,
        cfg: LanguageModelConfig | None = None,
        *,
        need_reference: bool,
    ) -> LanguageModelPolicy:
        """Add the LoRA adapter and the reference that ``cfg`` asks for to a loaded model."""
        cfg = cfg or LanguageModelConfig()
        reference = _resolve(cfg, need_reference)
        ref_model = None
        if reference == "copy":
            ref_model = copy.deepcopy(model).eval()
            for p in ref_model.parameters():
                p.requires_grad_(False)
        if cfg.lora_r > 0:
            try:
                import peft
            except ImportError as e:  # pragma: no cover
                raise ImportError("LoRA needs peft: pip install 'sim2real[llm]'") from e
            target: str | list[str] = cfg.lora_target
            if target != "all-linear":
                target = [t.strip() for t in target.split(",") if t.strip()]
            lora = peft.LoraConfig(
                r=cfg.lora_r,
                lora_alpha=cfg.lora_alpha,
                lora_dropout=cfg.lora_dropout,
                target_modules=target,
                task_type="CAUSAL_LM",
            )
            model = peft.get_peft_model(model, lora)
        import dataclasses

        return cls(model, tokenizer, dataclasses.replace(cfg, reference=reference), ref_model)

    def _resolve_reference(self) -> str:
        ref = self.cfg.reference
        if ref == "auto":
            if self.is_peft:
                return "adapter_disabled"
            return "copy" if self._ref else "none"
        return ref

    @property
    def base_model(self) -> nn.Module:
        """The transformers model (under the peft wrapper, if any)."""
        if self.is_peft:
            return self.model.get_base_model()
        return self.model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def has_reference(self) -> bool:
        return self.reference != "none"

    def _find_cache_kwarg(self) -> str:
        fwd = type(self.base_model).forward
        params = inspect.signature(inspect.unwrap(fwd)).parameters
        return "cache" if "cache" in params else "past_key_values"

    def to(self, *args: Any, **kwargs: Any) -> LanguageModelPolicy:  # type: ignore[override]
        super().to(*args, **kwargs)
        self._ref = [r.to(*args, **kwargs) for r in self._ref]
        return self

    # ------------------------------------------------------------------ trainable state
    def trainable_named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                yield name, p

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Only what training changes: all weights, or just the adapter with LoRA."""
        return {n: p.detach().cpu().clone() for n, p in self.trainable_named_parameters()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.trainable_named_parameters())
        missing = sorted(set(params) - set(state))
        unexpected = sorted(set(state) - set(params))
        if missing or unexpected:
            raise ValueError(
                f"trainable weights do not match the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]} (was the checkpoint made with another "
                f"model or LoRA setting?)"
            )
        with torch.no_grad():
            for n, p in params.items():
                if tuple(state[n].shape) != tuple(p.shape):
                    raise ValueError(
                        f"weight {n} has shape {tuple(state[n].shape)} in the checkpoint but "
                        f"{tuple(p.shape)} in the model"
                    )
                p.copy_(state[n].to(p.dtype))

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """The trained model (or adapter) and the tokenizer, loadable with from_pretrained."""
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))

    # ------------------------------------------------------------------ tokens
    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]]:
        enc = self.tokenizer(list(prompts), add_special_tokens=True)["input_ids"]
        for text, ids in zip(prompts, enc):
            if not ids:
                raise ValueError(f"prompt {text!r} encodes to no tokens")
        return [list(map(int, ids)) for ids in enc]

    def decode_completions(self, rollout: Rollout) -> list[str]:
        ids = rollout.completion_ids.masked_fill(rollout.completion_mask == 0, self.pad_id)
        return self.tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)

    def left_pad(self, token_lists: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        L = max(len(t) for t in token_lists)
        ids = torch.full((len(token_lists), L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(token_lists), L), dtype=torch.long)
        for i, t in enumerate(token_lists):
            if len(t):
                ids[i, L - len(t) :] = torch.as_tensor(t, dtype=torch.long)
                mask[i, L - len(t) :] = 1
        return ids, mask

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def generate(
        self,
        prompt_tokens: Sequence[Sequence[int]],
        group_size: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """``group_size`` completions for each prompt, in one batch with a KV cache.

        Rows i*group_size .. (i+1)*group_size-1 belong to prompt i. temperature 0 is
        greedy decoding. Sampling draws from ``generator`` only, so a saved generator
        state reproduces the same completions.
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        device = self.device
        ids, mask = self.left_pad(prompt_tokens)
        ids = ids.repeat_interleave(group_size, 0).to(device)
        mask = mask.repeat_interleave(group_size, 0).to(device)
        n, L = ids.shape
        group = torch.arange(len(prompt_tokens)).repeat_interleave(group_size)
        padded = not bool(mask.all())
        full_mask = torch.cat([mask, mask.new_ones(n, max_new_tokens)], 1) if padded else None
        pos = position_ids_from_mask(mask)
        next_pos = pos[:, -1:] + 1
        eos = self.eos_ids.to(device)

        out_tokens = torch.full((n, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        out_logp = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        lengths = torch.full((n,), max_new_tokens, dtype=torch.long, device=device)

        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model(
                input_ids=ids,
                attention_mask=full_mask[:, :L] if padded else None,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = getattr(out, self._cache_kwarg, None)
            logits = out.logits[:, -1, :]
            for t in range(max_new_tokens):
                logits = logits.float()
                if temperature == 0:
                    tok = logits.argmax(-1)
                    logp_all = torch.log_softmax(logits, -1)
                else:
                    scaled = logits / temperature
                    logp_all = torch.log_softmax(scaled, -1)
                    if top_k > 0 or top_p < 1.0:
                        probs = torch.softmax(_filter_logits(scaled, top_k, top_p), -1)
                    else:
                        probs = logp_all.exp()
                    tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
                tok_logp = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
                out_tokens[:, t] = torch.where(done, self.pad_id, tok)
                out_logp[:, t] = torch.where(done, 0.0, tok_logp)
                is_eos = torch.isin(tok, eos) & ~done
                lengths = torch.where(is_eos, t + 1, lengths)
                done = done | is_eos
                if t + 1 == max_new_tokens or bool(done.all()):
                    break
                kwargs = {self._cache_kwarg: cache}
                out = self.model(
                    input_ids=tok.unsqueeze(-1),
                    attention_mask=full_mask[:, : L + t + 1] if padded else None,
                    position_ids=next_pos + t,
                    use_cache=True,
                    **kwargs,
                )
                logits = out.logits[:, -1, :]
        finally:
            self.model.train(was_training)
        steps = int(lengths.max())
        cols = torch.arange(max_new_tokens, device=device)
        cmask = (cols.unsqueeze(0) < lengths.unsqueeze(1)).long()
        return Rollout(
            prompt_ids=ids.cpu(),
            prompt_mask=mask.cpu(),
            completion_ids=out_tokens[:, :steps].cpu(),
            completion_mask=cmask[:, :steps].cpu(),
            truncated=(~done).cpu(),
            sample_logp=out_logp[:, :steps].cpu(),
            group=group,
        )

    # ------------------------------------------------------------------ scoring
    def _score(
        self,
        model: nn.Module,
        batch: Rollout,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = self.device
        T = batch.completion_ids.shape[1]
        rows = len(batch)
        step = self.cfg.logprob_batch_size or rows
        logps, ents = [], []
        for s in range(0, rows, step):
            p_ids = batch.prompt_ids[s : s + step].to(device)
            p_mask = batch.prompt_mask[s : s + step].to(device)
            c_ids = batch.completion_ids[s : s + step].to(device)
            c_mask = batch.completion_mask[s : s + step].to(device)
            ids = torch.cat([p_ids, c_ids], 1)
            mask = torch.cat([p_mask, c_mask], 1)
            out = model(
                input_ids=ids,
                attention_mask=None if bool(mask.all()) else mask,
                position_ids=position_ids_from_mask(mask),
                use_cache=False,
                logits_to_keep=T + 1,
            )
            logits = out.logits[:, :-1, :].float()
            if temperature > 0:
                logits = logits / temperature
            logp_all = torch.log_softmax(logits, -1)
            logp = logp_all.gather(-1, c_ids.unsqueeze(-1)).squeeze(-1)
            valid = c_mask > 0
            logps.append(torch.where(valid, logp, torch.zeros_like(logp)))
            if with_entropy:
                with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
                    ent = -(logp_all.exp() * logp_all).sum(-1)
                    ents.append(torch.where(valid, ent, torch.zeros_like(ent)))
        logp = torch.cat(logps)
        return logp, (torch.cat(ents) if with_entropy else None)

    def logprobs(
        self,
        batch: Rollout,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probabilities [N, T] of the completions (0 on padding), with grad.

        Returns (logp, entropy); entropy [N, T] of the next-token distribution at each
        completion position when ``with_entropy``, else None. Log-probabilities are of
        the tempered distribution softmax(logits / temperature), the one sampled from.
        ``entropy_grad=False`` computes the entropy without a graph (for statistics).
        """
        return self._score(self.model, batch, temperature, with_entropy, entropy_grad)

    @torch.no_grad()
    def reference_logprobs(self, batch: Rollout, *, temperature: float = 1.0) -> torch.Tensor:
        """Per-token log-probabilities under the reference policy (no grad)."""
        if self.reference == "none":
            raise ValueError("this policy has no reference (model.reference='none')")
        if self.reference == "copy":
            return self._score(self._ref[0], batch, temperature, False)[0]
        with self.model.disable_adapter():
            return self._score(self.model, batch, temperature, False)[0]

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        was = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was)


def _resolve(cfg: LanguageModelConfig, need_reference: bool) -> str:
    if cfg.reference != "auto":
        return cfg.reference
    if not need_reference:
        return "none"
    return "adapter_disabled" if cfg.lora_r > 0 else "copy"


__all__ = [
    "LanguageModelConfig",
    "LanguageModelPolicy",
    "Rollout",
    "position_ids_from_mask",
]
