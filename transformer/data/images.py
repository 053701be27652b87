"""Image preprocessing: per-channel normalisation and seeded augmentation.

Shapes: B batch, H height, W width, C channels. Inputs are uint8 [H, W, C] (one image)
or [B, H, W, C] (`augment_batch`); outputs of `normalize` are float32 of the same shape
with values (x / 255 - mean) / std.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def channel_stats(images: Iterable[np.ndarray]) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """Per-channel mean and std of uint8 images on the [0, 1] scale."""
  total, total_sq, count = 0.0, 0.0, 0
  for im in images:
    x = np.asarray(im, np.float64).reshape(-1, im.shape[-1]) / 255.0  # [H*W, C]
    total = total + x.sum(0)
    total_sq = total_sq + (x * x).sum(0)
    count += x.shape[0]
  if not count:
    raise ValueError("no images to compute channel statistics from")
  mean = total / count
  std = np.sqrt(np.maximum(total_sq / count - mean * mean, 0.0))
  return tuple(float(m) for m in mean), tuple(float(max(s, 1e-6)) for s in std)


def normalize(image: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
  """uint8 [..., C] -> float32 [..., C], (x / 255 - mean) / std per channel."""
  x = np.asarray(image, np.float32) / 255.0
  return (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def resize_center_crop(image: np.ndarray, size: int) -> np.ndarray:
  """uint8 [H, W, C] -> uint8 [size, size, C]: shorter side to `size` (bicubic), centre crop."""
  from PIL import Image  # Pillow; only needed when images are resized.

  h, w, c = image.shape
  if (h, w) == (size, size):
    return image
  scale = size / min(h, w)
  nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
  pil = Image.fromarray(image[..., 0] if c == 1 else image)
  resized = np.asarray(pil.resize((nw, nh), Image.Resampling.BICUBIC)).reshape(nh, nw, c)
  top, left = (nh - size) // 2, (nw - size) // 2
  return resized[top : top + size, left : left + size]  # [size, size, C]


def random_crop(image: np.ndarray, padding: int, rng: np.random.Generator) -> np.ndarray:
  """Zero-pads `padding` pixels on each side, then crops back to [H, W] at a random offset."""
  if padding <= 0:
    return image
  h, w = image.shape[:2]
  padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))  # [H+2p, W+2p, C]
  top, left = rng.integers(0, 2 * padding + 1, size=2)
  return padded[top : top + h, left : left + w]  # [H, W, C]


def random_flip(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Mirrors left-right with probability 1/2."""
  return image[:, ::-1] if rng.random() < 0.5 else image


def augment(
  image: np.ndarray, rng: np.random.Generator, crop_padding: int, flip: bool
) -> np.ndarray:
  """Random crop (if `crop_padding` > 0) then random horizontal flip (if `flip`)."""
  image = random_crop(image, crop_padding, rng)
  if flip:
    image = random_flip(image, rng)
  return np.ascontiguousarray(image)


def augment_batch(
  batch: np.ndarray, rng: np.random.Generator, crop_padding: int, flip: bool
) -> np.ndarray:
  """`augment` on each image of uint8 [B, H, W, C] at once: a random crop of the zero-padded
  image (an offset per image) then a left-right flip with probability 1/2 (per image)."""
  b, h, w, _ = batch.shape
  if crop_padding > 0:
    p = crop_padding
    padded = np.pad(batch, ((0, 0), (p, p), (p, p), (0, 0)))  # [B, H+2p, W+2p, C]
    top, left = rng.integers(0, 2 * p + 1, size=(2, b))
    rows = top[:, None] + np.arange(h)  # [B, H]
    cols = left[:, None] + np.arange(w)  # [B, W]
    batch = padded[np.arange(b)[:, None, None], rows[:, :, None], cols[:, None, :]]
  if flip:
    mirrored = rng.random(b) < 0.5  # [B]
    batch = np.where(mirrored[:, None, None, None], batch[:, :, ::-1], batch)
  return np.ascontiguousarray(batch)
