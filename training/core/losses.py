"""The one policy-gradient loss every learner uses, selected by a config.

An "element" is whatever the learner says it is: an env step (PPO), a denoising or
flow step (DPPO, ReinFlow, FPO), a token (GRPO), a sequence (GSPO). Per-element tensors
are either ``[N]`` (read as N rows of one element) or ``[B, T]`` (rows are sequences or
episodes, columns their elements). Keeping every variant in one function means a fix or
a statistic lands in every learner at once, and the variants can be compared with one
config switch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

RATIOS = ("token", "sequence", "none")
CLIPS = ("ppo", "dual", "log", "spo", "aspo", "none")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")

# exp() of a log-ratio beyond this overflows float32 long before it means anything;
# clamping keeps the clipped branch's zero gradient from turning into 0 * inf = nan.
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class PolicyLossConfig:
    """Which policy loss to compute. Frozen so that shared presets cannot be mutated.

    ratio: "token" (r = exp(logp_new - logp_old) per element), "sequence" (GSPO: r is
        exp of the mean log-ratio over the row's valid elements, broadcast to the row),
        "none" (REINFORCE: loss = -logp_new * A; requires clip="none").
    clip: "ppo" (clip r to [1-eps_low, 1+eps_high]), "dual" (PPO, and for A < 0 the
        objective is bounded below by dual_clip_c * A), "log" (CPGD: clipped policy
        gradient on log r, min(log r * A, clip(log r, -delta, delta) * A)),
        "spo" (r*A - |A|/(2*eps)*(r-1)^2 with eps = eps_high for A >= 0, eps_low for
        A < 0, so the optimum sits at the PPO clip bound), "aspo" (FPO++'s asymmetric
        trust region: PPO's clip for A > 0, SPO for A < 0, where a ratio pushed toward 0
        gets no clip to stop it), "none" (r * A).
    aggregation: "token_mean" (sum over valid elements / their count, DAPO),
        "seq_mean_token_mean" (mean over rows of each row's masked mean, GRPO),
        "seq_mean_token_sum_norm" (each row's masked sum / norm_constant, mean over
        rows, Dr. GRPO). Rows without a valid element do not count in the row means.
    norm_constant: Dr. GRPO's constant; None means the number of columns.
    kl_coef, kl_estimator: KL to logp_ref added as a loss term.
    entropy_coef: entropy bonus subtracted from the loss.
    decoupled: batch-size-invariant PPO; clip against logp_prox and multiply by the
        detached off-policy weight exp(logp_prox - logp_old).
    """

    ratio: str = "token"
    clip: str = "ppo"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip_c: float = 3.0
    log_ratio_delta: float = 0.2
    aggregation: str = "token_mean"
    norm_constant: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    decoupled: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (
            ("ratio", RATIOS),
            ("clip", CLIPS),
            ("aggregation", AGGREGATIONS),
            ("kl_estimator", KL_ESTIMATORS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(
                    f"PolicyLossConfig.{name}={value!r} is unknown; choose one of {list(allowed)}"
                )
        for name in (
            "eps_low",
            "eps_high",
            "dual_clip_c",
            "log_ratio_delta",
            "kl_coef",
            "entropy_coef",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"PolicyLossConfig.{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"PolicyLossConfig.{name} must be finite, got {value!r}")
        if not 0.0 < self.eps_low < 1.0:
            raise ValueError(
                f"PolicyLossConfig.eps_low must be in (0, 1) so that the lower clip bound "
                f"1 - eps_low stays positive, got {self.eps_low}"
            )
        if self.eps_high <= 0.0:
            raise ValueError(f"PolicyLossConfig.eps_high must be > 0, got {self.eps_high}")
        if self.dual_clip_c <= 1.0:
            raise ValueError(
                f"PolicyLossConfig.dual_clip_c must be > 1 (it bounds the ratio from above "
                f"for negative advantages), got {self.dual_clip_c}"
            )
        if self.log_ratio_delta <= 0.0:
            raise ValueError(
                f"PolicyLossConfig.log_ratio_delta must be > 0, got {self.log_ratio_delta}"
            )
        if self.norm_constant is not None and not (
            isinstance(self.norm_constant, int | float)
            and math.isfinite(self.norm_constant)
            and self.norm_constant > 0
        ):
            raise ValueError(
                f"PolicyLossConfig.norm_constant must be None or a positive number, "
                f"got {self.norm_constant!r}"
            )
        if self.kl_coef < 0.0:
            raise ValueError(f"PolicyLossConfig.kl_coef must be >= 0, got {self.kl_coef}")
        if self.entropy_coef < 0.0:
            raise ValueError(f"PolicyLossConfig.entropy_coef must be >= 0, got {self.entropy_coef}")
        if not isinstance(self.decoupled, bool):
            raise ValueError(f"PolicyLossConfig.decoupled must be a bool, got {self.decoupled!r}")
        if self.ratio == "none" and self.clip != "none":
            raise ValueError(
                f"PolicyLossConfig.ratio='none' (REINFORCE) has no ratio to clip; "
                f"set clip='none' (got clip={self.clip!r})"
            )
        if self.ratio == "none" and self.decoupled:
            raise ValueError("PolicyLossConfig.decoupled needs a ratio; ratio='none' has none")


POLICY_LOSS_PRESETS: dict[str, PolicyLossConfig] = {
    "ppo": PolicyLossConfig(),
    "dual_clip": PolicyLossConfig(clip="dual"),
    "cpgd": PolicyLossConfig(clip="log"),
    "spo": PolicyLossConfig(clip="spo"),
    "aspo": PolicyLossConfig(clip="aspo"),
    "reinforce": PolicyLossConfig(ratio="none", clip="none"),
    # DeepSeekMath GRPO: per-sequence token means, k3 KL to the reference at 0.04.
    "grpo": PolicyLossConfig(aggregation="seq_mean_token_mean", kl_coef=0.04, kl_estimator="k3"),
    "dapo": PolicyLossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean"),
    "dr_grpo": PolicyLossConfig(aggregation="seq_mean_token_sum_norm"),
    # GSPO clips the sequence ratio in a far narrower band than token-level PPO.
    "gspo": PolicyLossConfig(
        ratio="sequence", eps_low=3e-4, eps_high=4e-4, aggregation="seq_mean_token_mean"
    ),
}


def get_loss_config(name: str, **overrides: object) -> PolicyLossConfig:
    """A named preset with fields overridden; the result is validated again."""
    if name not in POLICY_LOSS_PRESETS:
        raise ValueError(f"unknown policy loss {name!r}; known: {sorted(POLICY_LOSS_PRESETS)}")
    fields = {f.name for f in dataclasses.fields(PolicyLossConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"unknown PolicyLossConfig field(s) {unknown}; fields are {sorted(fields)}"
        )
    return dataclasses.replace(POLICY_LOSS_PRESETS[name], **overrides)


def kl_estimate(logp: torch.Tensor, logp_ref: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-element estimate of KL(p || p_ref) from samples of p (Schulman's k1/k2/k3).

    k1 = log(p/p_ref) is unbiased but can be negative; k2 = 0.5*log(p/p_ref)^2 and
    k3 = p_ref/p - 1 - log(p_ref/p) are non-negative, k3 unbiased.
    """
    if logp.shape != logp_ref.shape:
        raise ValueError(
            f"kl_estimate: logp {tuple(logp.shape)} and logp_ref {tuple(logp_ref.shape)} "
            f"must have the same shape"
        )
    log_ratio = logp - logp_ref
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        neg = (-log_ratio).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return torch.exp(neg) - neg - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {list(KL_ESTIMATORS)}")


def kl_reward_penalty(
    rewards: torch.Tensor,
    logp: torch.Tensor,
    logp_ref: torch.Tensor,
    coef: float,
    kind: str = "k1",
) -> torch.Tensor:
    """KL to a reference as a reward penalty (rewards - coef * estimate, per element).

    Used when the KL should shape returns (and so advantages) instead of the loss; the
    estimate is detached because rewards carry no gradient.
    """
    if rewards.shape != logp.shape:
        raise ValueError(
            f"kl_reward_penalty: rewards {tuple(rewards.shape)} and logp "
            f"{tuple(logp.shape)} must have the same shape"
        )
    if coef < 0:
        raise ValueError(f"kl_reward_penalty: coef must be >= 0, got {coef}")
    return rewards - coef * kl_estimate(logp, logp_ref, kind).detach()


def _as_rows(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dim() == 1:
        return x.unsqueeze(-1)
    if x.dim() == 2:
        return x
    raise ValueError(f"{name} must be 1-D [N] or 2-D [B, T], got shape {tuple(x.shape)}")


def _mask_rows(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if mask is None:
        return torch.ones_like(like)
    if mask.dim() == 1:
        mask = mask.unsqueeze(-1)
    if mask.shape != like.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match {tuple(like.shape)}")
    return mask.to(like.dtype)


def _masked(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """x * m, but padding is exactly 0 even where x is inf or nan (e.g. -inf log-probs)."""
    return torch.where(m > 0, x * m, torch.zeros_like(x))


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor | None = None,
    mode: str = "token_mean",
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce per-element values to a scalar; padding (mask == 0) never counts.

    The choice matters for long sequences: token_mean weights every token equally,
    seq_mean_token_mean weights every sequence equally (short ones' tokens count more),
    seq_mean_token_sum_norm divides by a constant so length carries no bias (Dr. GRPO).
    """
    v = _as_rows(values, "values")
    if mask is None and mode == "token_mean":
        # no padding: the plain mean, without building a mask of ones (the result is the
        # same to the bit; a PPO minibatch step calls this half a dozen times)
        return v.contiguous().sum() / v.numel() if v.numel() else v.new_zeros(())
    m = _mask_rows(mask, v)
    if mode == "token_mean":
        total = m.sum()
        return torch.where(total > 0, _masked(v, m).sum() / total.clamp_min(1e-12), v.new_zeros(()))
    row_weight = m.sum(dim=-1)
    row_sum = _masked(v, m).sum(dim=-1)
    if mode == "seq_mean_token_mean":
        per_row = row_sum / row_weight.clamp_min(1e-12)
    elif mode == "seq_mean_token_sum_norm":
        const = float(v.shape[-1]) if norm_constant is None else float(norm_constant)
        if const <= 0:
            raise ValueError(f"norm_constant must be > 0, got {norm_constant}")
        per_row = row_sum / const
    else:
        raise ValueError(f"unknown aggregation {mode!r}; choose one of {list(AGGREGATIONS)}")
    rows = (row_weight > 0).to(v.dtype)
    n_rows = rows.sum()
    return torch.where(n_rows > 0, (per_row * rows).sum() / n_rows.clamp_min(1.0), v.new_zeros(()))


def _broadcast_arg(
    x: torch.Tensor | None,
    shape: torch.Size,
    name: str,
    one_d: bool,
    like_name: str = "logp_new",
) -> torch.Tensor | None:
    """Bring a per-element or per-row argument to the [B, T] layout, or explain why not."""
    if x is None:
        return None
    if not one_d and x.dim() == 1:
        if x.shape[0] != shape[0]:
            raise ValueError(
                f"{name} of shape {tuple(x.shape)} is read as one value per row, but "
                f"{like_name} has {shape[0]} rows (shape {tuple(shape)})"
            )
        x = x.unsqueeze(-1)
    elif one_d:
        if x.dim() != 1 or x.shape[0] != shape[0]:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)} but {like_name} has shape ({shape[0]},)"
            )
        x = x.unsqueeze(-1)
    try:
        out_shape = torch.broadcast_shapes(x.shape, shape)
    except RuntimeError:
        out_shape = None
    if out_shape != shape:
        raise ValueError(
            f"{name} of shape {tuple(x.shape)} does not broadcast to {like_name}'s shape "
            f"{tuple(shape)}"
        )
    return x.expand(shape)


def _same_shape(
    x: torch.Tensor | None, like: torch.Tensor, name: str, like_name: str = "logp_new"
) -> torch.Tensor | None:
    if x is None:
        return None
    if x.shape != like.shape:
        raise ValueError(
            f"{name} has shape {tuple(x.shape)} but {like_name} has shape {tuple(like.shape)}"
        )
    return _as_rows(x, name)


def _masked_mean(x: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    return aggregate(x, m, "token_mean")


def _row_mean(x: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """Each row's masked mean, broadcast back over the row (0 for rows with no valid element)."""
    if m is None:
        m = torch.ones_like(x)
    total = m.sum(-1, keepdim=True).clamp_min(1e-12)
    return (_masked(x, m).sum(-1, keepdim=True) / total).expand_as(x)


def _check_log_ratio_use(
    logp_new: torch.Tensor | None,
    logp_old: torch.Tensor | None,
    cfg: PolicyLossConfig,
    logp_ref: torch.Tensor | None,
    logp_prox: torch.Tensor | None,
) -> None:
    """A log-ratio replaces the pair; refuse what needs the log-probabilities themselves."""
    if logp_new is not None or logp_old is not None:
        raise ValueError(
            "policy_loss takes either logp_new and logp_old or log_ratio, not both: "
            "pass None for logp_new and logp_old when giving log_ratio"
        )
    if cfg.ratio == "none":
        raise ValueError(
            "PolicyLossConfig.ratio='none' (REINFORCE, -logp_new * A) needs logp_new; "
            "a log_ratio alone cannot give it"
        )
    if logp_ref is not None or cfg.kl_coef > 0:
        raise ValueError(
            "a KL to a reference policy (logp_ref, kl_coef) needs logp_new; "
            "a log_ratio alone cannot give it"
        )
    if logp_prox is not None or cfg.decoupled:
        raise ValueError(
            "the decoupled proximal policy (logp_prox, decoupled) needs logp_new and "
            "logp_old; a log_ratio alone cannot give it"
        )


def _ppo_clip_objective(ratio, adv, eps_low, eps_high) -> torch.Tensor:
    """PPO's min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)."""
    return torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)


def _spo_objective(ratio, adv, eps) -> torch.Tensor:
    """SPO's r A - |A| / (2 eps) (r - 1)^2, whose optimum sits at the clip bound."""
    return ratio * adv - adv.abs() / (2.0 * eps) * (ratio - 1.0).square()


def policy_loss(
    logp_new: torch.Tensor | None,
    logp_old: torch.Tensor | None,
    advantages: torch.Tensor,
    cfg: PolicyLossConfig,
    *,
    mask: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    logp_ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    logp_prox: torch.Tensor | None = None,
    clip_scale: torch.Tensor | None = None,
    log_ratio: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar loss and detached statistics for one minibatch.

    advantages, weights and clip_scale may be per element, per row ([B] or [B, 1] for a
    [B, T] batch) or anything that broadcasts to [B, T]; logp_old, logp_ref, entropy,
    logp_prox and mask must match logp_new's shape. Only the policy term is multiplied by
    ``weights``; the KL and entropy terms are aggregated over the same valid elements.

    log_ratio: for a learner without a likelihood, an estimate of log(p_new / p_old) per
    element, with gradient (FPO: L_cfm_old - L_cfm_new). It is given *instead of* the
    pair, ``policy_loss(None, None, advantages, cfg, log_ratio=...)``, and everything
    else is shaped like it; loss and statistics are the same, to the bit, as with a pair
    whose difference it is. What needs the log-probabilities themselves raises a
    ValueError: ratio="none" (REINFORCE's -logp_new * A), a KL to a reference
    (logp_ref, kl_coef) and the decoupled proximal policy (logp_prox, decoupled). An
    ``entropy`` tensor is the learner's own and stays allowed.

    Statistics: policy_loss, clip_frac (valid elements whose gradient a clip cut off; for
    "spo" and "aspo"'s A < 0 side, which do not clip, the elements outside the PPO range
    [1-eps_low, 1+eps_high] on the side the advantage pushes), approx_kl (k3 estimate of
    KL(old || new)), ratio_mean and ratio_max (of the ratio the objective uses), kl_ref
    and entropy when given, off_policy_weight_mean when decoupled.
    """
    if not isinstance(cfg, PolicyLossConfig):
        raise ValueError(f"cfg must be a PolicyLossConfig, got {type(cfg).__name__}")
    from_ratio = log_ratio is not None
    if from_ratio:
        _check_log_ratio_use(logp_new, logp_old, cfg, logp_ref, logp_prox)
        like, like_name = log_ratio, "log_ratio"
    else:
        if logp_new is None or logp_old is None:
            raise ValueError(
                "policy_loss needs logp_new and logp_old (or log_ratio, with both None)"
            )
        like, like_name = logp_new, "logp_new"
    assert like is not None
    if like.dim() not in (1, 2):
        raise ValueError(
            f"{like_name} must be 1-D [N] or 2-D [B, T], got shape {tuple(like.shape)}"
        )
    one_d = like.dim() == 1
    # new: per-element log-probabilities, or the given log-ratios
    new = _as_rows(like, like_name)
    shape = new.shape
    old = None if from_ratio else _same_shape(logp_old, like, "logp_old")
    ref = _same_shape(logp_ref, like, "logp_ref")
    ent = _same_shape(entropy, like, "entropy", like_name)
    prox = _same_shape(logp_prox, like, "logp_prox")
    if mask is not None and mask.shape != like.shape:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)} but {like_name} has shape {tuple(like.shape)}"
        )
    m = None if mask is None else _mask_rows(mask, new)
    adv = _broadcast_arg(advantages, shape, "advantages", one_d, like_name)
    w = _broadcast_arg(weights, shape, "weights", one_d, like_name)
    scale = _broadcast_arg(clip_scale, shape, "clip_scale", one_d, like_name)
    assert adv is not None
    adv = adv.detach().to(new.dtype)
    old = None if old is None else old.detach()

    if cfg.decoupled and prox is None:
        raise ValueError("cfg.decoupled=True needs logp_prox (the proximal policy's log-probs)")
    if not cfg.decoupled and prox is not None:
        raise ValueError("logp_prox was given but cfg.decoupled is False")
    if cfg.kl_coef > 0 and ref is None:
        raise ValueError(f"cfg.kl_coef={cfg.kl_coef} needs logp_ref")
    if cfg.entropy_coef > 0 and ent is None:
        raise ValueError(f"cfg.entropy_coef={cfg.entropy_coef} needs entropy")

    off_policy_log_w = None
    if from_ratio:
        log_ratio = new
    else:
        assert old is not None
        # The clip anchor is the behaviour policy, or the proximal policy when decoupled.
        anchor = prox.detach() if prox is not None else old
        log_ratio = new - anchor
        off_policy_log_w = (anchor - old) if prox is not None else None
    if cfg.ratio == "sequence":
        log_ratio = _row_mean(log_ratio, m)
        if off_policy_log_w is not None:
            off_policy_log_w = _row_mean(off_policy_log_w, m)
    log_ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)

    eps_low = cfg.eps_low if scale is None else cfg.eps_low * scale
    eps_high = cfg.eps_high if scale is None else cfg.eps_high * scale
    pos = adv > 0
    neg = adv < 0
    zero = torch.zeros_like(ratio, dtype=torch.bool)
    # outside PPO's band on the side the advantage pushes: what the ratio clips cut off
    beyond = (pos & (ratio > 1.0 + eps_high)) | (neg & (ratio < 1.0 - eps_low))

    if cfg.ratio == "none":
        objective = new * adv
        clipped = zero
    elif cfg.clip in ("ppo", "dual"):
        objective = _ppo_clip_objective(ratio, adv, eps_low, eps_high)
        clipped = beyond
        if cfg.clip == "dual":
            floor = cfg.dual_clip_c * adv
            dual_active = neg & (objective < floor)
            objective = torch.where(neg, torch.maximum(objective, floor), objective)
            clipped = clipped | dual_active
    elif cfg.clip == "log":
        delta = cfg.log_ratio_delta if scale is None else cfg.log_ratio_delta * scale
        objective = torch.minimum(log_ratio * adv, torch.clamp(log_ratio, -delta, delta) * adv)
        clipped = (pos & (log_ratio > delta)) | (neg & (log_ratio < -delta))
    elif cfg.clip == "spo":
        eps = torch.where(
            adv >= 0,
            torch.as_tensor(eps_high, dtype=adv.dtype, device=adv.device),
            torch.as_tensor(eps_low, dtype=adv.dtype, device=adv.device),
        )
        objective = _spo_objective(ratio, adv, eps)
        clipped = beyond
    elif cfg.clip == "aspo":
        objective = torch.where(
            neg,
            _spo_objective(ratio, adv, eps_low),
            _ppo_clip_objective(ratio, adv, eps_low, eps_high),
        )
        clipped = beyond
    else:  # "none": plain importance-sampled policy gradient
        objective = ratio * adv
        clipped = zero

    if off_policy_log_w is not None:
        off_policy_w = torch.exp(off_policy_log_w.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
        objective = objective * off_policy_w.detach()
    per_element = -objective
    if w is not None:
        per_element = per_element * w.detach()

    pg_loss = aggregate(per_element, m, cfg.aggregation, cfg.norm_constant)
    loss = pg_loss
    stats: dict[str, torch.Tensor] = {}
    if ref is not None:
        kl = aggregate(
            kl_estimate(new, ref.detach(), cfg.kl_estimator), m, cfg.aggregation, cfg.norm_constant
        )
        if cfg.kl_coef > 0:
            loss = loss + cfg.kl_coef * kl
        stats["kl_ref"] = kl.detach()
    if ent is not None:
        ent_agg = aggregate(ent, m, cfg.aggregation, cfg.norm_constant)
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * ent_agg
        stats["entropy"] = ent_agg.detach()

    with torch.no_grad():
        stats["policy_loss"] = pg_loss.detach()
        stats["clip_frac"] = _masked_mean(clipped.to(new.dtype), m)
        if old is None:
            # k3 of KL(old || new) is exp(l) - l - 1 of the element's log-ratio l; written
            # out as kl_estimate(old, new) computes it (-(old - new) is new - old exactly)
            l_el = new.detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
            stats["approx_kl"] = _masked_mean(torch.exp(l_el) - l_el - 1.0, m)
        else:
            stats["approx_kl"] = _masked_mean(kl_estimate(old, new.detach(), "k3"), m)
        if cfg.ratio == "none":
            assert old is not None
            shown_ratio = torch.exp((new - old).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
        else:
            shown_ratio = ratio
        shown_ratio = shown_ratio.detach()
        stats["ratio_mean"] = _masked_mean(shown_ratio, m)
        valid = shown_ratio if m is None else shown_ratio[m > 0]
        stats["ratio_max"] = valid.max() if valid.numel() else shown_ratio.new_zeros(())
        if off_policy_log_w is not None:
            stats["off_policy_weight_mean"] = _masked_mean(off_policy_w, m)
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor | None,
    returns: torch.Tensor,
    *,
    clip_eps: float | None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """0.5 * squared error, or PPO's clipped form max((v-R)^2, (v_clip-R)^2) / 2.

    The clipped form keeps the value head from moving more than clip_eps away from the
    values the rollout saw; it is a pessimistic bound, as in the policy clip.
    """
    if values.shape != returns.shape:
        raise ValueError(
            f"values {tuple(values.shape)} and returns {tuple(returns.shape)} must match"
        )
    returns = returns.detach()
    err = (values - returns).square()
    if clip_eps is not None:
        if clip_eps <= 0:
            raise ValueError(f"clip_eps must be > 0 or None, got {clip_eps}")
        if old_values is None or old_values.shape != values.shape:
            raise ValueError("clipped value loss needs old_values shaped like values")
        old_values = old_values.detach()
        v_clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        err = torch.maximum(err, (v_clipped - returns).square())
    if mask is not None and mask.shape != values.shape:
        raise ValueError(f"mask {tuple(mask.shape)} must match values {tuple(values.shape)}")
    flat_mask = None if mask is None else mask.reshape(-1)
    return 0.5 * aggregate(err.reshape(-1), flat_mask, "token_mean")
