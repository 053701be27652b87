"""The experiment configuration: one ml_collections ConfigDict with every field a run reads.

`default_config()` holds every field with its default; `configs/NAME.py` files start
from it and change what their experiment needs. `validate(config)` turns it into typed,
checked parts before anything is compiled, raising `ValueError` with one line naming
the field. Blocks:

  model      every `ModelConfig` field (vocab_size / num_classes 0 = taken from the data)
  data       every `DataConfig` field
  optimizer  `training.optimizer.DEFAULTS`
  schedule   kind and the fields of `training.schedules.create_schedule`
  (top)      loop settings: steps, batch, sequence length, loss, logging, checkpoints
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict

from transformer.data.config import DataConfig
from transformer.nn.config import ModelConfig
from transformer.nn.partitioning import MESH_AXES, RULES
from transformer.train import optimizer as optimizer_lib
from transformer.train import schedules

PARALLELISM = ("jit", "pmap")

# Top-level loop fields: name -> (default, one-line description).
LOOP_FIELDS: dict[str, tuple[Any, str]] = {
  "seed": (0, "seeds parameters, dropout and the data order"),
  "num_train_steps": (1000, "optimizer updates in the whole run"),
  "batch_size": (32, "global batch (examples per update, all devices and micro-batches)"),
  "seq_len": (128, "tokens per row (source length for seq2seq); ignored for images"),
  "grad_accum_steps": (1, "micro-batches per update (batch_size must divide evenly)"),
  "label_smoothing": (0.0, "label smoothing epsilon of the cross-entropy"),
  "z_loss": (0.0, "coefficient of logsumexp(logits)^2 (PaLM z-loss); 0 = off"),
  "parallelism": ("jit", "jit (mesh sharding, batch over 'data') or pmap (axis 'batch')"),
  "log_every": (50, "steps between training-metric lines"),
  "eval_every": (500, "steps between evaluations (and at the end); 0 = only at the end"),
  "eval_batches": (0, "batches per evaluation; 0 = the whole evaluation split"),
  "checkpoint_every": (500, "steps between checkpoints (and at the end)"),
  "keep_checkpoints": (3, "most recent checkpoints kept"),
  "best_metric": ("loss", "eval metric whose best checkpoint is also kept; '' = none"),
  "best_mode": ("min", "min or max: which value of best_metric is best"),
  "skip_nonfinite": (False, "skip (and count) updates with NaN/Inf instead of stopping"),
  "preemption_grace_seconds": (25.0, "SIGTERM: seconds to save and exit (keep < scheduler's kill)"),
  "debug_inject_nan_at_step": (-1, "tests only: the update (1-based) made NaN; -1 = off"),
  "debug_inject_nan_in": ("loss", "tests only: what is poisoned: inputs | loss | grads"),
  "init_from": ("", "workdir or checkpoint folder whose matching parameters initialise the model"),
  "bleu_every": (0, "seq2seq: steps between BLEU evaluations (and at the end); 0 = never"),
  "bleu_beam_size": (1, "seq2seq: beam size of the BLEU decoding (1 = greedy)"),
  "compilation_cache_dir": ("", "persistent XLA compilation cache folder ('' = off)"),
  "sample_prompt": ("", "LM only: text whose continuation is printed at the end"),
  "sample_tokens": (200, "LM only: tokens sampled at the end (0 = no sample)"),
  "sample_temperature": (0.8, "LM only: sampling temperature of the final sample"),
}


def _placeholder_type(annotation: str) -> type:
  name = annotation.replace("None", "").replace("|", "").strip()
  if name.startswith("tuple"):
    return tuple
  return {"int": int, "float": float, "str": str, "bool": bool}[name]


def _block(cls) -> ml_collections.ConfigDict:
  """A ConfigDict with every field of dataclass `cls` at its default (None -> placeholder)."""
  block = ml_collections.ConfigDict()
  for field in dataclasses.fields(cls):
    value = field.default
    if value is None:
      value = config_dict.placeholder(_placeholder_type(str(field.type)))
    block[field.name] = value
  return block


def default_config() -> ml_collections.ConfigDict:
  """Every field of an experiment at its default value."""
  config = ml_collections.ConfigDict()
  config.model = _block(ModelConfig)
  config.model.vocab_size = 0  # 0 = the tokenizer's vocabulary size
  config.data = _block(DataConfig)
  config.optimizer = ml_collections.ConfigDict(dict(optimizer_lib.DEFAULTS))
  config.schedule = ml_collections.ConfigDict(
    dict(
      kind="cosine",  # noam | cosine | rsqrt | constant
      learning_rate=1e-3,  # peak learning rate (cosine, rsqrt, constant)
      warmup_steps=100,  # linear warmup steps
      total_steps=config_dict.placeholder(int),  # cosine length; None = num_train_steps
      d_model=config_dict.placeholder(int),  # noam; None = model.d_model
      scale=1.0,  # noam multiplier
      final_fraction=0.0,  # cosine: final learning rate as a fraction of the peak
    )
  )
  config.mesh = ml_collections.ConfigDict(
    dict(
      data=-1,  # data-parallel ways (-1: all devices not used by the other axes)
      fsdp=1,  # ways parameters / optimizer state are sharded (and the batch split)
      tensor=1,  # tensor-parallel ways (heads, FFN hidden, vocabulary)
    )
  )
  # Logical axis -> comma-separated mesh axes ('' = replicated); see transformer/nn/partitioning.py.
  config.mesh_rules = ml_collections.ConfigDict(
    {k: ",".join((v,) if isinstance(v, str) else (v or ())) for k, v in RULES.items()}
  )
  for name, (value, _) in LOOP_FIELDS.items():
    config[name] = value
  return config


@dataclasses.dataclass(frozen=True)
class Experiment:
  """The validated parts of a config."""

  model: ModelConfig  # see `finalize_model` for sizes taken from the data
  data: DataConfig
  optimizer: dict[str, Any]
  schedule: dict[str, Any]
  loop: dict[str, Any]
  vocab_from_data: bool  # model.vocab_size was 0: use the tokenizer's
  classes_from_data: bool  # model.num_classes was 0 for classification data: use the data's
  mesh: dict[str, int]  # mesh axis -> size (-1: the remaining devices)
  rules: dict[str, tuple[str, ...]]  # logical axis -> mesh axes


def _fail(field: str, value: Any, rule: str):
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()  # its repr is multi-line YAML
  shown = repr(value).replace("\n", " ")
  shown = shown if len(shown) <= 80 else shown[:77] + "..."
  raise ValueError(f"config.{field}={shown}: {rule}")


def _check_type(field: str, value: Any, expected: type, optional: bool = False) -> None:
  """`value` is an `expected` (int for float too, never bool for a number; None if optional)."""
  if value is None and optional:
    return
  if expected is float and isinstance(value, int) and not isinstance(value, bool):
    return
  if expected is tuple and isinstance(value, list):
    return
  if not isinstance(value, expected) or (expected in (int, float) and isinstance(value, bool)):
    _fail(field, value, f"must be {expected.__name__}{' or None' if optional else ''}")
  if expected is float and math.isnan(value):
    _fail(field, value, "must be a number, not NaN")


def _field_type(hint: Any) -> tuple[type, bool] | None:
  """(type, optional) for hints int / float / str / bool / tuple[...] and their `| None`."""
  args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
  optional = type(None) in args
  rest = [a for a in args if a is not type(None)]
  if len(rest) != 1:
    return None
  base = typing.get_origin(rest[0]) or rest[0]
  return (base, optional) if base in (int, float, str, bool, tuple) else None


def validate(config: ml_collections.ConfigDict) -> Experiment:
  """Checks every field and returns typed parts; ValueError names the first bad field."""
  known = {"model", "data", "optimizer", "schedule", "mesh", "mesh_rules", *LOOP_FIELDS}
  unknown = sorted(set(config.keys()) - known)
  if unknown:
    _fail(unknown[0], config[unknown[0]], f"unknown field; known: {', '.join(sorted(known))}")
  loop = {}
  for name, (default, _) in LOOP_FIELDS.items():
    value = config.get(name, default)
    _check_type(name, value, type(default))
    loop[name] = value
  for name in (
    "num_train_steps",
    "batch_size",
    "seq_len",
    "grad_accum_steps",
    "log_every",
    "checkpoint_every",
    "keep_checkpoints",
  ):
    if loop[name] <= 0:
      _fail(name, loop[name], "must be > 0")
  for name in ("eval_every", "eval_batches", "sample_tokens", "bleu_every", "bleu_beam_size"):
    if loop[name] < 0:
      _fail(name, loop[name], "must be >= 0")
  if loop["batch_size"] % loop["grad_accum_steps"]:
    _fail(
      "grad_accum_steps", loop["grad_accum_steps"], f"must divide batch_size={loop['batch_size']}"
    )
  if not 0.0 <= loop["label_smoothing"] < 1.0:
    _fail("label_smoothing", loop["label_smoothing"], "must be in [0, 1)")
  if loop["z_loss"] < 0:
    _fail("z_loss", loop["z_loss"], "must be >= 0")
  if loop["parallelism"] not in PARALLELISM:
    _fail("parallelism", loop["parallelism"], f"must be one of {', '.join(PARALLELISM)}")
  if loop["best_mode"] not in ("min", "max"):
    _fail("best_mode", loop["best_mode"], "must be min or max")
  if loop["sample_temperature"] <= 0:
    _fail("sample_temperature", loop["sample_temperature"], "must be > 0")

  model_fields = config.model.to_dict()
  vocab_from_data = model_fields["vocab_size"] == 0
  if vocab_from_data:
    model_fields["vocab_size"] = 1  # validated with a stand-in; `finalize_model` fills it
  classes_from_data = model_fields["num_classes"] == 0 and config.data.kind in (
    "classification",
    "image",
  )
  if classes_from_data:
    model_fields["num_classes"] = 1
  model = _construct("model", ModelConfig, model_fields)
  data = _construct("data", DataConfig.from_mapping, config.data.to_dict(), from_mapping=True)

  opt = config.optimizer.to_dict()
  schedule = config.schedule.to_dict()
  if schedule.get("total_steps") is None:
    schedule["total_steps"] = loop["num_train_steps"]
  if schedule.get("d_model") is None:
    schedule["d_model"] = model.d_model
  try:
    schedules.create_schedule(**schedule)
    optimizer_lib.create_optimizer(opt, 1e-3, {"w": jax.ShapeDtypeStruct((1,), jnp.float32)})
  except ValueError as e:
    raise ValueError(f"config.schedule / config.optimizer: {e}") from None
  _check_family_data(model, data)
  mesh, rules = _mesh(config)
  if loop["parallelism"] == "pmap" and (mesh["fsdp"] != 1 or mesh["tensor"] != 1):
    _fail("parallelism", "pmap", "is data parallelism only: use jit for fsdp / tensor meshes")
  return Experiment(
    model, data, opt, schedule, loop, vocab_from_data, classes_from_data, mesh, rules
  )


def _mesh(config) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
  mesh = config.get("mesh", {"data": -1})
  mesh = mesh.to_dict() if hasattr(mesh, "to_dict") else dict(mesh)
  for name, size in mesh.items():
    if name not in MESH_AXES:
      _fail(f"mesh.{name}", size, f"unknown mesh axis; known: {', '.join(MESH_AXES)}")
    _check_type(f"mesh.{name}", size, int)
    if size == 0 or size < -1:
      _fail(f"mesh.{name}", size, "must be >= 1, or -1 for all remaining devices")
  if list(mesh.values()).count(-1) > 1:
    _fail("mesh", mesh, "at most one axis may be -1")
  rules = {}
  raw = config.get("mesh_rules", {})
  for logical, value in (raw.to_dict() if hasattr(raw, "to_dict") else dict(raw)).items():
    _check_type(f"mesh_rules.{logical}", value, str)
    axes = tuple(a.strip() for a in value.split(",") if a.strip())
    for a in axes:
      if a not in MESH_AXES:
        _fail(f"mesh_rules.{logical}", value, f"names mesh axis {a!r}; known: {MESH_AXES}")
    rules[logical] = axes
  return {a: mesh.get(a, 1) for a in MESH_AXES}, rules


def finalize_model(exp: Experiment, vocab_size: int, num_classes: int) -> ModelConfig:
  """The model config with the sizes the data decides (where the config left them 0)."""
  model = exp.model
  if exp.vocab_from_data and model.family != "vit":
    model = model.replace(vocab_size=vocab_size)
  if exp.classes_from_data:
    model = model.replace(num_classes=num_classes)
  if model.family != "vit" and vocab_size and model.vocab_size < vocab_size:
    _fail("model.vocab_size", model.vocab_size, f"must be >= the tokenizer's {vocab_size}")
  if num_classes and model.num_classes != num_classes:
    _fail("model.num_classes", model.num_classes, f"the data has {num_classes} classes")
  return model


def _construct(block: str, build, fields: dict[str, Any], from_mapping: bool = False):
  hints = typing.get_type_hints(DataConfig if from_mapping else build)
  for name, value in fields.items():
    expected = _field_type(hints.get(name))
    if expected is not None:
      _check_type(f"{block}.{name}", value, *expected)
  try:
    return build(fields) if from_mapping else build(**fields)
  except ValueError as e:
    raise ValueError(f"config.{block}: {e}") from None
  except TypeError as e:
    raise ValueError(f"config.{block}: {e}") from None


# The batch format each model family reads.
FAMILY_DATA_KINDS = {
  "decoder": ("lm",),
  "encoder": ("mlm", "classification"),
  "seq2seq": ("seq2seq",),
  "vit": ("image",),
}


def _check_family_data(model: ModelConfig, data: DataConfig) -> None:
  allowed = FAMILY_DATA_KINDS[model.family]
  if data.kind not in allowed:
    _fail("data.kind", data.kind, f"model.family={model.family!r} reads {' or '.join(allowed)}")
  if data.kind == "mlm" and model.num_classes:
    _fail("model.num_classes", model.num_classes, "must be 0 for masked-LM training")
