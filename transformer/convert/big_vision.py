"""big_vision and vision_transformer ViT checkpoints (`.npz`): `load(path, **changes)`.

The files hold flat arrays named by their Flax paths joined with '/' (big_vision
`models/vit.py`; the older `vit_jax`), optionally under 'params/' or 'opt/target/':

  embedding/kernel [P, P, C, D], embedding/bias [D]      -> patch_embed
  cls [1, 1, D] (pool_type 'tok'; absent: 'gap')          -> cls (pooling 'cls'; else 'mean')
  pos_embedding [1, G*G, D]                               -> pos_embedding [1, 1 + G*G, D]
  Transformer/posembed_input/pos_embedding, Transformer/pos_embedding [1, 1 + G*G, D]
  Transformer/encoderblock_{i}/                           -> encoder/layer_{i}/
    LayerNorm_0, MultiHeadDotProductAttention_0/{query,key,value} [D, N, H], out [N, H, D],
    LayerNorm_1, MlpBlock_0/Dense_0 [D, F], Dense_1 [F, D]  (vit_jax: ..._1, LayerNorm_2,
    MlpBlock_3); Transformer/encoderblock/... stacked [L, ...] (big_vision scan=True)
  Transformer/encoder_norm, head/{kernel [D, C], bias}    -> encoder/final_norm, head

big_vision adds its [1, G*G, D] table to the patches and then prepends the [CLS] token; our
ViT adds a [1, 1 + G*G, D] table after it, so the [CLS] row of ours is zero (the same
sums). vit_jax's [1, 1 + G*G, D] tables are copied as they are. Images are [B, H, W, C]
in both. big_vision's MLP uses Flax's `nn.gelu` (the tanh approximation: our 'gelu_tanh')
and Flax LayerNorms (eps 1e-6). Every problem is one `ValueError` line naming the file and
the key (and both shapes), or the big_vision option we cannot express and what is
supported. Reads the file with NumPy only (no big_vision, TensorFlow or PyTorch).
"""

from __future__ import annotations

import dataclasses
import math
import re
import zipfile
from collections.abc import Mapping
from typing import Any, NoReturn

import flax
import jax
import numpy as np
from etils import epath

from transformer.convert.base import PLAIN
from transformer.nn import tree
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model

Shapes = Mapping[str, tuple[int, ...]]

PREFIXES = ("", "params/", "opt/target/")  # plain, big_vision's params, vit_jax's optimizer
# The position table's keys: big_vision's (patches only), then vit_jax's ([CLS] included).
POSITION_KEYS = (
  "pos_embedding",
  "Transformer/posembed_input/pos_embedding",
  "Transformer/pos_embedding",
)
SUPPORTED = "pool_type 'tok' or 'gap', posemb 'learn', no rep_size, square patches"


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a checkpoint keeps what: its key prefix, block names, stacking, position key."""

  prefix: str  # '', 'params/' or 'opt/target/'
  attention: str  # MultiHeadDotProductAttention_0 (big_vision) or _1 (vit_jax)
  norms: tuple[str, str]  # LayerNorm_0, LayerNorm_1 (big_vision) or LayerNorm_0, LayerNorm_2
  mlp: str  # MlpBlock_0 (big_vision) or MlpBlock_3 (vit_jax)
  scan: bool  # blocks stacked under Transformer/encoderblock/ [L, ...]
  num_layers: int
  position_key: str
  position_has_cls: bool  # the table has a [CLS] row (vit_jax: 1 + G*G rows)

  def block(self, layer: int) -> tuple[str, int | None]:
    """The key prefix of block `layer` and its index into stacked arrays (None: unstacked)."""
    if self.scan:
      return "Transformer/encoderblock", layer
    return f"Transformer/encoderblock_{layer}", None


def _open(path: str | epath.PathLike) -> tuple[epath.Path, Any]:
  file = epath.Path(path)
  if not file.exists():
    raise ValueError(f"{path}: no such file (expected a big_vision .npz checkpoint)")
  return file, file.open("rb")


def _members(archive: zipfile.ZipFile, path: Any):
  for info in archive.infolist():
    if not info.filename.endswith(".npy"):
      raise ValueError(f"{path}: member {info.filename!r} is not a .npy array (not an .npz file)")
    yield info.filename[: -len(".npy")], info


def read_shapes(path: str | epath.PathLike) -> dict[str, tuple[int, ...]]:
  """Key -> shape of every array of an .npz file, from the array headers (no data read)."""
  file, handle = _open(path)
  shapes = {}
  with handle:
    try:
      archive = zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, OSError) as e:
      raise ValueError(f"{file}: not a readable .npz archive ({e})") from None
    with archive:
      for key, info in _members(archive, path):
        with archive.open(info) as member:
          try:
            version = np.lib.format.read_magic(member)
            read = np.lib.format.read_array_header_1_0
            if version != (1, 0):
              read = np.lib.format.read_array_header_2_0
            shapes[key] = tuple(read(member)[0])
          except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise ValueError(
              f"{file}: member {info.filename!r} is not a readable array ({e})"
            ) from None
  return shapes


def read_arrays(path: str | epath.PathLike) -> dict[str, np.ndarray]:
  """Key -> array of every array of an .npz file."""
  file, handle = _open(path)
  with handle:
    try:
      npz = np.load(handle, allow_pickle=False)
      if not isinstance(npz, np.lib.npyio.NpzFile):
        raise ValueError("one unnamed array")
      with npz:
        return {key: npz[key] for key in npz.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
      raise ValueError(f"{file}: not a readable .npz archive ({e})") from None


def _refuse(path: Any, option: str, value: Any, why: str) -> NoReturn:
  raise ValueError(f"{path}: {option}={value!r} is not supported ({why}; supported: {SUPPORTED})")


def _layout(shapes: Shapes, path: Any) -> Layout:
  prefix = next((p for p in PREFIXES if f"{p}embedding/kernel" in shapes), None)
  if prefix is None:
    tried = ", ".join(repr(f"{p}embedding/kernel") for p in PREFIXES)
    raise ValueError(
      f"{path}: no key 'embedding/kernel' (looked for {tried}): not a ViT checkpoint"
    )
  keys = {k[len(prefix) :] for k in shapes if k.startswith(prefix)}
  if any(k.startswith("MAPHead_0/") for k in keys):
    _refuse(path, "pool_type", "map", "attention-pooling head MAPHead_0/")
  if any(k.startswith("pre_logits/") for k in keys):
    rep_size = shapes.get(f"{prefix}pre_logits/kernel", (True,))[-1]
    _refuse(path, "rep_size", rep_size, "pre_logits/ layer")
  scan = "Transformer/encoderblock/LayerNorm_0/scale" in keys
  if scan:
    num_layers = shapes[f"{prefix}Transformer/encoderblock/LayerNorm_0/scale"][0]
    first = "Transformer/encoderblock"
  else:
    indices = [re.match(r"Transformer/encoderblock_(\d+)/", k) for k in keys]
    num_layers = 1 + max((int(m.group(1)) for m in indices if m), default=-1)
    first = "Transformer/encoderblock_0"
  if num_layers == 0:
    raise ValueError(f"{path}: no key {prefix}Transformer/encoderblock_0/... (no encoder blocks)")
  vit_jax = f"{first}/MultiHeadDotProductAttention_1/query/kernel" in keys
  position_key = next((k for k in POSITION_KEYS if k in keys), None)
  if position_key is None:
    _refuse(
      path, "posemb", "sincos2d", "no position table; our 2-D sin-cos orders its features otherwise"
    )
  table = shapes[prefix + position_key]
  if len(table) != 3 or table[0] != 1:
    raise ValueError(
      f"{path}: key {prefix + position_key!r} has shape {list(table)}: expected [1, tokens, D]"
    )
  rows = table[1]
  side = math.isqrt(rows)
  has_cls = side * side != rows
  if has_cls and (math.isqrt(rows - 1) ** 2 != rows - 1 or "cls" not in keys):
    raise ValueError(
      f"{path}: key {prefix + position_key!r} has {rows} rows: expected G*G patches, or "
      "1 + G*G with a cls key"
    )
  return Layout(
    prefix=prefix,
    attention=f"MultiHeadDotProductAttention_{1 if vit_jax else 0}",
    norms=("LayerNorm_0", "LayerNorm_2" if vit_jax else "LayerNorm_1"),
    mlp="MlpBlock_3" if vit_jax else "MlpBlock_0",
    scan=scan,
    num_layers=num_layers,
    position_key=position_key,
    position_has_cls=has_cls,
  )


def _shape(shapes: Shapes, layout: Layout, key: str, rank: int, path: Any) -> tuple[int, ...]:
  full = layout.prefix + key
  if full not in shapes:
    raise ValueError(f"{path}: no key {full!r}")
  shape = shapes[full]
  if len(shape) != rank:
    raise ValueError(f"{path}: key {full!r} has shape {list(shape)}: expected {rank} axes")
  return shape


def _fields(shapes: Shapes, layout: Layout, path: Any) -> dict[str, Any]:
  """The ModelConfig fields the keys decide (num_classes None: the checkpoint has no head)."""
  stacked = 1 if layout.scan else 0
  p, p2, channels, d = _shape(shapes, layout, "embedding/kernel", 4, path)
  if p != p2:
    _refuse(path, "patch_size", [p, p2], "non-square patches")
  block, _ = layout.block(0)
  query = _shape(shapes, layout, f"{block}/{layout.attention}/query/kernel", 3 + stacked, path)
  heads, head_dim = query[-2:]
  d_ff = _shape(shapes, layout, f"{block}/{layout.mlp}/Dense_0/kernel", 2 + stacked, path)[-1]
  rows = _shape(shapes, layout, layout.position_key, 3, path)[1]
  grid = math.isqrt(rows - layout.position_has_cls)
  cls = "cls" in {k[len(layout.prefix) :] for k in shapes}
  head = f"{layout.prefix}head/kernel"
  return {
    "family": "vit",
    **PLAIN,
    "d_model": d,
    "num_heads": heads,
    "num_kv_heads": None,
    "attention_head_dim": None if heads * head_dim == d else head_dim,
    "num_layers": layout.num_layers,
    "d_ff": d_ff,
    "max_len": grid * grid + cls,
    "image_size": grid * p,
    "patch_size": p,
    "num_channels": channels,
    "num_classes": shapes[head][-1] if head in shapes else None,
    "pooling": "cls" if cls else "mean",
    "position": "learned",
    "norm": "layernorm",
    "norm_position": "pre",
    "norm_eps": 1e-6,  # Flax's LayerNorm default
    "activation": "gelu_tanh",  # Flax's nn.gelu (approximate=True)
    "use_bias": True,
    "dropout_rate": 0.0,
    "attention_dropout_rate": 0.0,
  }


def config_fields(path: str | epath.PathLike) -> dict[str, Any]:
  """The ModelConfig fields of a checkpoint, from its keys and shapes (no array data read).

  `num_classes` is None for a checkpoint without a head.
  """
  shapes = read_shapes(path)
  return _fields(shapes, _layout(shapes, path), path)


def _rules(c: ModelConfig, layout: Layout, head: bool) -> list[tuple[str, str, int | None]]:
  """(our parameter path, checkpoint key without the prefix, index into a stacked array)."""
  out = [
    ("patch_embed/kernel", "embedding/kernel", None),
    ("patch_embed/bias", "embedding/bias", None),
  ]
  if c.pooling == "cls":
    out.append(("cls", "cls", None))
  out.append(("pos_embedding", layout.position_key, None))
  for i in range(c.num_layers):
    block, index = layout.block(i)
    ours = f"encoder/layer_{i}"
    for name in ("query", "key", "value", "out"):
      for leaf in ("kernel", "bias"):
        out.append(
          (
            f"{ours}/self_attention/{name}/{leaf}",
            f"{block}/{layout.attention}/{name}/{leaf}",
            index,
          )
        )
    for norm, theirs in zip(("self_attention_norm", "ffn_norm"), layout.norms, strict=True):
      for leaf in ("scale", "bias"):
        out.append((f"{ours}/{norm}/{leaf}", f"{block}/{theirs}/{leaf}", index))
    for ffn, dense in (("wi", "Dense_0"), ("wo", "Dense_1")):
      for leaf in ("kernel", "bias"):
        out.append((f"{ours}/ffn/{ffn}/{leaf}", f"{block}/{layout.mlp}/{dense}/{leaf}", index))
  for leaf in ("scale", "bias"):
    out.append((f"encoder/final_norm/{leaf}", f"Transformer/encoder_norm/{leaf}", None))
  if head:
    out += [("head/kernel", "head/kernel", None), ("head/bias", "head/bias", None)]
  return out


def _expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
  """Our parameter path -> shape, from `model.init` (nothing computed)."""
  images = np.zeros((1, c.image_size, c.image_size, c.num_channels), np.float32)  # [B, H, W, C]
  shapes = jax.eval_shape(lambda: build_model(c).init(jax.random.key(0), images))["params"]
  return {tree.path_str(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(shapes)}


def convert(arrays: Mapping[str, np.ndarray], config: ModelConfig, path: Any = "checkpoint"):
  """Checkpoint arrays -> our flat float32 parameters ('encoder/layer_0/ffn/wi/kernel' -> array).

  The head is left out where the checkpoint has none. Every key within the checkpoint's
  prefix must have a place (one that does not names a big_vision option we lack).
  """
  shapes = {k: tuple(a.shape) for k, a in arrays.items()}
  layout = _layout(shapes, path)
  head = f"{layout.prefix}head/kernel" in shapes
  ours = _expected_shapes(config)
  flat: dict[str, np.ndarray] = {}
  used = set()
  for name, key, index in _rules(config, layout, head):
    full = layout.prefix + key
    if full not in arrays:
      raise ValueError(f"{path}: no key {full!r} (needed for {name})")
    value, want = arrays[full], ours[name]
    pad_cls = name == "pos_embedding" and config.pooling == "cls" and not layout.position_has_cls
    theirs = (want[0], want[1] - 1, *want[2:]) if pad_cls else want
    if index is not None:
      theirs = (layout.num_layers, *theirs)
    if value.shape != theirs:
      raise ValueError(
        f"{path}: key {full!r} has shape {list(value.shape)}, but {name} needs {list(theirs)} there"
      )
    value = value if index is None else value[index]
    if pad_cls:  # big_vision adds no position to [CLS]: a zero row in our table
      value = np.concatenate([np.zeros_like(value[:, :1]), value], axis=1)  # [1, 1 + G*G, D]
    flat[name] = np.ascontiguousarray(value, dtype=np.float32)
    used.add(full)
  unused = sorted(k for k in arrays if k.startswith(layout.prefix) and k not in used)
  if unused:
    raise ValueError(f"{path}: key {unused[0]!r} has no place in our ViT (supported: {SUPPORTED})")
  return flat


def load_params(path: str | epath.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
  """(the checkpoint's ModelConfig fields, {'params': ...} at our paths; no head if none)."""
  arrays = read_arrays(path)
  shapes = {k: tuple(a.shape) for k, a in arrays.items()}
  fields = _fields(shapes, _layout(shapes, path), path)
  # A headless checkpoint's other shapes do not depend on the classes: check them with one.
  config = ModelConfig(**{**fields, "num_classes": fields["num_classes"] or 1})
  flat = convert(arrays, config, path)
  return fields, {"params": flax.traverse_util.unflatten_dict(flat, sep="/")}


def load(path: str | epath.PathLike, **changes: Any) -> tuple[ModelConfig, dict[str, Any]]:
  """Reads a big_vision / vit_jax ViT `.npz` -> (ModelConfig, {'params': ...}).

  The parameters are NumPy float32 arrays at the paths `model.init` gives, so
  `build_model(config).apply(params, images)` (images [B, H, W, C]) runs the checkpoint.
  `changes` replace ModelConfig fields that keep the shapes (dtype, attention_impl, ...);
  a checkpoint without a head needs `num_classes=K` and gets a zero head (big_vision's
  initialisation of a new head).
  """
  if changes.get("scan_layers"):
    raise ValueError("load: scan_layers=True is not supported (the layers are unrolled)")
  arrays = read_arrays(path)
  shapes = {k: tuple(a.shape) for k, a in arrays.items()}
  fields = _fields(shapes, _layout(shapes, path), path)
  if fields["num_classes"] is None and not changes.get("num_classes"):
    prefix = _layout(shapes, path).prefix
    raise ValueError(
      f"{path}: no key {prefix + 'head/kernel'!r}: pass num_classes=K for a new head"
    )
  config = ModelConfig(**{**fields, **changes})
  flat = convert(arrays, config, path)
  if fields["num_classes"] is None:
    flat["head/kernel"] = np.zeros((config.d_model, config.num_classes), np.float32)
    flat["head/bias"] = np.zeros((config.num_classes,), np.float32)
  return config, {"params": flax.traverse_util.unflatten_dict(flat, sep="/")}
