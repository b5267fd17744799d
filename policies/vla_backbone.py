"""The VLA backbone and its config: a SigLIP vision tower and a Llama/Qwen2-style
decoder from ``transformers`` (tiny and random by default, or pretrained from local
directories, optionally with a peft LoRA adapter), and the token sequence that turns an
image, an instruction and proprioception into one feature vector. The layout, the
padding rule and the pretrained loading are described in :mod:`policies.vla`.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from policies.flow import FlowConfig
from policies.normalization import RunningMeanStd
from policies.vla_vision import FilmKeypointEncoder

VISION_ENCODERS = ("film_keypoints", "siglip")
"""What reads the image; VLAConfig.vision_encoder."""
ATTENTION_PATTERNS = ("prefix", "causal")
"""How the decoder's tokens see each other; VLAConfig.attention."""
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
"""Attention kernels that take the additive 4-D mask the backbone builds; "eager" is the
one the TorchScript ONNX exporter handles."""

__all__ = [
    "VISION_ENCODERS",
    "ATTENTION_PATTERNS",
    "ATTN_IMPLEMENTATIONS",
    "VLABackbone",
    "VLAConfig",
]


def _default_head() -> FlowConfig:
    return FlowConfig(
        horizon=4,
        act_steps=4,
        sample_steps=4,
        hidden=(256, 256, 256),
        noise_hidden=(64, 64),
        critic_hidden=(128, 128),
        normalize_obs=False,
    )


@dataclass
class VLAConfig:
    """Shapes of the two towers (tiny, randomly initialised by default), the image and
    instruction interface, pretrained loading, LoRA, and the flow action head."""

    ADDED: ClassVar[dict[str, str]] = {"attention": "causal", "vision_encoder": "siglip"}
    """How runs saved before these fields existed were trained."""

    vision_encoder: str = "film_keypoints"
    """"film_keypoints": an instruction-conditioned conv net with spatial-softmax
    keypoints (policies.vla_vision), ``keypoints`` image tokens; it learns where the named
    object is from a few thousand updates, where the from-scratch SigLIP tower did not
    (the measurement is in policies.vla_vision). "siglip": a SigLIP patch tower,
    (image_size / patch_size)^2 image tokens; the one vision_path loads."""
    keypoints: int = 16
    """Keypoints (image tokens) of the film_keypoints encoder."""
    conv_channels: int = 32
    """Channels of the film_keypoints encoder's convolutions."""
    conv_layers: int = 2
    """FiLM-conditioned 3x3 convolutions of the film_keypoints encoder."""
    image_size: int = 64
    """Height and width of the input images in pixels (square); must be a multiple of
    patch_size, and equal the pretrained tower's image_size when vision_path is set."""
    patch_size: int = 16
    """SigLIP patch size; (image_size / patch_size)^2 image tokens enter the decoder."""
    vision_hidden: int = 64
    """Width of the vision tower (ignored with vision_path)."""
    vision_layers: int = 2
    """Transformer layers of the vision tower (ignored with vision_path)."""
    vision_heads: int = 2
    """Attention heads of the vision tower; divides vision_hidden (ignored with vision_path)."""
    vision_mlp: int = 128
    """MLP width of the vision tower's layers (ignored with vision_path)."""
    lm_hidden: int = 64
    """Width of the decoder, and the size of the feature vector (ignored with language_path)."""
    lm_layers: int = 2
    """Decoder layers (ignored with language_path)."""
    lm_heads: int = 4
    """Decoder attention heads; divides lm_hidden (ignored with language_path)."""
    lm_kv_heads: int = 2
    """Decoder key/value heads (grouped-query attention); divides lm_heads (ignored with
    language_path)."""
    lm_mlp: int = 128
    """MLP width of the decoder's layers (ignored with language_path)."""
    vocab_size: int = 128
    """Rows of the decoder's token embedding; must exceed every token id the tokenizer
    gives (ignored with language_path, whose embedding decides)."""
    max_instruction_tokens: int = 16
    """Longest instruction in tokens; batches are padded to it."""
    pad_token_id: int = 0
    """Token id of padding in instruction ids (the word-level tokenizer's [PAD] is 0; set
    it to a pretrained tokenizer's pad id)."""
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    """Per-channel mean (RGB, on the [0, 1] scale) subtracted inside the module; SigLIP's
    processors use 0.5."""
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    """Per-channel std (RGB, on the [0, 1] scale) divided inside the module; > 0."""
    attention: str = "prefix"
    """"prefix": image and instruction tokens attend to each other both ways, the
    proprio token to everything (the prefix-LM pattern of PaliGemma and pi0), so an image
    patch can already know which colour the words name; "causal": each token sees only
    those before it, so the image tokens (first) never see the instruction and only the
    later tokens can match the two."""
    attn_implementation: str = "eager"
    """Attention kernel of both towers: "eager" (exports to ONNX) or "sdpa"."""
    vision_path: str = ""
    """Local directory of a pretrained SiglipVisionModel (save_pretrained); "" builds a
    random tower from the fields above."""
    language_path: str = ""
    """Local directory of a pretrained decoder (AutoModel: Llama, Qwen2, ...); "" builds
    a random LlamaModel from the fields above."""
    freeze_vision: bool = False
    """Keep the vision tower's weights fixed (LoRA freezes it regardless)."""
    lora_r: int = 0
    """0 trains both towers; > 0 adds a peft LoRA adapter of this rank to the decoder and
    trains only the adapter, the projectors, the heads and a film_keypoints encoder (a
    SigLIP tower is frozen)."""
    lora_alpha: float = 16.0
    """LoRA scaling alpha."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch, in [0, 1)."""
    lora_target: str = "all-linear"
    """Decoder modules the adapter wraps: "all-linear" or comma-separated names
    (q_proj,v_proj)."""
    head: FlowConfig = field(default_factory=_default_head)
    """The flow action expert and critic (chunk shapes, Euler steps, shortcut training,
    MLP sizes, ReinFlow's noise bounds); its normalize_obs is forced False: the features
    come out of the decoder's final norm."""

    def _bad(self, name: str, why: str) -> ValueError:
        return ValueError(f"VLAConfig.{name} {why}, got {getattr(self, name)!r}")

    def __post_init__(self) -> None:
        self.image_mean = tuple(float(v) for v in self.image_mean)
        self.image_std = tuple(float(v) for v in self.image_std)
        for name in (
            "image_size",
            "patch_size",
            "vision_hidden",
            "vision_layers",
            "vision_heads",
            "vision_mlp",
            "lm_hidden",
            "lm_layers",
            "lm_heads",
            "lm_kv_heads",
            "lm_mlp",
            "vocab_size",
            "max_instruction_tokens",
            "keypoints",
            "conv_channels",
            "conv_layers",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise self._bad(name, "must be an integer >= 1")
        if self.image_size % self.patch_size:
            raise self._bad("image_size", f"must be a multiple of patch_size ({self.patch_size})")
        for name, whole in (
            ("vision_heads", "vision_hidden"),
            ("lm_heads", "lm_hidden"),
            ("lm_kv_heads", "lm_heads"),
        ):
            if getattr(self, whole) % getattr(self, name):
                raise self._bad(name, f"must divide {whole} ({getattr(self, whole)})")
        if (self.lm_hidden // self.lm_heads) % 2:
            raise self._bad("lm_heads", "must leave an even head size (rotary embedding)")
        p = self.pad_token_id
        if isinstance(p, bool) or not isinstance(p, int) or p < 0:
            raise self._bad("pad_token_id", "must be an integer >= 0")
        if len(self.image_mean) != 3 or len(self.image_std) != 3:
            raise self._bad("image_mean", "and image_std must have 3 entries (RGB)")
        if not all(s > 0 for s in self.image_std):
            raise self._bad("image_std", "must be > 0")
        if self.vision_encoder not in VISION_ENCODERS:
            raise self._bad("vision_encoder", f"must be one of {list(VISION_ENCODERS)}")
        if self.vision_path and self.vision_encoder != "siglip":
            raise self._bad(
                "vision_encoder", "must be 'siglip' to load a pretrained tower (vision_path)"
            )
        if self.attention not in ATTENTION_PATTERNS:
            raise self._bad("attention", f"must be one of {list(ATTENTION_PATTERNS)}")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise self._bad("attn_implementation", f"must be one of {list(ATTN_IMPLEMENTATIONS)}")
        if isinstance(self.lora_r, bool) or not isinstance(self.lora_r, int) or self.lora_r < 0:
            raise self._bad("lora_r", "must be an integer >= 0")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise self._bad("lora_dropout", "must be in [0, 1)")
        if not isinstance(self.head, FlowConfig):
            raise self._bad("head", "must be a FlowConfig")
        self.head = dataclasses.replace(self.head, normalize_obs=False)


def _require(name: str):
    try:
        return __import__(name)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"the VLA policy needs {name}: pip install 'sim2real[llm]'") from e


def _local_dir(path: str, what: str) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(
            f"VLAConfig.{what} {str(p)!r} is not a directory saved with save_pretrained "
            "(no config.json there); nothing is downloaded"
        )
    return p


def _vision_tower(cfg: VLAConfig) -> nn.Module:
    tf = _require("transformers")
    if cfg.vision_path:
        model = tf.SiglipVisionModel.from_pretrained(
            str(_local_dir(cfg.vision_path, "vision_path")),
            local_files_only=True,
            attn_implementation=cfg.attn_implementation,
        )
        size = model.config.image_size
        if size != cfg.image_size:
            raise ValueError(
                f"VLAConfig.image_size is {cfg.image_size}, the vision tower at "
                f"{cfg.vision_path} was trained on {size}"
            )
        return model
    vc = tf.SiglipVisionConfig(
        hidden_size=cfg.vision_hidden,
        intermediate_size=cfg.vision_mlp,
        num_hidden_layers=cfg.vision_layers,
        num_attention_heads=cfg.vision_heads,
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        vision_use_head=False,
    )
    vc._attn_implementation = cfg.attn_implementation
    return tf.SiglipVisionModel(vc)


def _language_model(cfg: VLAConfig, positions: int) -> nn.Module:
    tf = _require("transformers")
    if cfg.language_path:
        return tf.AutoModel.from_pretrained(
            str(_local_dir(cfg.language_path, "language_path")),
            local_files_only=True,
            attn_implementation=cfg.attn_implementation,
        )
    lc = tf.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.lm_hidden,
        intermediate_size=cfg.lm_mlp,
        num_hidden_layers=cfg.lm_layers,
        num_attention_heads=cfg.lm_heads,
        num_key_value_heads=cfg.lm_kv_heads,
        max_position_embeddings=positions,
        pad_token_id=cfg.pad_token_id,
        bos_token_id=None,
        eos_token_id=None,
    )
    lc._attn_implementation = cfg.attn_implementation
    return tf.LlamaModel(lc)


def _add_lora(model: nn.Module, cfg: VLAConfig) -> nn.Module:
    peft = _require("peft")
    target: str | list[str] = cfg.lora_target
    if target != "all-linear":
        target = [t.strip() for t in target.split(",") if t.strip()]
    lora = peft.LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=target,
    )
    # get_peft_model freezes every base weight, the token embedding included
    return peft.get_peft_model(model, lora)


class VLABackbone(nn.Module):
    """(images uint8 [B, H, W, 3], token ids int64 [B, L], proprio [B, P]) -> features
    [B, lm width]: the sequence of the module docstring through the decoder, the last
    token's hidden state. No input checks here (the policy makes them; the exported graph
    trusts its inputs)."""

    def __init__(self, cfg: VLAConfig, proprio_size: int) -> None:
        super().__init__()
        self.image_size = cfg.image_size
        self.prefix_attention = cfg.attention == "prefix"
        self.pad_token_id = cfg.pad_token_id
        self.keypoint_encoder = cfg.vision_encoder == "film_keypoints"
        if self.keypoint_encoder:
            self.num_image_tokens = cfg.keypoints
        else:
            self.vision = _vision_tower(cfg)
            vc = self.vision.config
            patch = vc.patch_size if isinstance(vc.patch_size, int) else vc.patch_size[0]
            self.num_image_tokens = (cfg.image_size // patch) ** 2
        self.language = _language_model(cfg, self.num_image_tokens + cfg.max_instruction_tokens + 1)
        width = self.language.config.hidden_size
        # with keypoints, the action expert also reads them and the normalised proprio
        # directly (as pi0's expert attends to every prefix token rather than one summary)
        extra = 2 * cfg.keypoints + proprio_size if self.keypoint_encoder else 0
        self.feature_size = int(width) + extra
        embedding = self.language.get_input_embeddings()
        self.vocab_size = int(embedding.num_embeddings)
        if self.keypoint_encoder:
            self.vision = FilmKeypointEncoder(
                cfg.image_size,
                embedding.embedding_dim,
                cfg.conv_channels,
                cfg.keypoints,
                cfg.conv_layers,
            )
            # a keypoint token: its coordinates through a linear map, plus which keypoint
            self.projector = nn.Linear(2, width)
            self.keypoint_embedding = nn.Parameter(0.02 * torch.randn(cfg.keypoints, width))
        else:
            self.projector = nn.Linear(vc.hidden_size, width)
        self.proprio_normalizer = RunningMeanStd(proprio_size)
        self.proprio_proj = nn.Linear(proprio_size, width)
        mean = torch.tensor(cfg.image_mean)
        std = torch.tensor(cfg.image_std)
        # uint8 -> (x / 255 - mean) / std as one multiply-add per channel
        self.register_buffer("pixel_scale", (1.0 / (255.0 * std)).view(1, 3, 1, 1))
        self.register_buffer("pixel_shift", (-mean / std).view(1, 3, 1, 1))
        if cfg.lora_r > 0:
            self.language = _add_lora(self.language, cfg)
        # LoRA freezes a pretrained tower; the keypoint encoder is never pretrained
        if cfg.freeze_vision or (cfg.lora_r > 0 and not self.keypoint_encoder):
            for p in self.vision.parameters():
                p.requires_grad_(False)

    @property
    def is_peft(self) -> bool:
        return hasattr(self.language, "peft_config")

    def merged(self) -> VLABackbone:
        """A frozen copy in eval mode, any LoRA adapter merged into the decoder's weights
        (a plain transformers model: fewer ops in an exported graph)."""
        out = copy.deepcopy(self)
        if out.is_peft:
            out.language = out.language.merge_and_unload()
        out.eval()
        for p in out.parameters():
            p.requires_grad_(False)
        return out

    def forward(
        self, images: torch.Tensor, token_ids: torch.Tensor, proprio: torch.Tensor
    ) -> torch.Tensor:
        return self.features_and_keypoints(images, token_ids, proprio)[0]

    def features_and_keypoints(
        self, images: torch.Tensor, token_ids: torch.Tensor, proprio: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The features and the film_keypoints encoder's keypoints [B, K, 2] (None for a
        SigLIP tower): what an auxiliary loss on the image's reading can reach."""
        b = images.shape[0]
        pixels = images.permute(0, 3, 1, 2).to(self.pixel_scale.dtype)
        pixels = pixels * self.pixel_scale + self.pixel_shift
        words = self.language.get_input_embeddings()(token_ids)
        if self.keypoint_encoder:  # the image read in the light of the instruction's words
            real = (token_ids != self.pad_token_id).unsqueeze(-1).to(words.dtype)
            said = (words * real).sum(1) / real.sum(1).clamp_min(1.0)
            keypoints = self.vision(pixels, said)
            image = self.projector(keypoints) + self.keypoint_embedding
        else:
            keypoints = None
            image = self.projector(self.vision(pixel_values=pixels).last_hidden_state)
        normed = self.proprio_normalizer(proprio)
        state = self.proprio_proj(normed).unsqueeze(1)
        x = torch.cat([image, words.to(image.dtype), state], dim=1)

        ones = torch.ones(b, self.num_image_tokens, dtype=torch.bool, device=x.device)
        valid = torch.cat([ones, token_ids != self.pad_token_id, ones[:, :1]], dim=1)
        positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
        idx = torch.arange(x.shape[1], device=x.device)
        query, key = idx.view(1, -1, 1), idx.view(1, 1, -1)
        if self.prefix_attention:  # every token sees the prefix; only the last sees itself
            seen = (key < x.shape[1] - 1) | (query == x.shape[1] - 1)
        else:
            seen = query >= key
        allowed = seen & valid.unsqueeze(1)  # [B, S, S]
        # an additive 4-D mask is used as given by transformers (eager and sdpa alike)
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min).unsqueeze(1)
        out = self.language(
            inputs_embeds=x, attention_mask=mask, position_ids=positions, use_cache=False
        )
        summary = out.last_hidden_state[:, -1]
        if keypoints is None:
            return summary, None
        direct = [keypoints.flatten(1).to(summary.dtype), normed.to(summary.dtype)]
        return torch.cat([summary, *direct], dim=-1), keypoints
