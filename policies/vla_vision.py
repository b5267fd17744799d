"""An instruction-conditioned convolutional vision encoder with spatial-softmax keypoints,
the VLA's alternative to a SigLIP patch tower (``VLAConfig.vision_encoder="film_keypoints"``).

Why it exists. A tiny SigLIP tower and decoder trained from scratch did not learn where
the named object is: on instructed_reach, regressing the named ball's position from the
backbone's features stalled at 0.07 m RMSE after 1 500 updates, which is what the
fingertip alone predicts (0.11 m with proprioception hidden, against 0.15-0.17 for the
mean), and SFT's actions explained no more of the expert's than proprioception does.
This encoder, on the same data, localises the ball to about 0.013 m in 200 updates. Two
standard pieces do it:

- FiLM (Perez et al. 2018; RT-1's FiLM-EfficientNet): the instruction scales and shifts
  the convolutional features, so the image is read already knowing which colour is meant.
  The FiLM layers start at zero (identity), so training begins from the plain conv net.
- Spatial softmax (Levine et al. 2016; robomimic, Diffusion Policy): each of K feature
  maps becomes a probability over pixels, and its expected (x, y) a keypoint, a
  coordinate read to a fraction of a pixel and as well at every place in the image.

The decoder then sees K keypoint tokens instead of patch tokens. A pretrained vision
tower (``vision_path``) is a SigLIP one; this encoder is for CPU-sized models trained
from scratch.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FilmKeypointEncoder"]


class FilmKeypointEncoder(nn.Module):
    """(pixels [B, 3, H, W] normalised, condition [B, C]) -> keypoints [B, K, 2] in [-1, 1]
    (x to the image's right, y up).

    A stride-2 5x5 convolution, then ``layers`` 3x3 convolutions each followed by FiLM
    from the condition and a ReLU, then a 1x1 convolution to ``keypoints`` maps and the
    spatial softmax (a learned temperature per map).
    """

    def __init__(
        self, image_size: int, condition_size: int, channels: int, keypoints: int, layers: int = 2
    ) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 5, stride=2, padding=2)
        self.convs = nn.ModuleList(
            nn.Conv2d(channels, channels, 3, padding=1) for _ in range(layers)
        )
        # token embeddings start tiny (a decoder's init std is ~0.02): without this norm
        # FiLM would barely move in the first thousands of updates
        self.condition_norm = nn.LayerNorm(condition_size, elementwise_affine=False)
        self.films = nn.ModuleList(nn.Linear(condition_size, 2 * channels) for _ in range(layers))
        for f in self.films:  # identity at the start
            nn.init.zeros_(f.weight)
            nn.init.zeros_(f.bias)
        self.to_maps = nn.Conv2d(channels, keypoints, 1)
        self.log_temperature = nn.Parameter(torch.zeros(keypoints))
        side = (image_size + 1) // 2
        coords = torch.linspace(-1.0, 1.0, side)
        # row 0 is the image's top: y runs from +1 down to -1
        self.register_buffer("xs", coords.view(1, 1, 1, side))
        self.register_buffer("ys", coords.flip(0).view(1, 1, side, 1))
        self.keypoints = int(keypoints)

    def forward(self, pixels: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(pixels))
        condition = self.condition_norm(condition)
        for conv, film in zip(self.convs, self.films):
            scale, shift = film(condition).unsqueeze(-1).unsqueeze(-1).chunk(2, dim=1)
            x = torch.relu(conv(x) * (1.0 + scale) + shift)
        maps = self.to_maps(x) * self.log_temperature.exp().view(1, -1, 1, 1)
        b, k, h, w = maps.shape
        p = maps.flatten(2).softmax(-1).view(b, k, h, w)
        px = (p.sum(2, keepdim=True) * self.xs).sum((-1, -2))
        py = (p.sum(3, keepdim=True) * self.ys).sum((-1, -2))
        return torch.stack([px, py], dim=-1)
