"""DINOv2 (`Dinov2ForImageClassification`): ViT with layer scale and a [CLS] + mean head.

Each layer is `norm1`, attention, `layer_scale1`, then `norm2`, the MLP (`fc1`, GELU, `fc2`;
width int(D * mlp_ratio)) or SwiGLU (`use_swiglu_ffn`, the giant model), `layer_scale2`:
our pre-LN `Block` with `layer_scale_init` = `layerscale_value` and the `lambda1` vectors
as `self_attention_scale` / `ffn_scale`. SwiGLU's width is HF's
(int(int(D * mlp_ratio) * 2 / 3) + 7) // 8 * 8, and its `weights_in` [2F, D] packs the
gate (our wi_0) then the up projection (wi_1). The classifier reads concat([CLS], mean of
the patch tokens) (`pooling='cls_mean'`).

Image size: HF's model resamples its patch position grid to any input size (bicubic,
`interpolate_pos_encoding`). Loading with `image_size=S` (`max_len` becomes (S / P)^2 + 1
unless given) resamples the table once, in NumPy, as PyTorch's `interpolate(mode='bicubic',
align_corners=False)` does, so the model at S gives HF's logits at S. The `mask_token`
(masked pretraining only) is not read, and export writes `use_mask_token=False`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.convert import vit
from transformer.convert.base import (
  Converter,
  Rule,
  attention,
  linear,
  norm,
  require,
  same,
  unsupported,
)
from transformer.nn.config import ModelConfig

ARCHITECTURE = "Dinov2ForImageClassification"
PREFIX = "dinov2."
CUBIC_A = -0.75  # PyTorch's bicubic kernel (Keys 1981 with a = -0.75)


def _hidden(d_model: int, mlp_ratio: float, swiglu: bool) -> int:
  """HF's feed-forward width: int(D * mlp_ratio), SwiGLU's 2/3 of it rounded up to 8."""
  hidden = int(d_model * mlp_ratio)
  return (int(hidden * 2 / 3) + 7) // 8 * 8 if swiglu else hidden


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "drop_path_rate", (0.0,))  # stochastic depth: we have none
  swiglu = require(hf, a, "use_swiglu_ffn", (False, True))
  scale = hf.get("layerscale_value", 1.0)
  if not isinstance(scale, int | float) or isinstance(scale, bool):
    unsupported(a, "layerscale_value", scale, ("a number",))
  stack = {
    **hf,
    "intermediate_size": _hidden(hf["hidden_size"], hf.get("mlp_ratio", 4), swiglu),
    "layer_norm_eps": hf.get("layer_norm_eps", 1e-6),
  }
  if swiglu:  # the SwiGLU FFN gates with SiLU whatever hidden_act says
    stack["hidden_act"] = "gelu"
  fields = vit.fields_from_hf(stack, a)
  return {
    **fields,
    "activation": "swiglu" if swiglu else fields["activation"],
    "pooling": "cls_mean",
    "layer_scale_init": float(scale),
  }


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  a = ARCHITECTURE
  if c.layer_scale_init is None:
    unsupported(a, "ModelConfig.layer_scale_init", None, ("a number (DINOv2 scales every branch)",))
  swiglu = c.activation == "swiglu"
  # HF's mlp_ratio is an int: the one whose width is d_ff, if there is one.
  candidates = range(1, 2 * c.d_ff // c.d_model + 2)  # F >= 2/3 * D * r - 1 with SwiGLU
  ratios = [r for r in candidates if _hidden(c.d_model, r, swiglu) == c.d_ff]
  if not ratios:
    rule = "(int(D * r * 2 / 3) + 7) // 8 * 8" if swiglu else "D * r"
    unsupported(
      a, "ModelConfig.d_ff", c.d_ff, (f"{rule} for an integer mlp_ratio r, D={c.d_model}",)
    )
  fields = vit.fields_to_hf(c.replace(activation="gelu") if swiglu else c, a)
  del fields["intermediate_size"]
  return {
    "model_type": "dinov2",
    **fields,
    "mlp_ratio": ratios[0],
    "use_swiglu_ffn": swiglu,
    "layerscale_value": float(c.layer_scale_init),
    "drop_path_rate": 0.0,
    "use_mask_token": False,
  }


def _cubic_weights(n_in: int, n_out: int) -> np.ndarray:
  """[n_out, n_in]: PyTorch's 1-D bicubic resampling (align_corners=False, no antialias):
  output i reads x = (i + 0.5) * n_in / n_out - 0.5 through the 4-tap cubic convolution
  kernel, taps beyond the edge clamped to it."""

  def kernel(t: float) -> float:  # the cubic convolution weight at distance |t| < 2
    t = abs(t)
    if t <= 1:
      return ((CUBIC_A + 2) * t - (CUBIC_A + 3)) * t * t + 1
    return ((CUBIC_A * t - 5 * CUBIC_A) * t + 8 * CUBIC_A) * t - 4 * CUBIC_A

  weights = np.zeros((n_out, n_in))
  for i in range(n_out):
    x = (i + 0.5) * n_in / n_out - 0.5
    left = math.floor(x)
    for tap in range(left - 1, left + 3):
      weights[i, min(max(tap, 0), n_in - 1)] += kernel(x - tap)
  return weights


def resample_positions(table: np.ndarray, grid: int) -> np.ndarray:
  """A DINOv2 position table [1, 1 + g*g, D] ([CLS] first) -> [1, 1 + grid*grid, D], its
  patch rows resampled as HF's `interpolate_pos_encoding` does (float64, then the input's
  dtype); the same table when g == grid."""
  patches = table.shape[1] - 1
  g = math.isqrt(patches)
  if g * g != patches:
    raise ValueError(f"a position table of {patches} patch rows is not a square grid")
  if g == grid:
    return table
  w = _cubic_weights(g, grid)  # [grid, g]
  square = table[0, 1:].astype(np.float64).reshape(g, g, -1)  # [g, g, D]
  resampled = np.einsum("ij,jkd,lk->ild", w, square, w).reshape(1, grid * grid, -1)
  return np.concatenate([table[:, :1], resampled.astype(table.dtype)], axis=1)


def _positions(c: ModelConfig):
  """The position rule: the checkpoint's table resampled to this config's patch grid."""
  grid = c.image_size // c.patch_size

  def rule(ours: str, hf: str) -> Rule:
    return Rule((ours,), (hf,), lambda t: (resample_positions(t, grid),), lambda t: (t,))

  return rule


def _gate_up(ours: str, hf: str) -> list[Rule]:
  """SwiGLU's `weights_in` [2F, D] (+ [2F]): gate then up <-> our wi_0, wi_1."""

  def split(w):
    gate, up = np.split(w, 2, axis=0)
    return (gate.T, up.T) if w.ndim == 2 else (gate, up)

  def join(gate, up):
    return (np.concatenate([gate.T, up.T] if gate.ndim == 2 else [gate, up], axis=0),)

  return [
    Rule((f"{ours}/wi_0/kernel", f"{ours}/wi_1/kernel"), (f"{hf}.weight",), split, join),
    Rule((f"{ours}/wi_0/bias", f"{ours}/wi_1/bias"), (f"{hf}.bias",), split, join),
  ]


def _layer(c: ModelConfig, ours: str, hf: str) -> list[Rule]:
  a = f"{hf}.attention"
  projections = (f"{a}.attention.query", f"{a}.attention.key", f"{a}.attention.value")
  out = [
    *norm(f"{ours}/self_attention_norm", f"{hf}.norm1"),
    *attention(
      f"{ours}/self_attention", (*projections, f"{a}.output.dense"), c.num_heads, c.head_dim
    ),
    same(f"{ours}/self_attention_scale", f"{hf}.layer_scale1.lambda1"),
    *norm(f"{ours}/ffn_norm", f"{hf}.norm2"),
    same(f"{ours}/ffn_scale", f"{hf}.layer_scale2.lambda1"),
  ]
  if c.activation == "swiglu":
    return (
      out
      + _gate_up(f"{ours}/ffn", f"{hf}.mlp.weights_in")
      + linear(f"{ours}/ffn/wo", f"{hf}.mlp.weights_out")
    )
  return out + linear(f"{ours}/ffn/wi", f"{hf}.mlp.fc1") + linear(f"{ours}/ffn/wo", f"{hf}.mlp.fc2")


def rules(c: ModelConfig) -> list[Rule]:
  out = vit.embedding_rules(PREFIX, _positions(c))
  for i in range(c.num_layers):
    out += _layer(c, f"encoder/layer_{i}", f"{PREFIX}encoder.layer.{i}")
  return out + norm("encoder/final_norm", f"{PREFIX}layernorm") + linear("head", "classifier")


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE,
    "dinov2",
    config_from_hf,
    config_to_hf,
    rules,
    PREFIX,
    vit.init_inputs,
    resamples_positions=True,
  ),
}
