"""`convert.big_vision.load`: big_vision / vision_transformer ViT `.npz` checkpoints.

The checkpoints are written here from random NumPy arrays under big_vision's own key
names (`big_vision/models/vit.py`; the older `vit_jax` names for the vision_transformer
layout; `Transformer/encoderblock/...` stacked for big_vision's scan=True), never from our
export. The reference is a float64 NumPy ViT that reads those keys with big_vision's
semantics: the position table added to the patches before the [CLS] token is prepended
(vit_jax: after, over [CLS] and patches), Flax LayerNorm (eps 1e-6), Flax `nn.gelu`
(tanh approximation), `gap` or `tok` pooling.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import numpy as np
import pytest

from transformer import convert
from transformer.convert import big_vision
from transformer.nn.models import build_model

B, IMAGE, PATCH, CHANNELS, D, HEADS, LAYERS, MLP, CLASSES = 3, 16, 4, 3, 32, 4, 2, 64, 5
ATTENTION, NORMS, MLP_BLOCK = "attention", "norms", "mlp"
BIG_VISION = {
  ATTENTION: "MultiHeadDotProductAttention_0",
  NORMS: ("LayerNorm_0", "LayerNorm_1"),
  MLP_BLOCK: "MlpBlock_0",
}
VIT_JAX = {  # vision_transformer's Flax numbered every submodule of a block
  ATTENTION: "MultiHeadDotProductAttention_1",
  NORMS: ("LayerNorm_0", "LayerNorm_2"),
  MLP_BLOCK: "MlpBlock_3",
}


def make_checkpoint(
  pool: str = "tok",
  old: bool = False,
  scan: bool = False,
  layers: int = LAYERS,
  image: int = IMAGE,
  patch: int = PATCH,
  channels: int = CHANNELS,
  d: int = D,
  heads: int = HEADS,
  mlp: int = MLP,
  classes: int = CLASSES,
  seed: int = 0,
) -> dict[str, np.ndarray]:
  """Random float32 arrays under big_vision's keys (`old`: vision_transformer's), no prefix."""
  rng = np.random.default_rng(seed)

  def r(*shape, scale=0.3, mean=0.0):
    return (mean + scale * rng.standard_normal(shape)).astype(np.float32)

  names = VIT_JAX if old else BIG_VISION
  grid, h = image // patch, d // heads
  w = {"embedding/kernel": r(patch, patch, channels, d), "embedding/bias": r(d)}
  if pool == "tok":
    w["cls"] = r(1, 1, d)
  if old:  # vit_jax: one row per token, [CLS] included
    w["Transformer/posembed_input/pos_embedding"] = r(1, grid * grid + (pool == "tok"), d)
  else:  # big_vision: the patches only
    w["pos_embedding"] = r(1, grid * grid, d)
  blocks = []
  for _ in range(layers):
    block = {}
    for norm in names["norms"]:
      block[f"{norm}/scale"], block[f"{norm}/bias"] = r(d, scale=0.1, mean=1.0), r(d, scale=0.1)
    attention = names["attention"]
    for name in ("query", "key", "value"):
      block[f"{attention}/{name}/kernel"] = r(d, heads, h)  # [D, N, H]
      block[f"{attention}/{name}/bias"] = r(heads, h)
    block[f"{attention}/out/kernel"], block[f"{attention}/out/bias"] = r(heads, h, d), r(d)
    block[f"{names['mlp']}/Dense_0/kernel"] = r(d, mlp)
    block[f"{names['mlp']}/Dense_0/bias"] = r(mlp)
    block[f"{names['mlp']}/Dense_1/kernel"] = r(mlp, d)
    block[f"{names['mlp']}/Dense_1/bias"] = r(d)
    blocks.append(block)
  if scan:
    for key in blocks[0]:
      w[f"Transformer/encoderblock/{key}"] = np.stack([b[key] for b in blocks])  # [L, ...]
  else:
    for i, block in enumerate(blocks):
      w.update({f"Transformer/encoderblock_{i}/{k}": v for k, v in block.items()})
  w["Transformer/encoder_norm/scale"] = r(d, scale=0.1, mean=1.0)
  w["Transformer/encoder_norm/bias"] = r(d, scale=0.1)
  if classes:
    w["head/kernel"], w["head/bias"] = r(d, classes), r(classes)
  return w


def write(path, arrays: dict[str, np.ndarray], prefix: str = "") -> str:
  np.savez(path, **{prefix + k: v for k, v in arrays.items()})
  return str(path)


# --- the float64 reference, on big_vision's key names -----------------------------------


def _layer_norm(x, w, name):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-6) * w[f"{name}/scale"] + w[f"{name}/bias"]


def _gelu_tanh(x):
  return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def reference_logits(w: dict[str, np.ndarray], images: np.ndarray, old: bool = False):
  """big_vision's ViT forward (vit_jax's with `old`) in float64: images [B, H, W, C]."""
  w = {k: np.asarray(v, np.float64) for k, v in w.items()}
  names = VIT_JAX if old else BIG_VISION
  kernel = w["embedding/kernel"]  # [P, P, C, D]
  p, c = kernel.shape[0], kernel.shape[2]
  b, g = images.shape[0], images.shape[1] // p
  x = images.astype(np.float64).reshape(b, g, p, g, p, c).transpose(0, 1, 3, 2, 4, 5)
  x = x.reshape(b, g * g, p * p * c) @ kernel.reshape(p * p * c, -1) + w["embedding/bias"]
  cls = "cls" in w
  if old:  # [CLS] first, then the table over every token
    if cls:
      x = np.concatenate([np.broadcast_to(w["cls"], (b, 1, x.shape[-1])), x], axis=1)
    x = x + w["Transformer/posembed_input/pos_embedding"]
  else:  # the table over the patches, then [CLS]
    x = x + w["pos_embedding"]
    if cls:
      x = np.concatenate([np.broadcast_to(w["cls"], (b, 1, x.shape[-1])), x], axis=1)
  i = 0
  while f"Transformer/encoderblock_{i}/{names['norms'][0]}/scale" in w:
    blk = {
      k.split("/", 2)[2]: v for k, v in w.items() if k.startswith(f"Transformer/encoderblock_{i}/")
    }
    a = names["attention"]
    y = _layer_norm(x, blk, names["norms"][0])
    q, k, v = (
      np.einsum("BTD,DNH->BTNH", y, blk[f"{a}/{n}/kernel"]) + blk[f"{a}/{n}/bias"]
      for n in ("query", "key", "value")
    )
    scores = np.einsum("BTNH,BSNH->BNTS", q, k) / math.sqrt(q.shape[-1])
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    o = np.einsum("BNTS,BSNH->BTNH", probs, v)
    x = x + np.einsum("BTNH,NHD->BTD", o, blk[f"{a}/out/kernel"]) + blk[f"{a}/out/bias"]
    y = _layer_norm(x, blk, names["norms"][1])
    m = names["mlp"]
    y = _gelu_tanh(y @ blk[f"{m}/Dense_0/kernel"] + blk[f"{m}/Dense_0/bias"])
    x = x + y @ blk[f"{m}/Dense_1/kernel"] + blk[f"{m}/Dense_1/bias"]
    i += 1
  assert i > 0
  x = _layer_norm(x, w, "Transformer/encoder_norm")
  pooled = x[:, 0] if cls else x.mean(axis=1)  # tok / gap
  return pooled @ w["head/kernel"] + w["head/bias"]


def _unstacked(w):
  """Scan-stacked blocks -> encoderblock_{i} keys (for the reference)."""
  out = {k: v for k, v in w.items() if not k.startswith("Transformer/encoderblock/")}
  for k, v in w.items():
    if k.startswith("Transformer/encoderblock/"):
      for i in range(v.shape[0]):
        out[k.replace("encoderblock/", f"encoderblock_{i}/")] = v[i]
  return out


def _images(seed=1, image=IMAGE, channels=CHANNELS):
  return np.random.default_rng(seed).uniform(-1, 1, (B, image, image, channels)).astype(np.float32)


# --- tests ------------------------------------------------------------------------------

CASES = {  # name -> (pool, old layout, scan, key prefix)
  "big_vision_tok": ("tok", False, False, ""),
  "big_vision_gap_scan_params": ("gap", False, True, "params/"),
  "big_vision_tok_scan_params": ("tok", False, True, "params/"),
  "vit_jax_tok_opt_target": ("tok", True, False, "opt/target/"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_the_float64_reference(case, tmp_path):
  pool, old, scan, prefix = CASES[case]
  arrays = make_checkpoint(pool, old=old, scan=scan)
  config, params = convert.big_vision.load(write(tmp_path / "vit.npz", arrays, prefix))
  images = _images()
  ours = np.asarray(jax.jit(build_model(config).apply)(params, images))  # images [B, H, W, C]
  expected = reference_logits(_unstacked(arrays), images, old=old)
  assert ours.shape == (B, CLASSES)
  np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)
  assert np.abs(expected).max() > 0.5  # the comparison is not of near-zero logits


def test_the_config_is_read_from_the_keys(tmp_path):
  path = write(tmp_path / "vit.npz", make_checkpoint("tok"))
  config, params = convert.big_vision.load(path)
  assert (config.family, config.d_model, config.num_heads, config.num_layers, config.d_ff) == (
    "vit", D, HEADS, LAYERS, MLP,
  )  # fmt: skip
  assert (config.image_size, config.patch_size, config.num_channels, config.num_classes) == (
    IMAGE, PATCH, CHANNELS, CLASSES,
  )  # fmt: skip
  assert (config.pooling, config.position, config.max_len) == ("cls", "learned", 17)
  assert (config.norm_position, config.norm_eps, config.activation) == ("pre", 1e-6, "gelu_tanh")
  table = params["params"]["pos_embedding"]
  assert table.shape == (1, 17, D) and not table[:, 0].any()  # no position on [CLS]
  fields = convert.big_vision.config_fields(path)  # headers only
  assert {k: getattr(config, k) for k in fields} == fields
  gap = convert.big_vision.load(write(tmp_path / "gap.npz", make_checkpoint("gap")))[0]
  assert (gap.pooling, gap.max_len) == ("mean", 16)
  changed, _ = convert.big_vision.load(path, dtype="bfloat16", attention_impl="jax")
  assert (changed.dtype, changed.attention_impl) == ("bfloat16", "jax")


def test_a_checkpoint_without_a_head_needs_num_classes(tmp_path):
  path = write(tmp_path / "vit.npz", make_checkpoint("gap", classes=0))
  with pytest.raises(ValueError, match=r"no key 'head/kernel': pass num_classes"):
    convert.big_vision.load(path)
  config, params = convert.big_vision.load(path, num_classes=3)
  head = params["params"]["head"]
  assert config.num_classes == 3 and head["kernel"].shape == (D, 3) and not head["kernel"].any()
  assert convert.big_vision.config_fields(path)["num_classes"] is None


def _refusal(tmp_path, arrays, **changes) -> str:
  with pytest.raises(ValueError) as e:
    convert.big_vision.load(write(tmp_path / "bad.npz", arrays), **changes)
  message = str(e.value)
  assert "\n" not in message and str(tmp_path / "bad.npz") in message, message
  return message


def test_a_missing_key_is_named(tmp_path):
  arrays = make_checkpoint()
  del arrays["Transformer/encoderblock_1/MlpBlock_0/Dense_1/bias"]
  message = _refusal(tmp_path, arrays)
  assert "no key 'Transformer/encoderblock_1/MlpBlock_0/Dense_1/bias'" in message, message
  assert "encoder/layer_1/ffn/wo/bias" in message, message


def test_a_shape_mismatch_names_the_key_and_both_shapes(tmp_path):
  arrays = make_checkpoint()
  arrays["Transformer/encoderblock_1/MlpBlock_0/Dense_0/kernel"] = np.zeros((D, 48), np.float32)
  message = _refusal(tmp_path, arrays)
  assert "'Transformer/encoderblock_1/MlpBlock_0/Dense_0/kernel' has shape [32, 48]" in message
  assert "needs [32, 64]" in message, message
  stacked = make_checkpoint(scan=True)
  stacked["Transformer/encoderblock/LayerNorm_1/bias"] = np.zeros((LAYERS, 8), np.float32)
  message = _refusal(tmp_path, stacked)
  assert "'Transformer/encoderblock/LayerNorm_1/bias' has shape [2, 8]" in message, message
  assert "needs [2, 32]" in message, message


@pytest.mark.parametrize(
  "option, edit",
  [
    ("pool_type='map'", lambda w: w.update({"MAPHead_0/probe": np.zeros((1, 1, D), np.float32)})),
    ("rep_size=32", lambda w: w.update({"pre_logits/kernel": np.zeros((D, D), np.float32)})),
    ("posemb='sincos2d'", lambda w: w.pop("pos_embedding")),
    ("patch_size=[4, 2]", lambda w: w.update({"embedding/kernel": np.zeros((4, 2, 3, D))})),
    ("'Transformer/encoderblock_0/extra/scale' has no place", lambda w: w.update(
      {"Transformer/encoderblock_0/extra/scale": np.zeros((D,), np.float32)})),
  ],
)  # fmt: skip
def test_what_we_cannot_express_is_refused_in_one_line(tmp_path, option, edit):
  arrays = make_checkpoint()
  edit(arrays)
  message = _refusal(tmp_path, arrays)
  assert option in message and "supported: pool_type 'tok' or 'gap'" in message, message


def test_files_that_are_not_checkpoints_are_named(tmp_path):
  with pytest.raises(ValueError, match=r"missing\.npz: no such file"):
    convert.big_vision.load(tmp_path / "missing.npz")
  (tmp_path / "text.npz").write_text("not a zip")
  with pytest.raises(ValueError, match=r"text\.npz: not a readable \.npz archive"):
    convert.big_vision.load(tmp_path / "text.npz")
  with pytest.raises(ValueError, match=r"text\.npz: not a readable \.npz archive"):
    convert.big_vision.config_fields(tmp_path / "text.npz")
  whole = Path(write(tmp_path / "vit.npz", make_checkpoint())).read_bytes()
  (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])
  for read in (convert.big_vision.load, convert.big_vision.config_fields):
    with pytest.raises(ValueError, match=r"cut\.npz: not a readable \.npz archive"):
      read(tmp_path / "cut.npz")
  np.savez(tmp_path / "other.npz", weights=np.zeros(3))
  with pytest.raises(ValueError, match=r"other\.npz: no key 'embedding/kernel'"):
    convert.big_vision.load(tmp_path / "other.npz")
  with pytest.raises(ValueError, match=r"scan_layers=True"):
    big_vision.load(write(tmp_path / "vit.npz", make_checkpoint()), scan_layers=True)
