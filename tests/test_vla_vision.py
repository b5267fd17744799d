"""The film_keypoints vision encoder: the instruction decides which object its keypoints
find, and it finds it to a fraction of the image."""

from __future__ import annotations

import torch

from policies.vla_vision import FilmKeypointEncoder


def _scenes(n: int, g: torch.Generator, size: int = 32):
    """Dark images with a red and a blue 3x3 square at random places; which one is named
    (one-hot), and where the named one is in the encoder's coordinates (x right, y up)."""
    images = torch.full((n, 3, size, size), -1.0)
    where = torch.randint(2, size - 2, (n, 2, 2), generator=g)  # [n, colour, (row, col)]
    for i in range(n):
        for c in range(2):
            r, k = where[i, c].tolist()
            images[i, 0 if c == 0 else 2, r - 1 : r + 2, k - 1 : k + 2] = 1.0
    named = torch.randint(0, 2, (n,), generator=g)
    rc = where[torch.arange(n), named].float()
    half = (size // 2 - 1) / 2  # the encoder's grid: size / 2 cells over [-1, 1]
    xy = torch.stack([rc[:, 1] / 2 / half - 1, 1 - rc[:, 0] / 2 / half], -1)
    return images, torch.nn.functional.one_hot(named, 2).float(), xy


def test_the_named_object_is_found_and_the_other_is_not():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    enc = FilmKeypointEncoder(32, 2, channels=16, keypoints=4)
    probe = torch.nn.Linear(8, 2)
    params = [*enc.parameters(), *probe.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(300):
        images, said, xy = _scenes(32, g)
        loss = (probe(enc(images, said).flatten(1)) - xy).square().sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    images, said, xy = _scenes(256, g)
    with torch.no_grad():
        keypoints = enc(images, said)
        err = (probe(keypoints.flatten(1)) - xy).square().sum(-1).mean().sqrt()
        swapped = (probe(enc(images, 1 - said).flatten(1)) - xy).square().sum(-1).mean().sqrt()
    assert keypoints.abs().max() <= 1.0
    # colour-blind, the best guess is between the two squares: ~0.5 RMSE on this grid
    assert err < 0.12, float(err)
    assert swapped > 4 * err, (float(swapped), float(err))
