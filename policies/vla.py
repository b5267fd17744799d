"""Vision-language-action policy: a vision encoder and a Llama/Qwen2-style decoder read
an image, an instruction and the robot's proprioception; a flow-matching action expert
(:class:`policies.flow.FlowPolicy`) turns the decoder's last hidden state (with the
image's keypoints and the proprioception, see below) into action chunks; a value head on
the same features serves PPO.

Backbone (:class:`VLABackbone`). One sequence per row::

    [ image tokens (N) | instruction (L, right-padded) | proprio ]

- image tokens, by ``VLAConfig.vision_encoder``:
  "film_keypoints" (the default; :mod:`policies.vla_vision`): a convolutional encoder
  FiLM-conditioned on the instruction's mean token embedding, whose spatial softmax gives
  N = ``keypoints`` (x, y) points, each a token (a linear map of its coordinates plus a
  learned embedding of which keypoint it is);
  "siglip": ``SiglipVisionModel`` patch embeddings (N = (image_size / patch_size)^2,
  after its post-layernorm; its attention-pooling head is unused) through a linear
  projector into the LM's width: the encoder a pretrained tower (``vision_path``) has;
- instruction tokens: the LM's own token embeddings of the ids;
- proprio token: the proprioceptive observation, normalized (running mean/std, saved
  with the weights and exported with them), through a linear layer.

Features. SigLIP: the last token's hidden state. film_keypoints: that hidden state, the
keypoints and the normalized proprioception side by side, so that the action expert
reads where things are directly, as pi0's action expert attends to every prefix token
rather than to one summary of them.

Attention (``VLAConfig.attention``). "prefix", the default: image and instruction
tokens attend to each other in both directions and the proprio token to everything, the
prefix-LM pattern of PaliGemma and pi0. An image patch then sees the words in the first
layer and can mark itself as the named object, which a patch under causal attention
cannot: the image comes first, so causally no image token ever sees the instruction,
and matching a colour to a place is left to the few tokens after it. "causal" keeps
what a pretrained decoder was trained with (and is how runs saved before the field
existed were trained). Padding sits between the instruction and the proprio token and
is made invisible either way: padded positions are masked as keys, and position ids
count only real tokens (RoPE is relative, so the proprio token sees image, words and
itself at the same relative distances whatever the padding). The summary is the hidden
state of the last token, the proprio token: always present, and the only one that has
seen the whole sequence. So a row's features do not depend on its padding, nor
on what it is batched with (tested). ``max_instruction_tokens`` bounds L; the tokenizer
(:mod:`policies.vla_tokenizer`) pads every batch to it, the shape the exported graph
takes.

Images (public API and exported graph): ``uint8 [B, H, W, 3]`` RGB, H = W =
``image_size``, as a camera driver (ROS ``rgb8``) delivers them; scaling to [0, 1], the
per-channel mean/std normalization and the transpose to channels-first happen inside
the module, so the robot side never has to reproduce a preprocessing pipeline.

Action head: why a flow expert and not discretised action tokens (OpenVLA, RT-2).

- Continuous chunks. Tokens quantize each dimension into 256 bins and decode a chunk
  of horizon x A values autoregressively, one decoder step per value (7 joints x 4
  steps = 28 sequential steps), with a bin width of 2/256 ~ 0.008 of the normalized
  range that fine position control cannot go below. The flow expert outputs real
  numbers for the whole chunk after one backbone pass and K passes of a small MLP.
  Measured on the tiny default (one CPU thread, batch 1, load ~2.9 on 2 cores): the
  decoder's pass over the 33-token sequence 6.8 ms; that pass plus 28 cached decode
  steps 112 ms; the flow head's 4 Euler steps 2.5 ms.
- One-step sampling. The project's shortcut flow model samples in 1 to 10 Euler steps
  from one network; one step is as good as four plain flow-matching steps on a bimodal
  toy (measured in :mod:`policies.flow`), so a VLA pays one backbone pass plus one MLP
  pass per chunk. Multimodal demonstrations stay multimodal, which a per-dimension
  regression head (or greedy token decoding of a unimodal bin) would average.
- Reuse. The head *is* a ``FlowPolicy`` whose observation is the feature vector
  (``normalize_obs=False``): BC (``bc_loss``), ReinFlow's exact chain log-probabilities
  (``chain_terms``), FPO's ``cfm_loss``, the critic and the exported Euler unrolling
  (:class:`policies.flow_inference.FlowInference`) are the tested code paths of the
  flow family, with gradients flowing into the backbone. Token decoding would need a
  second RL path (token log-probabilities, as the GRPO language-model policy) and a
  sampling loop with a KV cache in the exported graph.
- What tokens would give: the LM's pretrained output layer and log-probabilities of
  actions under the LM itself. With a tiny or LoRA-tuned decoder and a fresh head
  either way, that advantage is small here.

Critic: ``value`` is the head's value MLP on the same features (RL4VLA-style PPO:
actor and critic share the backbone, and the value loss trains it too; a learner that
wants a detached critic calls ``policy.head.value(features.detach())``).

Pretrained weights. ``vision_path`` / ``language_path`` name local directories saved
with ``save_pretrained`` (a ``SiglipVisionModel``; any decoder ``AutoModel`` loads, e.g.
a ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` directory gives its base model);
``local_files_only=True``, nothing downloads. ``lora_r > 0`` wraps the decoder in a
peft LoRA adapter and freezes both towers: only the adapter, the projectors and the
heads train.

Deployment: :meth:`VLAPolicy.inference_module` (:mod:`policies.vla_inference`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from policies.flow import ChainTerms, FlowPolicy, FlowSample
from policies.vla_backbone import ATTN_IMPLEMENTATIONS, VLABackbone, VLAConfig

__all__ = ["ATTN_IMPLEMENTATIONS", "VLABackbone", "VLAConfig", "VLAPolicy"]


class VLAPolicy(nn.Module):
    """Backbone (:class:`VLABackbone`) + flow action expert and critic (``head``, a
    :class:`policies.flow.FlowPolicy` over the features).

    Every method takes ``images`` uint8 [B, image_size, image_size, 3] (RGB),
    ``token_ids`` int64 [B, L <= max_instruction_tokens] (right-padded with
    pad_token_id; :func:`policies.vla_tokenizer.encode_instructions`), ``proprio`` float
    [B, proprio_size] in env units, torch tensors or numpy arrays; wrong shapes or types
    are a ValueError naming expected and got. Actions are chunks [B, horizon, A] in env
    units, as FlowPolicy's. A learner that needs several head quantities of one batch
    computes :meth:`features` once and calls ``head``'s methods on them.
    """

    def __init__(
        self,
        proprio_size: int,
        action_size: int,
        cfg: VLAConfig | None = None,
        action_low: Any = None,
        action_high: Any = None,
    ) -> None:
        super().__init__()
        cfg = cfg if cfg is not None else VLAConfig()
        if proprio_size < 1 or action_size < 1:
            raise ValueError(
                f"VLAPolicy: proprio and action sizes must be >= 1, got {proprio_size}, "
                f"{action_size}"
            )
        self.cfg = cfg
        self.proprio_size = int(proprio_size)
        self.action_size = int(action_size)
        self.backbone = VLABackbone(cfg, self.proprio_size)
        self.head = FlowPolicy(
            self.backbone.feature_size, action_size, cfg.head, action_low, action_high
        )

    @property
    def policy_family(self) -> str:
        return "vla_flow"

    # ------------------------------------------------------------------ inputs
    def check_inputs(
        self, images: Any, token_ids: Any, proprio: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The three inputs as tensors on the policy's device, or a ValueError."""
        dev = self.head.action_low.device
        images = torch.as_tensor(images, device=dev)
        s = self.cfg.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (s, s, 3):
            hint = ""
            if images.dim() == 4 and images.shape[1] == 3 and images.shape[-1] != 3:
                hint = " (channels go last)"
            raise ValueError(
                f"images must be uint8 [B, {s}, {s}, 3] (RGB, channels last), got "
                f"{list(images.shape)}{hint}"
            )
        if images.dtype != torch.uint8:
            raise ValueError(
                f"images must be uint8 [B, {s}, {s}, 3] (0-255), got dtype {images.dtype}"
            )
        b = images.shape[0]
        ids = torch.as_tensor(token_ids, device=dev)
        lmax = self.cfg.max_instruction_tokens
        if ids.dim() != 2 or ids.shape[0] != b or ids.shape[1] > lmax:
            raise ValueError(
                f"token_ids must be [B={b}, L <= max_instruction_tokens={lmax}], got "
                f"{list(ids.shape)}"
            )
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"token_ids must be integers (int64), got dtype {ids.dtype}")
        ids = ids.long()
        vocab = self.backbone.vocab_size
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(
                f"token_ids must be in [0, {vocab}) (the decoder's vocabulary), got "
                f"[{int(ids.min())}, {int(ids.max())}]"
            )
        proprio = torch.as_tensor(proprio, device=dev)
        if tuple(proprio.shape) != (b, self.proprio_size) or not proprio.is_floating_point():
            raise ValueError(
                f"proprio must be float [B={b}, {self.proprio_size}], got "
                f"{list(proprio.shape)} {proprio.dtype}"
            )
        return images, ids, proprio.to(self.head.action_low.dtype)

    @torch.no_grad()
    def update_proprio_normalizer(self, proprio: Any) -> None:
        """Fold proprioceptive observations [..., proprio_size] into the statistics."""
        self.backbone.proprio_normalizer.update(torch.as_tensor(proprio, dtype=torch.float32))

    def features(self, images: Any, token_ids: Any, proprio: Any) -> torch.Tensor:
        """The backbone's feature vector [B, feature_size], with gradient."""
        return self.backbone(*self.check_inputs(images, token_ids, proprio))

    def features_and_keypoints(
        self, images: Any, token_ids: Any, proprio: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The features and the film_keypoints encoder's keypoints [B, K, 2] in [-1, 1]
        (None with a SigLIP tower), with gradient."""
        return self.backbone.features_and_keypoints(*self.check_inputs(images, token_ids, proprio))

    # ------------------------------------------------------------------ training
    def bc_loss(
        self,
        images: Any,
        token_ids: Any,
        proprio: Any,
        actions: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Shortcut flow-matching BC loss on demonstration chunks [B, horizon, A] (env
        units), gradient into head and backbone (FlowPolicy.bc_loss)."""
        return self.head.bc_loss(self.features(images, token_ids, proprio), actions, generator)

    def cfm_loss(
        self,
        images: Any,
        token_ids: Any,
        proprio: Any,
        x1: torch.Tensor,
        tau: torch.Tensor,
        eps: torch.Tensor,
        reduce: str = "mean",
    ) -> torch.Tensor:
        """FPO's conditional flow-matching losses [B, N] of given draws (FlowPolicy.cfm_loss)."""
        return self.head.cfm_loss(self.features(images, token_ids, proprio), x1, tau, eps, reduce)

    def chain_terms(
        self, images: Any, token_ids: Any, proprio: Any, chain: torch.Tensor, reduce: str = "sum"
    ) -> ChainTerms:
        """ReinFlow's per-transition log-probabilities, entropies and stds of stored chains
        [B, K + 1, horizon, A] (FlowPolicy.chain_terms), with gradient."""
        return self.head.chain_terms(self.features(images, token_ids, proprio), chain, reduce)

    def value(self, images: Any, token_ids: Any, proprio: Any) -> torch.Tensor:
        """V [B] from the shared features (gradient reaches the backbone)."""
        return self.head.value(self.features(images, token_ids, proprio))

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def sample(
        self,
        images: Any,
        token_ids: Any,
        proprio: Any,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        stochastic: bool = True,
        return_chain: bool = False,
        *,
        noise: torch.Tensor | None = None,
    ) -> FlowSample:
        """Action chunks [B, horizon, A] in env units (and the chain): FlowPolicy.sample
        on the features, same arguments."""
        feat = self.features(images, token_ids, proprio)
        return self.head.sample(feat, steps, generator, stochastic, return_chain, noise=noise)

    # ------------------------------------------------------------------ parameters
    def trainable_named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return ((n, p) for n, p in self.named_parameters() if p.requires_grad)

    # ------------------------------------------------------------------ export
    def inference_module(self, steps: int | None = None, stochastic: bool = False) -> nn.Module:
        """A frozen plain module for ONNX: ``forward(image uint8 [B, H, W, 3],
        instruction_ids int64 [B, L], proprio float32 [B, P], noise) -> actions
        [B, horizon, A]`` in env units, ``steps`` Euler steps unrolled (default
        ``head.steps``), LoRA merged, image and proprio normalization inside;
        deterministic given noise (x0 [B, horizon, A]; stochastic: [B, K + 1, horizon,
        A])."""
        from policies.vla_inference import VLAInference

        return VLAInference(self, steps, stochastic)
