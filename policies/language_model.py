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

Needs the ``llm`` extra (transformers >= 4.50 for ``logits_to_keep``; peft for LoRA).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger("sim2real.llm")

REFERENCES = ("auto", "copy", "adapter_disabled", "none")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LanguageModelConfig:
    """How to load and wrap the model."""

    path: str = ""
    """Directory of a transformers causal LM (save_pretrained); loaded with local files only."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16."""
    lora_r: int = 0
    """0 trains all weights; > 0 adds a LoRA adapter (peft) of this rank and trains only it."""
    lora_alpha: float = 16.0
    """LoRA scaling alpha."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch, in [0, 1)."""
    lora_target: str = "all-linear"
    """Modules the adapter wraps: "all-linear" or a comma-separated list of names (q_proj,v_proj)."""
    reference: str = "auto"
    """Where reference log-probabilities come from: "copy" (a frozen copy of the starting
    weights), "adapter_disabled" (the base weights, LoRA switched off; needs lora_r > 0),
    "none", or "auto" (adapter_disabled with LoRA, else copy)."""
    disable_dropout: bool = True
    """Set every dropout probability to 0, so that log-probabilities are a deterministic
    function of the weights (the ratio is exactly 1 on-policy)."""
    logprob_batch_size: int = 0
    """Rows per forward when scoring; 0 scores the whole batch at once."""
    fast_sampling: bool = True
    """Sample through a lean decoding loop for Llama-layout models (llama, mistral, qwen2),
    checked against the model's forward on first use; other models, or false here, sample
    through the transformers forward with its KV cache."""

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
    padding; a diagnostic, the learner re-scores; None when not recorded), group [N]
    (index of the prompt in the
    call, so rows i*G..i*G+G-1 share a prompt).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    truncated: torch.Tensor
    sample_logp: torch.Tensor | None
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
            None if self.sample_logp is None else self.sample_logp[rows],
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
            None if self.sample_logp is None else self.sample_logp[:, :last],
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
            None
            if any(p.sample_logp is None for p in parts)
            else torch.cat([right(p.sample_logp, T, 0.0) for p in parts]),
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


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from probs [N, V], by inverting the CDF at one uniform per row.

    Exact, and cheaper than torch.multinomial, which draws a random number per token of
    the vocabulary. The CDF is summed in float64; a token of probability 0 (filtered by
    top-k/top-p) is never drawn.
    """
    cdf = probs.double().cumsum(-1)
    u = torch.rand(
        (probs.shape[0], 1), generator=generator, device=probs.device, dtype=torch.float64
    )
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    return idx.clamp_max(probs.shape[-1] - 1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _LlamaDecoder:
    """Sampling-time forward for Llama-layout models (llama, mistral, qwen2).

    The same arithmetic as the transformers modules, with a preallocated KV buffer and
    none of the per-call machinery (mask builders, cache objects, output classes) that
    dominates a decoding step of a small model. Prompts go through the model's own
    submodules (so LoRA layers take part); one-token steps use fused weights (q/k/v in
    one matrix, gate/up in one) when every projection is a plain ``nn.Linear``, else the
    submodules too. Used only for sampling: log-probabilities for the loss always come
    from the model's own forward. Checked against that forward on the first batch it
    sees; on any mismatch it switches itself off and sampling uses the generic path.
    """

    MODEL_TYPES = ("llama", "mistral", "qwen2")

    def __init__(self, base: nn.Module) -> None:
        self.base = base
        self.inner = base.model
        self.layers = list(self.inner.layers)
        attn = self.layers[0].self_attn
        cfg = base.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(attn, "head_dim", None) or cfg.hidden_size // self.heads
        self.scaling = float(attn.scaling)
        self.window = getattr(cfg, "sliding_window", None)
        self.silu = getattr(cfg, "hidden_act", None) == "silu"
        self.verified = False
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.fused: list[tuple] | None = None
        self.final: tuple = ()
        self.table: torch.Tensor | None = None

    @classmethod
    def build(cls, base: nn.Module) -> _LlamaDecoder | None:
        cfg = getattr(base, "config", None)
        if getattr(cfg, "model_type", None) not in cls.MODEL_TYPES:
            return None
        inner = getattr(base, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, n) for n in needed):
            return None
        for layer in inner.layers:
            a = getattr(layer, "self_attn", None)
            if a is None or not all(
                hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")
            ):
                return None
            if hasattr(a, "q_norm") or hasattr(a, "k_norm"):
                return None
            if not all(
                hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp")
            ):
                return None
        if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
            return None
        return cls(base)

    def usable(self, length: int) -> bool:
        return self.window is None or length <= self.window

    # ---------------------------------------------------------------- state
    @staticmethod
    def _rotated_rows(w: torch.Tensor, heads: int, d: int) -> torch.Tensor:
        """Rows of a projection whose output is rotate_half of the original's, per head."""
        w = w.reshape(heads, d, *w.shape[1:])
        half = d // 2
        return torch.cat([-w[:, half:], w[:, :half]], dim=1).reshape(heads * d, *w.shape[2:])

    def _fuse(self) -> list[tuple] | None:
        """Weights for one-token steps, folded so that a layer is a handful of kernels.

        Per layer: (eps1, W_in, b_in, W_o, b_o, eps2, W_gu, W_down). W_in stacks
        [q; k; rotate_half(q); rotate_half(k); v] projections (so rotary embedding is two
        multiplies and an add), with the input norm's weight folded into its columns and
        the attention scaling into the query rows; W_gu stacks gate and up projections
        with the second norm's weight folded in. None when a layer is not plain nn.Linear
        (LoRA, quantized) or not RMSNorm + SiLU.
        """
        if not self.silu:
            return None
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        out = []
        with torch.no_grad():
            for layer in self.layers:
                a, mlp = layer.self_attn, layer.mlp
                lins = [a.q_proj, a.k_proj, a.v_proj, a.o_proj]
                lins += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
                norms = [layer.input_layernorm, layer.post_attention_layernorm]
                if any(type(m) is not nn.Linear for m in lins):
                    return None  # LoRA or quantized layers: use the modules themselves
                if any(m.bias is not None for m in lins[4:]):
                    return None
                if any(
                    "RMSNorm" not in type(n).__name__ or not hasattr(n, "weight") for n in norms
                ):
                    return None
                eps = [getattr(n, "variance_epsilon", getattr(n, "eps", None)) for n in norms]
                if any(e is None for e in eps):
                    return None
                q, k, v, o, g, u, d = lins
                wq = q.weight * self.scaling
                w_in = (
                    torch.cat(
                        [
                            wq,
                            k.weight,
                            self._rotated_rows(wq, H, D),
                            self._rotated_rows(k.weight, Hkv, D),
                            v.weight,
                        ]
                    )
                    * norms[0].weight[None, :]
                )
                b_in = None
                if any(m.bias is not None for m in (q, k, v)):
                    bq, bk, bv = (
                        m.bias if m.bias is not None else m.weight.new_zeros(m.out_features)
                        for m in (q, k, v)
                    )
                    bq = bq * self.scaling
                    b_in = torch.cat(
                        [bq, bk, self._rotated_rows(bq, H, D), self._rotated_rows(bk, Hkv, D), bv]
                    )
                w_gu = torch.cat([g.weight, u.weight]) * norms[1].weight[None, :]
                out.append(
                    (float(eps[0]), w_in, b_in, o.weight, o.bias, float(eps[1]), w_gu, d.weight)
                )
            norm = self.inner.norm
            eps_f = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
            head = self.base.get_output_embeddings()
            if eps_f is None or type(head) is not nn.Linear or not hasattr(norm, "weight"):
                return None
            self.final = (float(eps_f), head.weight * norm.weight[None, :], head.bias)
        return out

    def start(self, n: int, capacity: int, like: torch.Tensor) -> None:
        shape = (n, self.kv_heads, capacity, self.head_dim)
        self.keys = [like.new_empty(shape) for _ in self.layers]
        self.values = [like.new_empty(shape) for _ in self.layers]
        self.length = 0
        self.fused = self._fuse()  # weights change between calls: fuse afresh
        self.table = None
        rope = getattr(self.base.config, "rope_parameters", None) or {}
        rope_type = (
            rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else None
        )
        if self.fused is not None and rope_type == "default":
            # cos/sin of every position, once (default rotary: a pure function of position)
            with torch.no_grad():
                pos = torch.arange(capacity, device=like.device)[None]
                cos, sin = self.inner.rotary_emb(like.new_zeros(1, capacity, 1), pos)
                self.table = torch.stack([cos[0], sin[0]], 1)  # [capacity, 2, D]

    def stop(self) -> None:
        self.keys, self.values, self.fused, self.table = [], [], None, None

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` of the batch (copying just the filled part of the buffer)."""

        def take(buf: torch.Tensor) -> torch.Tensor:
            out = buf.new_empty((rows.numel(), *buf.shape[1:]))
            out[:, :, : self.length] = buf[rows, :, : self.length]
            return out

        self.keys = [take(k) for k in self.keys]
        self.values = [take(v) for v in self.values]

    # ---------------------------------------------------------------- forward
    def step(
        self, ids: torch.Tensor, pos: torch.Tensor | int, key_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Logits [B, V] after feeding ids [B, S] at positions pos [B, S] (or one int
        position shared by every row, for one token).

        key_mask: [B, length + S] bool of real (non-padding) tokens, or None if none pads.
        """
        if ids.shape[1] == 1 and self.fused is not None:
            return self._step_fused(ids[:, 0], pos, key_mask)
        if isinstance(pos, int):
            pos = torch.full(ids.shape, pos, dtype=torch.long, device=ids.device)
        B, S = ids.shape
        start, end = self.length, self.length + S
        h = self.inner.embed_tokens(ids)
        cos, sin = self.inner.rotary_emb(h, pos)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        mask = None
        if S > 1:
            causal = torch.ones(S, end, dtype=torch.bool, device=ids.device).tril(start)
            mask = causal.expand(B, 1, S, end)
            if key_mask is not None:
                # a padding query attends to itself only, so no row is empty (no NaN)
                own = torch.zeros_like(causal)
                own[:, start:] = torch.eye(S, dtype=torch.bool, device=ids.device)
                mask = (mask & key_mask[:, None, None, :end]) | own
        elif key_mask is not None:
            mask = key_mask[:, None, None, :end]
        rep = self.heads // self.kv_heads
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
            k = a.k_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
            v = a.v_proj(x).view(B, S, -1, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.keys[i][:, :, start:end] = k
            self.values[i][:, :, start:end] = v
            keys, values = self.keys[i][:, :, :end], self.values[i][:, :, :end]
            if rep > 1:
                keys = keys.repeat_interleave(rep, dim=1)
                values = values.repeat_interleave(rep, dim=1)
            out = nn.functional.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=self.scaling
            )
            h = h + a.o_proj(out.transpose(1, 2).reshape(B, S, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        self.length = end
        return self.base.get_output_embeddings()(self.inner.norm(h[:, -1]))

    def _step_fused(
        self, ids: torch.Tensor, pos: torch.Tensor | int, key_mask: torch.Tensor | None
    ) -> torch.Tensor:
        F = nn.functional
        B = ids.shape[0]
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        t, end = self.length, self.length + 1
        h = self.inner.embed_tokens(ids)  # [B, hidden]
        if self.table is not None:
            cos, sin = self.table[pos].unbind(-2)  # [B, 1, D], or [D] for a shared position
        else:
            if isinstance(pos, int):
                pos = torch.full((B, 1), pos, dtype=torch.long, device=ids.device)
            cos, sin = self.inner.rotary_emb(h, pos)  # [B, 1, D]
        bias = None
        if key_mask is not None:
            bias = torch.zeros(key_mask.shape[0], 1, 1, end, dtype=h.dtype, device=h.device)
            bias = bias.masked_fill(~key_mask[:, None, None, :end], float("-inf"))
        dt = h.dtype
        f32 = dt == torch.float32
        hidden = (h.shape[-1],)

        def norm(z: torch.Tensor, eps: float) -> torch.Tensor:  # RMSNorm in float32
            return (
                F.rms_norm(z, hidden, eps=eps)
                if f32
                else F.rms_norm(z.float(), hidden, eps=eps).to(dt)
            )

        n_qk = H + Hkv
        for i, (e1, w_in, b_in, wo, bo, e2, wgu, wd) in enumerate(self.fused):
            x = norm(h, e1)
            y = F.linear(x, w_in, b_in).view(B, 2 * n_qk + Hkv, D)
            qk = torch.addcmul(y[:, :n_qk] * cos, y[:, n_qk : 2 * n_qk], sin)  # rotary embedding
            self.keys[i][:, :, t] = qk[:, H:]
            self.values[i][:, :, t] = y[:, 2 * n_qk :]
            q = qk[:, :H].reshape(B, Hkv, H // Hkv, D)  # grouped queries share a kv head
            att = torch.matmul(q, self.keys[i][:, :, :end].transpose(-1, -2))
            if bias is not None:
                att = att + bias
            att = (
                torch.softmax(att, dim=-1) if f32 else torch.softmax(att, -1, torch.float32).to(dt)
            )
            o = torch.matmul(att, self.values[i][:, :, :end]).reshape(B, H * D)
            h = torch.addmm(h, o, wo.t()) if bo is None else h + F.linear(o, wo, bo)
            g, u = F.linear(norm(h, e2), wgu).chunk(2, dim=-1)
            h = torch.addmm(h, F.silu(g) * u, wd.t())  # residual add fused into the matmul
        self.length = end
        eps_f, w_head, b_head = self.final
        return F.linear(norm(h, eps_f), w_head, b_head)


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
        self._decoder: _LlamaDecoder | None | bool = None  # built on first use
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
        # transformers < 4.56 names the argument torch_dtype
        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
        key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, **{key: dtype}
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

    @torch.no_grad()
    def _fast_decoder(
        self, ids: torch.Tensor, mask: torch.Tensor, length: int
    ) -> _LlamaDecoder | None:
        """The fast sampling path if this model has one, checked once against its forward."""
        if not self.cfg.fast_sampling or self._decoder is False:
            return None
        if self._decoder is None:
            self._decoder = _LlamaDecoder.build(self.base_model) or False
            if self._decoder is False:
                return None
        dec = self._decoder
        if not dec.usable(length):
            return None
        if not dec.verified:
            rows = min(4, ids.shape[0])
            dec.verified = self._check_decoder(dec, ids[:rows], mask[:rows])
            if not dec.verified:
                log.warning(
                    "the fast sampling path disagrees with %s's forward; sampling through "
                    "transformers instead",
                    type(self.base_model).__name__,
                )
                self._decoder = False
                return None
        return dec

    def _check_decoder(self, dec: _LlamaDecoder, ids: torch.Tensor, mask: torch.Tensor) -> bool:
        was = self.model.training
        self.model.eval()
        try:
            n, L = ids.shape
            extra = torch.stack([ids[:, -1], ids[:, 0]], 1)  # two more tokens of the vocabulary
            seq = torch.cat([ids, extra], 1)
            full = torch.cat([mask, torch.ones_like(extra)], 1)
            pos = position_ids_from_mask(full)
            want = self.model(
                input_ids=seq,
                attention_mask=None if bool(mask.all()) else full,
                position_ids=pos,
                use_cache=False,
                logits_to_keep=3,
            ).logits.float()
            dec.start(n, L + 2, next(self.model.parameters()))
            key = full.bool() if not bool(mask.all()) else None
            got = [dec.step(ids, pos[:, :L], None if key is None else key[:, :L])]
            for j in range(2):
                got.append(
                    dec.step(
                        seq[:, L + j : L + j + 1],
                        pos[:, L + j : L + j + 1],
                        None if key is None else key[:, : L + j + 1],
                    )
                )
            got_t = torch.stack(got, 1).float()
            scale = float(want.abs().max().clamp_min(1.0))
            return bool(((got_t - want).abs().max() <= 1e-4 * scale).item())
        except Exception as e:  # an architecture detail the fast path does not cover
            log.warning("fast sampling path unavailable: %s: %s", type(e).__name__, e)
            return False
        finally:
            dec.stop()
            self.model.train(was)

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
        """Completion texts, special tokens (EOS) removed."""
        lengths = rollout.completion_mask.sum(1).tolist()
        rows = [ids[:n] for ids, n in zip(rollout.completion_ids.tolist(), lengths)]
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None and not getattr(
            self.tokenizer, "clean_up_tokenization_spaces", True
        ):
            # what batch_decode does for a fast tokenizer without clean-up, minus its overhead
            return backend.decode_batch(rows, skip_special_tokens=True)
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

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
        record_logprobs: bool = True,
    ) -> Rollout:
        """``group_size`` completions for each prompt, in one batch with a KV cache.

        Rows i*group_size .. (i+1)*group_size-1 belong to prompt i. temperature 0 is
        greedy decoding. Sampling draws from ``generator`` only, so a saved generator
        state reproduces the same completions. ``record_logprobs=False`` skips the
        sampling-time log-probabilities (Rollout.sample_logp is then None).
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
        out_logp = torch.zeros((n, max_new_tokens if record_logprobs else 0), device=device)
        lengths = torch.full((n,), max_new_tokens, dtype=torch.long, device=device)
        finished = torch.zeros(n, dtype=torch.bool, device=device)
        # Rows still generating; finished rows leave the batch (and the KV cache), so a
        # step costs what the unfinished rows need.
        active = torch.arange(n, device=device)
        alive = torch.ones(n, dtype=torch.bool, device=device)  # over the rows of `active`

        decoder = self._fast_decoder(ids, mask, L + max_new_tokens)
        was_training = self.model.training
        self.model.eval()
        try:
            if decoder is not None:
                decoder.start(n, L + max_new_tokens, next(self.model.parameters()))
                logits = decoder.step(ids, pos, mask.bool() if padded else None)
                cache, can_drop = None, True
            else:
                out = self.model(
                    input_ids=ids,
                    attention_mask=full_mask[:, :L] if padded else None,
                    position_ids=pos,
                    use_cache=True,
                    logits_to_keep=1,
                )
                cache = getattr(out, self._cache_kwarg, None)
                can_drop = hasattr(cache, "batch_select_indices")
                logits = out.logits[:, -1, :]
            has_dead = False
            all_rows = True  # `active` is still every row, in order
            for t in range(max_new_tokens):
                logits = logits.float()
                if temperature == 0:
                    tok = logits.argmax(-1)
                    logp_all = torch.log_softmax(logits, -1) if record_logprobs else None
                else:
                    scaled = logits / temperature if temperature != 1.0 else logits
                    if top_k > 0 or top_p < 1.0:
                        probs = torch.softmax(_filter_logits(scaled, top_k, top_p), -1)
                        logp_all = torch.log_softmax(scaled, -1) if record_logprobs else None
                    elif record_logprobs:
                        logp_all = torch.log_softmax(scaled, -1)
                        probs = logp_all.exp()
                    else:
                        logp_all = None
                        probs = torch.softmax(scaled, -1)
                    tok = _sample(probs, generator)
                rows = slice(None) if all_rows else active
                out_tokens[rows, t] = tok
                if logp_all is not None:
                    out_logp[rows, t] = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
                is_eos = tok == eos[0] if eos.numel() == 1 else torch.isin(tok, eos)
                ended_now = is_eos & alive if has_dead else is_eos
                if bool(ended_now.any()):
                    ended = active[ended_now]
                    lengths[ended] = t + 1
                    finished[ended] = True
                    alive = alive & ~is_eos
                    has_dead = True
                    n_alive = int(alive.sum())
                    if n_alive == 0:
                        break
                    # Drop finished rows once they are a quarter of the batch: moving the
                    # KV cache costs more than a few rows of wasted compute.
                    if can_drop and 4 * (len(active) - n_alive) >= len(active):
                        keep = alive.nonzero().squeeze(-1)
                        if decoder is not None:
                            decoder.select(keep)
                        else:
                            cache.batch_select_indices(keep)
                        active, tok, next_pos = active[keep], tok[keep], next_pos[keep]
                        alive = alive[keep]
                        has_dead = all_rows = False
                        if padded:
                            full_mask = full_mask[keep]
                if t + 1 == max_new_tokens:
                    break
                if has_dead:  # finished rows still in the batch feed padding, ignored
                    tok = torch.where(alive, tok, self.pad_id)
                step_mask = full_mask[:, : L + t + 1] if padded else None
                if decoder is not None:
                    # without left padding every row is at position L + t
                    logits = decoder.step(
                        tok.unsqueeze(-1),
                        next_pos + t if padded else L + t,
                        step_mask.bool() if padded else None,
                    )
                else:
                    out = self.model(
                        input_ids=tok.unsqueeze(-1),
                        attention_mask=step_mask,
                        position_ids=next_pos + t,
                        use_cache=True,
                        **{self._cache_kwarg: cache},
                    )
                    logits = out.logits[:, -1, :]
        finally:
            self.model.train(was_training)
            if decoder is not None:
                decoder.stop()
        steps = int(lengths.max())
        cols = torch.arange(max_new_tokens, device=device)
        cmask = (cols.unsqueeze(0) < lengths.unsqueeze(1)).long()
        out_tokens = out_tokens.masked_fill(cmask == 0, self.pad_id)
        if record_logprobs:
            out_logp = out_logp.masked_fill(cmask == 0, 0.0)
        return Rollout(
            prompt_ids=ids.cpu(),
            prompt_mask=mask.cpu(),
            completion_ids=out_tokens[:, :steps].cpu(),
            completion_mask=cmask[:, :steps].cpu(),
            truncated=(~finished).cpu(),
            sample_logp=out_logp[:, :steps].cpu() if record_logprobs else None,
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
            # Completion padding only follows a row's last real token, so under the causal
            # mask it is never attended to by a scored position: an attention mask is needed
            # only for left padding of prompts (no mask lets attention take its fast path).
            out = model(
                input_ids=ids,
                attention_mask=None if bool(p_mask.all()) else mask,
                position_ids=position_ids_from_mask(mask),
                use_cache=False,
                logits_to_keep=T + 1,
            )
            logits = out.logits[:, :-1, :].float()
            if temperature > 0 and temperature != 1.0:
                logits = logits / temperature
            # log p(token) = logit - logsumexp: no [rows, T, vocab] log-softmax is kept
            lse = torch.logsumexp(logits, -1)
            logp = logits.gather(-1, c_ids.unsqueeze(-1)).squeeze(-1) - lse
            valid = c_mask > 0
            logps.append(torch.where(valid, logp, torch.zeros_like(logp)))
            if with_entropy:
                with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
                    ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)
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
