"""Hugging Face checkpoint directories: `load(path)` and `save(path, config, params, arch)`.

A directory holds `config.json` and either `model.safetensors` or shards named by
`model.safetensors.index.json` (`weight_map`: tensor -> file), as `save_pretrained`
writes them. Tensors are read and written with `safetensors.numpy` (no PyTorch). The
tensor rules of each architecture live in its family module (`convert.registry`).
Every problem is one `ValueError` line: a missing or truncated shard names the file, a
tensor whose shape does not fit names the parameter and both shapes, an unsupported
architecture or option lists what is supported.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import flax
import jax
import ml_dtypes
import numpy as np
from etils import epath

from transformer.convert import registry
from transformer.convert.base import Converter, Rule
from transformer.nn import lora, tree
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
# Non-parameter buffers some checkpoints carry (GPT-2's causal masks, position id ranges).
BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", "position_ids", "rotary_emb.inv_freq")


def _safetensors():
  try:
    import safetensors.numpy
  except ImportError as e:  # the optional extra
    raise ImportError("transformer.convert needs safetensors: pip install '.[hf]'") from e
  return safetensors.numpy


def read_config(path: str | epath.PathLike) -> dict[str, Any]:
  """The parsed config.json of a checkpoint directory."""
  file = epath.Path(path) / CONFIG
  if not file.exists():
    raise ValueError(f"{path}: no {CONFIG} (not a Hugging Face checkpoint directory)")
  try:
    return json.loads(file.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{file}: not valid JSON ({e})") from e


# safetensors dtype names -> NumPy (ml_dtypes for the formats NumPy lacks).
DTYPES = {
  "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
  "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
  "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
  "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}  # fmt: skip
MAX_HEADER = 100 << 20  # bytes: safetensors' own limit on the JSON header


def _read_file(file: epath.Path, what: str) -> dict[str, np.ndarray]:
  """The tensors of one safetensors file, read tensor by tensor (header first, then each
  tensor's byte range), so a large shard in object storage is never held twice."""
  if not file.exists():
    raise ValueError(f"{file}: {what} is missing")

  def broken(why: str) -> ValueError:
    return ValueError(f"{file}: cannot read {what} (truncated or corrupt: {why})")

  tensors: dict[str, np.ndarray] = {}
  with file.open("rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise broken(f"{len(head)} bytes")
    size = int.from_bytes(head, "little")
    if size > MAX_HEADER:
      raise broken(f"a header of {size} bytes, over {MAX_HEADER}")
    try:
      header = json.loads(f.read(size))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise broken(f"the header is not JSON: {e}") from None
    if not isinstance(header, dict):
      raise broken("the header is not a JSON object")
    for name, info in sorted(header.items(), key=lambda kv: _offsets(kv[1])[0]):
      if name == "__metadata__":
        continue
      start, end = _offsets(info)
      if info.get("dtype") not in DTYPES:
        raise ValueError(f"{file}: tensor {name!r} has dtype {info.get('dtype')!r}, not one of "
                         f"{', '.join(DTYPES)}")  # fmt: skip
      f.seek(8 + size + start)
      data = f.read(end - start)
      if len(data) != end - start:
        raise broken(f"tensor {name!r} needs bytes {start}-{end}, the file ends before")
      try:
        tensors[name] = np.frombuffer(data, DTYPES[info["dtype"]]).reshape(info["shape"])
      except (ValueError, TypeError, KeyError) as e:
        raise broken(f"tensor {name!r}: {e}") from None
  return tensors


def _offsets(info: Any) -> tuple[int, int]:
  """(start, end) byte offsets of a header entry ((0, 0) for the metadata)."""
  if not isinstance(info, Mapping) or "data_offsets" not in info:
    return (0, 0)
  start, end = info["data_offsets"]
  return int(start), int(end)


def read_tensors(path: str | epath.PathLike) -> dict[str, np.ndarray]:
  """Every tensor of a checkpoint directory, name -> NumPy array (sharded or not)."""
  root = epath.Path(path)
  index = root / INDEX
  if not index.exists():
    if not (root / WEIGHTS).exists():
      raise ValueError(f"{path}: neither {WEIGHTS} nor {INDEX} (only safetensors are read)")
    return _read_file(root / WEIGHTS, "the weights file")
  try:
    weight_map = json.loads(index.read_text())["weight_map"]
  except (json.JSONDecodeError, KeyError) as e:
    raise ValueError(f"{index}: not a safetensors index with a weight_map ({e})") from e
  tensors: dict[str, np.ndarray] = {}
  for shard in sorted(set(weight_map.values())):
    tensors.update(_read_file(root / shard, f"a shard named in {INDEX}"))
  for name, shard in weight_map.items():
    if name not in tensors:
      raise ValueError(f"{root / shard}: lacks tensor {name!r} that {INDEX} places there")
  return tensors


def _expected_shapes(config: ModelConfig, converter: Converter) -> dict[str, tuple[int, ...]]:
  """Our parameter path (without 'params/') -> shape, from `model.init` (nothing computed)."""
  model, inputs = build_model(config), converter.init_inputs(config)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))["params"]
  return {tree.path_str(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(shapes)}


def _zeros(shape: tuple[int, ...]) -> np.ndarray:
  return np.broadcast_to(np.zeros((), np.float32), shape)  # no memory for the shape check


def _shape_error(rule: Rule, got: Mapping[str, tuple], shapes: Mapping[str, tuple]) -> ValueError:
  """The error naming the checkpoint tensor whose shape does not fit our parameter."""
  expected = rule.to_hf(*[_zeros(shapes[p]) for p in rule.ours])
  ours = ", ".join(f"{p} {list(shapes[p])}" for p in rule.ours)
  for name, want in zip(rule.hf, expected, strict=True):
    if got[name] != want.shape:
      return ValueError(
        f"tensor {name!r} has shape {list(got[name])}, but parameter {ours} needs "
        f"{list(want.shape)} there"
      )
  return ValueError(f"tensors {', '.join(rule.hf)} do not fit parameter {ours}")


def _find(tensors: Mapping[str, np.ndarray], name: str, prefix: str) -> str | None:
  """The checkpoint's key for `name`, also without the backbone prefix (a bare backbone)."""
  if name in tensors:
    return name
  bare = name[len(prefix) :] if prefix and name.startswith(prefix) else None
  return bare if bare in tensors else None


def load(path: str | epath.PathLike, **changes: Any) -> tuple[ModelConfig, dict[str, Any]]:
  """Reads a Hugging Face checkpoint directory -> (ModelConfig, {'params': ...}).

  The parameters are NumPy float32 arrays at the paths `model.init` gives, so
  `build_model(config).apply(params, ...)` runs the checkpoint. `changes` replace
  ModelConfig fields that do not change the parameters (dtype='bfloat16',
  attention_impl, scan_layers=False only, ...), and a ViT's `image_size` where the
  converter resamples its position table (DINOv2; `max_len` then follows the patch grid).
  A `max_len` other than the checkpoint's over learned positions is refused unless the
  `image_size` changes too.
  """
  hf_config = read_config(path)
  architectures = hf_config.get("architectures") or [None]
  if len(architectures) != 1:
    raise ValueError(f"{path}/{CONFIG}: architectures={architectures}: expected one entry")
  converter = registry.get(architectures[0], f"{path}/{CONFIG}: architectures")
  try:
    fields = converter.config_from_hf(hf_config)
  except KeyError as e:
    raise ValueError(f"{path}/{CONFIG}: lacks {e} (needed by {converter.architecture})") from e
  if changes.get("scan_layers"):
    raise ValueError("load: scan_layers=True is not supported (the layers are unrolled)")
  image = fields.get("image_size")
  resized = fields["family"] == "vit" and changes.get("image_size", image) != image
  if resized:
    changes = _at_image_size(fields, changes, converter)
  length = changes.get("max_len", fields["max_len"])
  if length != fields["max_len"] and fields["position"] == "learned" and not resized:
    raise ValueError(  # which rows a shorter table keeps is the caller's call (fine-tuning: first)
      f"load: max_len={length} differs from the checkpoint's {fields['max_len']} learned "
      "positions; load it as it is, then cut the table"
    )
  config = ModelConfig(**{**fields, **changes})
  tensors = read_tensors(path)
  params = convert_from_hf(tensors, config, converter)
  return config, {"params": flax.traverse_util.unflatten_dict(params, sep="/")}


def _at_image_size(
  fields: dict[str, Any], changes: dict[str, Any], converter: Converter
) -> dict[str, Any]:
  """`changes` loading a ViT at another `image_size`, with `max_len` its patch grid plus
  the checkpoint's prefix tokens ([CLS], ...) unless given; refused in one line unless the
  converter resamples the learned position table (DINOv2)."""
  size, saved = changes["image_size"], fields["image_size"]
  if fields["position"] == "learned" and not converter.resamples_positions:
    raise ValueError(
      f"load: image_size={size} differs from the checkpoint's {saved}, and "
      f"{converter.architecture} does not resample its learned positions: use {saved}"
    )
  patch = fields["patch_size"]
  prefix = fields["max_len"] - (saved // patch) ** 2
  return {"max_len": (size // patch) ** 2 + prefix, **changes}


def convert_from_hf(
  tensors: Mapping[str, np.ndarray], config: ModelConfig, converter: Converter
) -> dict[str, np.ndarray]:
  """A state dict -> our flat parameters ('decoder/layer_0/ffn/wi/kernel' -> float32 array)."""
  shapes = _expected_shapes(config, converter)
  flat: dict[str, np.ndarray] = {}
  used: set[str] = set()
  for rule in converter.rules(config):
    keys = [_find(tensors, name, converter.base_prefix) for name in rule.hf]
    if None in keys:
      missing = rule.hf[keys.index(None)]
      raise ValueError(
        f"the checkpoint has no tensor {missing!r} (needed for {', '.join(rule.ours)})"
      )
    arrays = [tensors[key] for key in keys]
    got = {name: tuple(a.shape) for name, a in zip(rule.hf, arrays, strict=True)}
    try:
      values = rule.to_ours(*arrays)
    except ValueError as e:
      raise _shape_error(rule, got, shapes) from e
    if any(v.shape != shapes[p] for p, v in zip(rule.ours, values, strict=True)):
      raise _shape_error(rule, got, shapes)
    for p, v in zip(rule.ours, values, strict=True):
      flat[p] = np.ascontiguousarray(v, dtype=np.float32)
    used.update(keys)
  uncovered = sorted(set(shapes) - set(flat))
  if uncovered:
    raise ValueError(f"{converter.architecture}: no checkpoint tensor fills {uncovered[0]}")
  unused = [n for n in tensors if n not in used and not n.endswith(BUFFER_SUFFIXES)]
  if unused:  # e.g. BERT's pretraining heads in a BertForMaskedLM checkpoint
    logging.info("%d checkpoint tensors not used: %s", len(unused), ", ".join(unused[:8]))
  return flat


def _normalised(config: ModelConfig) -> ModelConfig:
  """`config` with defaults spelled out the way the converters write them (K = N -> None;
  the MoE gates' renormalisation resolved)."""
  norm_topk = config.moe_top_k > 1 if config.moe_norm_topk is None else config.moe_norm_topk
  return config.replace(
    moe_norm_topk=norm_topk if config.moe_experts else config.moe_norm_topk,
    qkv_bias=None if config.qkv_biases == config.use_bias else config.qkv_bias,
    num_kv_heads=None if config.kv_heads == config.num_heads else config.num_kv_heads,
    attention_head_dim=(
      None if config.head_dim * config.num_heads == config.d_model else config.head_dim
    ),
  )


def _check_expressible(config: ModelConfig, converter: Converter, hf_config: dict) -> None:
  """Refuses a config the architecture cannot express (a field its config.json would lose)."""
  fields = converter.config_from_hf(hf_config)
  config = _normalised(config)
  lost = [f for f, value in fields.items() if getattr(config, f) != value]
  if lost:
    got = ", ".join(f"ModelConfig.{f}={getattr(config, f)!r}" for f in lost)
    need = ", ".join(f"{f}={fields[f]!r}" for f in lost)
    raise ValueError(f"{converter.architecture} cannot express {got} (it has {need})")


def convert_to_hf(params: Any, config: ModelConfig, converter: Converter) -> dict[str, np.ndarray]:
  """Our parameters ({'params': ...} or the inner tree) -> a state dict of NumPy arrays."""
  if isinstance(params, Mapping) and set(params) == {"params"}:
    params = params["params"]
  flat = {tree.path_str(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}
  shapes = _expected_shapes(config, converter)
  for path, shape in shapes.items():
    if path not in flat:
      raise ValueError(f"params lack {path} (shape {list(shape)}) that this config has")
    if flat[path].shape != shape:
      raise ValueError(
        f"parameter {path} has shape {list(flat[path].shape)}, this config needs {list(shape)}"
      )
  extra = sorted(set(flat) - set(shapes))
  if extra:
    raise ValueError(f"params hold {extra[0]}, which this config has no place for")
  tensors: dict[str, np.ndarray] = {}
  for rule in converter.rules(config):
    values = rule.to_hf(*[flat[p] for p in rule.ours])
    for name, value in zip(rule.hf, values, strict=True):
      tensors[name] = np.ascontiguousarray(value)
  return tensors


def _shards(tensors: Mapping[str, np.ndarray], max_bytes: int | None) -> list[list[str]]:
  """Tensor names grouped into shards of at most `max_bytes` (a larger tensor alone)."""
  groups: list[list[str]] = [[]]
  size = 0
  for name in sorted(tensors):
    nbytes = tensors[name].nbytes
    if max_bytes is not None and groups[-1] and size + nbytes > max_bytes:
      groups.append([])
      size = 0
    groups[-1].append(name)
    size += nbytes
  return groups


def save(
  path: str | epath.PathLike,
  model_config: ModelConfig,
  params: Any,
  architecture: str,
  *,
  max_shard_bytes: int | None = None,
) -> None:
  """Writes a checkpoint directory that `transformers`' `from_pretrained` loads.

  architecture: a Hugging Face class name (`convert.ARCHITECTURES`). Refused in one line:
  a config the architecture cannot express (e.g. RoPE for GPT-2), scanned layers,
  parameters that do not fit the config. LoRA adapters (`lora_rank` > 0) are merged into
  the weights they adapt (`nn.lora.merge_lora`). `max_shard_bytes` splits the tensors into
  `model-0000i-of-0000n.safetensors` files with a `model.safetensors.index.json`.
  Parameters are written as float32.
  """
  converter = registry.get(architecture)
  if model_config.scan_layers:
    raise ValueError("save: ModelConfig.scan_layers=True is not supported (unroll the layers)")
  if model_config.lora_rank:  # LoRA adapters folded into the base weights first
    if isinstance(params, Mapping) and set(params) == {"params"}:
      params = params["params"]
    params, model_config = lora.merge_lora(params, model_config)
  hf_config = converter.config_to_hf(model_config)
  _check_expressible(model_config, converter, hf_config)
  tensors = convert_to_hf(params, model_config, converter)
  tensors = {name: value.astype(np.float32) for name, value in tensors.items()}
  root = epath.Path(path)
  root.mkdir(parents=True, exist_ok=True)
  for old in [root / WEIGHTS, root / INDEX, *root.glob("model-*-of-*.safetensors")]:
    if old.exists():  # a previous checkpoint here would shadow or mix with this one
      old.unlink()
  hf_config = {"architectures": [architecture], **hf_config, "dtype": "float32"}
  (root / CONFIG).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
  st = _safetensors()
  groups = _shards(tensors, max_shard_bytes)
  if len(groups) == 1:
    (root / WEIGHTS).write_bytes(st.save(tensors, metadata={"format": "pt"}))
    return
  weight_map = {}
  for i, names in enumerate(groups):
    file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
    (root / file).write_bytes(st.save({n: tensors[n] for n in names}, metadata={"format": "pt"}))
    weight_map.update({n: file for n in names})
  total = sum(v.nbytes for v in tensors.values())
  index = {"metadata": {"total_size": total}, "weight_map": weight_map}
  (root / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
