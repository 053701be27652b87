"""The experiment configuration: typed, frozen blocks, converted and checked once.

`default_config()` is an ml_collections ConfigDict holding every field at its default;
`configs/NAME.py` files start from it. `validate(config)` converts it, block by block, into
the frozen dataclasses below (`Experiment`), type-checking every field against its
annotation and running each block's rules, so a bad value ends in one `ValueError` line
naming the field before anything is built. Code past this boundary trusts the types.

  model       `ModelConfig` (vocab_size / num_classes 0 = taken from the data)
  data        `DataConfig`; `data.kind` names the task (transformer/tasks)
  optimizer   `OptimizerConfig`
  schedule    `ScheduleConfig`
  mesh        `MeshConfig`, mesh_rules: logical axis -> mesh axes
  (top level) the fields of `LoopConfig`, `CheckpointConfig` and `EvalConfig`
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections
from etils import epath
from ml_collections import config_dict

from transformer import tasks
from transformer.data.config import DataConfig
from transformer.nn.config import ModelConfig
from transformer.nn.partitioning import MESH_AXES, RULES
from transformer.train import optimizer as optimizer_lib
from transformer.train import schedules

PARALLELISM = ("jit", "pmap")
HF_PREFIX = "hf:"  # init_from='hf:DIR': a Hugging Face model directory (docs/PRETRAINED.md)

# ModelConfig fields that change how a model computes, not what it is: a run may resume or
# be evaluated with other values, and a config may set them over an `hf:` checkpoint's.
# Any other difference is a different model.
RUNTIME_FIELDS = (
  "dropout_rate",
  "attention_dropout_rate",
  "attention_impl",
  "attention_chunk_size",
  "dtype",
  "remat_policy",
)


def _fail(field: str, value: Any, rule: str):
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()  # its repr is multi-line YAML
  shown = repr(value).replace("\n", " ")
  shown = shown if len(shown) <= 80 else shown[:77] + "..."
  raise ValueError(f"config.{field}={shown}: {rule}")


def _positive(block: Any, *names: str, minimum: int = 1) -> None:
  for name in names:
    if getattr(block, name) < minimum:
      _fail(name, getattr(block, name), f"must be >= {minimum}" if minimum else "must be >= 0")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """Steps, batch and loss of the training loop."""

  seed: int = 0  # seeds parameters, dropout and the data order
  num_train_steps: int = 1000  # optimizer updates in the whole run
  batch_size: int = 32  # global batch (examples per update, all devices and micro-batches)
  seq_len: int = 128  # tokens per row (source length for seq2seq); ignored for images
  grad_accum_steps: int = 1  # micro-batches per update (batch_size must divide evenly)
  label_smoothing: float = 0.0  # label smoothing epsilon of the cross-entropy
  z_loss: float = 0.0  # coefficient of logsumexp(logits)^2 (PaLM z-loss); 0 = off
  parallelism: str = "jit"  # jit (mesh sharding, batch over 'data') or pmap (axis 'batch')
  log_every: int = 50  # steps between training-metric lines
  skip_nonfinite: bool = False  # skip (and count) updates with NaN/Inf instead of stopping
  preemption_grace_seconds: float = 25.0  # SIGTERM: seconds to save and exit (< the kill)
  init_from: str = ""  # workdir / checkpoint folder whose matching parameters init the model,
  # or 'hf:DIR', a Hugging Face directory: its model config, weights and tokenizer
  compilation_cache_dir: str = ""  # persistent XLA compilation cache folder ('' = off)

  def __post_init__(self):
    _positive(self, "num_train_steps", "batch_size", "seq_len", "grad_accum_steps", "log_every")
    if self.batch_size % self.grad_accum_steps:
      _fail("grad_accum_steps", self.grad_accum_steps, f"must divide batch_size={self.batch_size}")
    if not 0.0 <= self.label_smoothing < 1.0:
      _fail("label_smoothing", self.label_smoothing, "must be in [0, 1)")
    if self.z_loss < 0:
      _fail("z_loss", self.z_loss, "must be >= 0")
    if self.parallelism not in PARALLELISM:
      _fail("parallelism", self.parallelism, f"must be one of {', '.join(PARALLELISM)}")
    if not self.preemption_grace_seconds > 0:
      _fail("preemption_grace_seconds", self.preemption_grace_seconds, "must be > 0")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """When checkpoints are written and which are kept."""

  checkpoint_every: int = 500  # steps between checkpoints (and at the end)
  keep_checkpoints: int = 3  # most recent checkpoints kept
  best_metric: str = "loss"  # eval metric whose best checkpoint is also kept; '' = none
  best_mode: str = "min"  # min or max: which value of best_metric is best

  def __post_init__(self):
    _positive(self, "checkpoint_every", "keep_checkpoints")
    if self.best_mode not in ("min", "max"):
      _fail("best_mode", self.best_mode, "must be min or max")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Periodic evaluation and the task's own evaluations (`tasks.Extras`)."""

  eval_every: int = 500  # steps between evaluations (and at the end); 0 = only at the end
  eval_batches: int = 0  # batches per evaluation; 0 = the whole evaluation split
  bleu_every: int = 0  # seq2seq: steps between BLEU evaluations (and at the end); 0 = never
  bleu_beam_size: int = 1  # seq2seq: beam size of the BLEU decoding (1 = greedy)
  sample_prompt: str = ""  # LM only: text whose continuation is printed at the end
  sample_tokens: int = 200  # LM only: tokens sampled at the end (0 = no sample)
  sample_temperature: float = 0.8  # LM only: sampling temperature of the final sample

  def __post_init__(self):
    _positive(self, "eval_every", "eval_batches", "sample_tokens", "bleu_every", minimum=0)
    _positive(self, "bleu_beam_size", minimum=0)
    if self.sample_temperature <= 0:
      _fail("sample_temperature", self.sample_temperature, "must be > 0")

  def extras(self, seed: int) -> tasks.Extras:
    names = {f.name for f in dataclasses.fields(tasks.Extras)} - {"seed"}
    return tasks.Extras(seed=seed, **{n: getattr(self, n) for n in names})


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
  """The learning-rate schedule (`train/schedules.py`)."""

  kind: str = "cosine"  # noam | cosine | rsqrt | constant
  learning_rate: float = 1e-3  # peak learning rate (cosine, rsqrt, constant)
  warmup_steps: int = 100  # linear warmup steps
  total_steps: int | None = None  # cosine length; None = num_train_steps
  d_model: int | None = None  # noam; None = model.d_model
  scale: float = 1.0  # noam multiplier
  final_fraction: float = 0.0  # cosine: final learning rate as a fraction of the peak


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Devices per mesh axis (`nn/partitioning.py`)."""

  data: int = -1  # data-parallel ways (-1: all devices not used by the other axes)
  fsdp: int = 1  # ways parameters / optimizer state are sharded (and the batch split)
  tensor: int = 1  # tensor-parallel ways (heads, FFN hidden, vocabulary)

  def __post_init__(self):
    sizes = dataclasses.asdict(self)
    for name, size in sizes.items():
      if size == 0 or size < -1:
        _fail(f"mesh.{name}", size, "must be >= 1, or -1 for all remaining devices")
    if list(sizes.values()).count(-1) > 1:
      _fail("mesh", sizes, "at most one axis may be -1")

  def shape(self) -> dict[str, int]:
    return dataclasses.asdict(self)


TOP_BLOCKS = (LoopConfig, CheckpointConfig, EvalConfig)  # flat top-level fields


@dataclasses.dataclass(frozen=True)
class Experiment:
  """The validated parts of a config."""

  model: ModelConfig  # see `finalize_model` for sizes taken from the data
  data: DataConfig
  task: tasks.Task
  optimizer: optimizer_lib.OptimizerConfig
  schedule: schedules.Schedule  # learning rate as a function of the update count
  loop: LoopConfig
  checkpoint: CheckpointConfig
  eval: EvalConfig
  mesh: MeshConfig
  rules: dict[str, tuple[str, ...]]  # logical axis -> mesh axes
  vocab_from_data: bool  # model.vocab_size was 0: use the tokenizer's
  classes_from_data: bool  # model.num_classes was 0 for labelled data: use the data's


def _block(cls) -> ml_collections.ConfigDict:
  """A ConfigDict with every field of dataclass `cls` at its default (None -> placeholder)."""
  block = ml_collections.ConfigDict()
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    value = field.default
    if value is None:
      value = config_dict.placeholder(_field_type(hints[field.name])[0])
    block[field.name] = value
  return block


def default_config() -> ml_collections.ConfigDict:
  """Every field of an experiment at its default value."""
  config = ml_collections.ConfigDict()
  config.model = _block(ModelConfig)
  config.model.vocab_size = 0  # 0 = the tokenizer's vocabulary size
  config.data = _block(DataConfig)
  config.optimizer = _block(optimizer_lib.OptimizerConfig)
  config.schedule = _block(ScheduleConfig)
  config.mesh = _block(MeshConfig)
  # Logical axis -> comma-separated mesh axes ('' = replicated); see nn/partitioning.py.
  config.mesh_rules = ml_collections.ConfigDict(
    {k: ",".join((v,) if isinstance(v, str) else (v or ())) for k, v in RULES.items()}
  )
  for cls in TOP_BLOCKS:
    for name, value in _block(cls).items():
      config[name] = value
  return config


def top_level_fields() -> dict[str, type]:
  """Top-level field -> its type (the fields of `TOP_BLOCKS`)."""
  out = {}
  for cls in TOP_BLOCKS:
    hints = typing.get_type_hints(cls)
    out |= {f.name: _field_type(hints[f.name])[0] for f in dataclasses.fields(cls)}
  return out


# ----------------------------------------------------------------------------------------
# ConfigDict -> dataclasses, with the field named on any error.


def _field_type(hint: Any) -> tuple[type, bool] | None:
  """(type, optional) for hints int / float / str / bool / tuple[...] and their `| None`."""
  args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
  optional = type(None) in args
  rest = [a for a in args if a is not type(None)]
  if len(rest) != 1:
    return None
  base = typing.get_origin(rest[0]) or rest[0]
  return (base, optional) if base in (int, float, str, bool, tuple) else None


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


def convert(cls, values: Mapping[str, Any], prefix: str = "") -> Any:
  """`cls(**values)` with every field type-checked against its annotation.

  Unknown fields and wrong types raise `ValueError` naming `config.<prefix><field>`; the
  dataclass's own rules (its `__post_init__`) name the field too.
  """
  hints = typing.get_type_hints(cls)
  names = [f.name for f in dataclasses.fields(cls)]
  for name, value in values.items():
    if name not in names:
      _fail(f"{prefix}{name}", value, f"unknown field; known: {', '.join(sorted(names))}")
    expected = _field_type(hints[name])
    if expected is not None:
      _check_type(f"{prefix}{name}", value, *expected)
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
  try:
    return cls(**fields)
  except (TypeError, ValueError) as e:
    message = str(e)
    if message.startswith("config."):
      raise ValueError(message) from None
    raise ValueError(f"config.{prefix.rstrip('.')}: {message}") from None


def _as_dict(block: Any) -> dict[str, Any]:
  return block.to_dict() if hasattr(block, "to_dict") else dict(block)


def validate(config: ml_collections.ConfigDict) -> Experiment:
  """Checks every field and returns the typed parts; ValueError names the first bad field."""
  nested = ("model", "data", "optimizer", "schedule", "mesh", "mesh_rules")
  flat = {k: v for k, v in config.items() if k not in nested}
  known = top_level_fields()
  for name in flat:
    if name not in known:
      _fail(name, flat[name], f"unknown field; known: {', '.join(sorted([*nested, *known]))}")
  loop, checkpoint, evaluation = (
    convert(cls, {f.name: flat[f.name] for f in dataclasses.fields(cls) if f.name in flat})
    for cls in TOP_BLOCKS
  )

  data_fields = _as_dict(config.data)
  model_fields = _as_dict(config.model)
  directory = hf_dir(loop.init_from)
  if directory is not None:
    model_fields, data_fields = _from_hf(loop.init_from, directory, model_fields, data_fields)
  data = convert(DataConfig, data_fields, "data.")
  task = tasks.get(data.kind).create(data, loop.seq_len)
  vocab_from_data = model_fields.get("vocab_size") == 0
  if vocab_from_data:
    model_fields["vocab_size"] = 1  # validated with a stand-in; `finalize_model` fills it
  classes_from_data = model_fields.get("num_classes", 0) == 0 and task.data_spec().labelled
  if classes_from_data:
    model_fields["num_classes"] = 1
  model = convert(ModelConfig, model_fields, "model.")
  task.check(model, data)

  optimizer = convert(optimizer_lib.OptimizerConfig, _as_dict(config.optimizer), "optimizer.")
  schedule_cfg = convert(ScheduleConfig, _as_dict(config.schedule), "schedule.")
  fields = dataclasses.asdict(schedule_cfg)
  fields["total_steps"] = fields["total_steps"] or loop.num_train_steps
  fields["d_model"] = fields["d_model"] or model.d_model
  try:
    schedule = schedules.create_schedule(**fields)
  except ValueError as e:
    raise ValueError(f"config.schedule: {e}") from None

  mesh = convert(MeshConfig, _as_dict(config.get("mesh", {})), "mesh.")
  if loop.parallelism == "pmap" and (mesh.fsdp != 1 or mesh.tensor != 1):
    _fail("parallelism", "pmap", "is data parallelism only: use jit for fsdp / tensor meshes")
  rules = _rules(config.get("mesh_rules", {}))
  return Experiment(
    model=model,
    data=data,
    task=task,
    optimizer=optimizer,
    schedule=schedule,
    loop=loop,
    checkpoint=checkpoint,
    eval=evaluation,
    mesh=mesh,
    rules=rules,
    vocab_from_data=vocab_from_data,
    classes_from_data=classes_from_data,
  )


def hf_dir(init_from: str) -> str | None:
  """The Hugging Face directory of `init_from='hf:DIR'`, else None."""
  return init_from[len(HF_PREFIX) :] if init_from.startswith(HF_PREFIX) else None


def _from_hf(
  init_from: str, directory: str, model: dict[str, Any], data: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
  """The model fields of the checkpoint (with the config's runtime fields and max_len) and
  the data fields reading its tokenizer.

  A model field the config sets (differs from `default_config()`) that the checkpoint
  decides otherwise is one `ValueError` naming the field and both values.
  """
  from transformer.convert import hf, registry
  from transformer.convert import tokenizers as pretrained

  where = f"config.init_from={init_from!r}"
  try:
    hf_config = hf.read_config(directory)
    architectures = hf_config.get("architectures") or [None]
    if len(architectures) != 1:
      raise ValueError(f"architectures={architectures}: expected one entry")
    converter = registry.get(architectures[0], "architectures")
    fields = converter.config_from_hf(hf_config)
  except KeyError as e:
    raise ValueError(f"{where}: config.json lacks {e}") from None
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  defaults = _as_dict(default_config().model)
  merged = dict(model)
  for name, value in fields.items():
    mine = model.get(name, defaults.get(name))
    if name in RUNTIME_FIELDS:
      continue  # the config's (the checkpoint's dropout is not applied)
    if mine == defaults.get(name) or mine == value:
      merged[name] = value
    elif name != "max_len":
      _fail(f"model.{name}", mine, f"conflicts with the checkpoint's {name}={value!r} ({where})")
  if merged.get("scan_layers"):
    _fail("model.scan_layers", True, f"{where} loads unrolled layers: use False")
  if merged.get("position") == "learned" and merged["max_len"] > fields.get("max_len", 0):
    _fail(
      "model.max_len", merged["max_len"],
      f"exceeds the checkpoint's {fields.get('max_len')} learned positions ({where})",
    )  # fmt: skip
  root = epath.Path(directory)
  if any((root / name).exists() for name in pretrained.SOURCE_FILES):
    default_data = _as_dict(default_config().data)
    if data.get("tokenizer") not in (default_data["tokenizer"], pretrained.KIND):
      _fail("data.tokenizer", data.get("tokenizer"), f"{where} reads the checkpoint's tokenizer")
    if data.get("tokenizer_from"):
      _fail("data.tokenizer_from", data["tokenizer_from"], f"{where} reads its own tokenizer")
    # `train.setup.build` copies it into the workdir and points tokenizer_from there.
    data = {**data, "tokenizer": pretrained.KIND, "tokenizer_from": directory}
  return merged, data


def _rules(raw: Any) -> dict[str, tuple[str, ...]]:
  rules = {}
  for logical, value in _as_dict(raw).items():
    _check_type(f"mesh_rules.{logical}", value, str)
    axes = tuple(a.strip() for a in value.split(",") if a.strip())
    for a in axes:
      if a not in MESH_AXES:
        _fail(f"mesh_rules.{logical}", value, f"names mesh axis {a!r}; known: {MESH_AXES}")
    rules[logical] = axes
  return rules


def finalize_model(exp: Experiment, vocab_size: int, num_classes: int) -> ModelConfig:
  """The model config with the sizes the data decides (where the config left them 0).

  `vocab_size` is the tokenizer's (0 for images); the task may add ids above it.
  """
  model = exp.model
  needed = vocab_size + exp.task.extra_vocab if vocab_size else 0
  if exp.vocab_from_data and needed:
    model = model.replace(vocab_size=needed)
  if exp.classes_from_data:
    model = model.replace(num_classes=num_classes)
  if needed and model.vocab_size < needed:
    extra = f" + {exp.task.extra_vocab} task ids" if exp.task.extra_vocab else ""
    _fail("model.vocab_size", model.vocab_size, f"must be >= the tokenizer's {vocab_size}{extra}")
  if num_classes and model.num_classes != num_classes:
    _fail("model.num_classes", model.num_classes, f"the data has {num_classes} classes")
  return model
