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
  wandb       `WandbConfig` (Weights & Biases tracking, off by default)
  (top level) the fields of `LoopConfig`, `CheckpointConfig`, `EvalConfig`, `EMAConfig`,
              `TelemetryConfig`
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections
from etils import epath
from ml_collections import config_dict

from transformer import tasks
from transformer.convert import sources
from transformer.data.config import DataConfig
from transformer.nn import models
from transformer.nn.config import ModelConfig
from transformer.nn.partitioning import MESH_AXES, RULES
from transformer.train import optimizer as optimizer_lib
from transformer.train import schedules
from transformer.train.distributed import DEFAULT_TIMEOUT_S

PARALLELISM = ("jit", "pmap")
# What a pretrained `init_from` decided, recorded in the workdir when a run is built: resumes
# and evaluation read it there, so the checkpoint may move or go once the run has started.
PRETRAINED_RECORD = "pretrained.json"

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
  # or 'hf:DIR', a Hugging Face directory: its model config, weights and tokenizer,
  # or 'bv:FILE.npz', a big_vision ViT: its model config and weights
  compilation_cache_dir: str = ""  # persistent XLA compilation cache folder ('' = off)
  distributed_timeout_s: int = DEFAULT_TIMEOUT_S  # several processes: seconds without a
  # peer's heartbeat before the run stops naming it (the bound on every wait for the others)

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
    _positive(self, "distributed_timeout_s")


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
class EMAConfig:
  """An exponential moving average of the parameters, kept in the train state."""

  ema_decay: float = 0.0  # ema <- d * ema + (1 - d) * params after every update; 0 = no EMA
  ema_warmup: bool = False  # d = min(ema_decay, (1 + t) / (10 + t)), t = updates before this

  def __post_init__(self):
    if self.ema_decay != 0.0 and not 0.0 < self.ema_decay < 1.0:
      _fail("ema_decay", self.ema_decay, "must be in (0, 1), or 0 for no EMA")
    if self.ema_warmup and self.ema_decay == 0.0:
      _fail("ema_warmup", self.ema_warmup, "needs ema_decay in (0, 1)")

  @property
  def enabled(self) -> bool:
    return self.ema_decay > 0.0


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
  """The learning-rate schedule (`train/schedules.py`)."""

  kind: str = "cosine"  # noam | cosine | rsqrt | constant | wsd (warmup-stable-decay)
  learning_rate: float = 1e-3  # peak learning rate (cosine, rsqrt, constant, wsd)
  warmup_steps: int = 100  # linear warmup steps
  total_steps: int | None = None  # cosine / wsd length; None = num_train_steps
  d_model: int | None = None  # noam; None = model.d_model
  scale: float = 1.0  # noam multiplier
  final_fraction: float = 0.0  # cosine / wsd: final learning rate as a fraction of the peak
  decay_fraction: float = 0.1  # wsd: share of total_steps spent in the final decay, (0, 1]
  decay_shape: str = "linear"  # wsd: linear | cosine | 1-sqrt (Hagele et al. 2024)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Devices per mesh axis (`nn/partitioning.py`)."""

  data: int = -1  # data-parallel ways (-1: all devices not used by the other axes)
  fsdp: int = 1  # ways parameters / optimizer state are sharded (and the batch split)
  tensor: int = 1  # tensor-parallel ways (heads, FFN hidden, vocabulary)
  expert: int = 1  # expert-parallel ways (mixture-of-experts weights; the batch is split too)

  def __post_init__(self):
    sizes = dataclasses.asdict(self)
    for name, size in sizes.items():
      if size == 0 or size < -1:
        _fail(f"mesh.{name}", size, "must be >= 1, or -1 for all remaining devices")
    if list(sizes.values()).count(-1) > 1:
      _fail("mesh", sizes, "at most one axis may be -1")

  def shape(self) -> dict[str, int]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TelemetryConfig:
  """What the loop measures beyond the metrics: MFU and a profiler trace (`train/telemetry.py`)."""

  profile_steps: tuple[int, ...] = ()  # (first, last) updates traced by jax.profiler into
  # workdir/plugins/profile (TensorBoard's Profile tab); () = no trace
  peak_flops: float = 0.0  # peak FLOP/s of one device for MFU; 0 = the accelerator table
  # (GPUs, TPUs; none for the CPU, where MFU is omitted unless measured or given here)
  measure_peak_flops: bool = False  # no table entry: time a matmul at start for the peak

  def __post_init__(self):
    steps = self.profile_steps
    if steps and (len(steps) != 2 or not all(isinstance(s, int) for s in steps)):
      _fail("profile_steps", steps, "must be () or (first, last): two update numbers")
    if steps and not 1 <= steps[0] <= steps[1]:
      _fail("profile_steps", steps, "must have 1 <= first <= last")
    if not self.peak_flops >= 0 or math.isinf(self.peak_flops):
      _fail("peak_flops", self.peak_flops, "must be a finite FLOP/s >= 0 (0 = the table's)")


WANDB_MODES = ("disabled", "offline", "online")


@dataclasses.dataclass(frozen=True)
class WandbConfig:
  """Weights & Biases tracking (`train/tracking.py`; needs `pip install '.[wandb]'`)."""

  mode: str = "disabled"  # disabled | offline (files in workdir/wandb; `wandb sync` them) | online
  project: str = "transformer"  # W&B project
  entity: str = ""  # W&B team or user; '' = the account's default
  name: str = ""  # run name; '' = the workdir's name
  tags: tuple[str, ...] = ()  # run tags

  def __post_init__(self):
    if self.mode not in WANDB_MODES:
      _fail("wandb.mode", self.mode, f"must be one of {', '.join(WANDB_MODES)}")
    if not all(isinstance(t, str) and t for t in self.tags):
      _fail("wandb.tags", self.tags, "must be non-empty strings")
    if self.mode != "disabled" and not self.project:
      _fail("wandb.project", self.project, "must name a W&B project")


TOP_BLOCKS = (LoopConfig, CheckpointConfig, EvalConfig, EMAConfig, TelemetryConfig)  # flat fields


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
  ema: EMAConfig = EMAConfig()  # the parameter EMA (off by default)
  telemetry: TelemetryConfig = TelemetryConfig()  # MFU peak, profiler window
  wandb: WandbConfig = WandbConfig()  # Weights & Biases tracking (off by default)
  # A pretrained init_from's record (`_pretrained_record`): written to the workdir by setup.
  pretrained: dict[str, Any] | None = None


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
  config.wandb = _block(WandbConfig)
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


def validate(config: ml_collections.ConfigDict, workdir: str | None = None) -> Experiment:
  """Checks every field and returns the typed parts; ValueError names the first bad field.

  `workdir`: the run's, where a pretrained `init_from` (hf:, bv:) recorded what its
  checkpoint decides (`PRETRAINED_RECORD`); read there instead of the checkpoint.
  """
  nested = ("model", "data", "optimizer", "schedule", "mesh", "mesh_rules", "wandb")
  flat = {k: v for k, v in config.items() if k not in nested}
  known = top_level_fields()
  for name in flat:
    if name not in known:
      _fail(name, flat[name], f"unknown field; known: {', '.join(sorted([*nested, *known]))}")
  loop, checkpoint, evaluation, ema, telemetry = (
    convert(cls, {f.name: flat[f.name] for f in dataclasses.fields(cls) if f.name in flat})
    for cls in TOP_BLOCKS
  )
  if telemetry.profile_steps and telemetry.profile_steps[0] > loop.num_train_steps:
    _fail(
      "profile_steps",
      telemetry.profile_steps,
      f"starts after num_train_steps={loop.num_train_steps}",
    )
  wandb = convert(WandbConfig, _as_dict(config.get("wandb", {})), "wandb.")
  if checkpoint.best_metric.startswith("ema_") and not ema.enabled:
    _fail("best_metric", checkpoint.best_metric, "ranks the EMA weights: needs ema_decay in (0, 1)")

  data_fields = _as_dict(config.data)
  model_fields = _as_dict(config.model)
  pretrained = None
  if sources.find(loop.init_from) is not None:
    pretrained = _pretrained_record(loop.init_from, workdir)
    model_fields, data_fields = _from_pretrained(pretrained, model_fields, data_fields)
  data = convert(DataConfig, data_fields, "data.")
  task = tasks.get(data.kind).create(data, loop.seq_len)
  vocab_from_data = model_fields.get("vocab_size") == 0
  if vocab_from_data:
    model_fields["vocab_size"] = 1  # validated with a stand-in; `finalize_model` fills it
  classes_from_data = model_fields.get("num_classes", 0) == 0 and task.data_spec().labelled
  if classes_from_data:
    model_fields["num_classes"] = 1
  model = convert(ModelConfig, model_fields, "model.")
  try:
    models.check(model)  # the family's, position's, ops' and kernels' rules
  except ValueError as e:
    raise ValueError(f"config.model: {e}") from None
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
  if loop.parallelism == "pmap" and (mesh.fsdp != 1 or mesh.tensor != 1 or mesh.expert != 1):
    _fail("parallelism", "pmap", "is data parallelism only: use jit for fsdp / tensor / expert")
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
    ema=ema,
    pretrained=pretrained,
    telemetry=telemetry,
    wandb=wandb,
  )


def hf_dir(init_from: str) -> str | None:
  """The Hugging Face directory of `init_from='hf:DIR'`, else None."""
  found = sources.find(init_from)
  return found[1] if found is not None and found[0] is sources.HF else None


def _read_record(init_from: str, workdir: str | None) -> dict[str, Any] | None:
  """The workdir's record of this `init_from` (None: no record, or one of another source)."""
  if not workdir:
    return None
  path = epath.Path(workdir) / PRETRAINED_RECORD
  if not path.exists():
    return None
  try:
    record = json.loads(path.read_text())
    ok = isinstance(record, dict) and isinstance(record.get("model"), dict)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: unreadable record of config.init_from ({e})") from None
  if not ok:
    raise ValueError(f"{path}: expected a JSON object with 'init_from', 'model', 'tokenizer'")
  return record if record.get("init_from") == init_from else None


def _pretrained_record(init_from: str, workdir: str | None) -> dict[str, Any]:
  """{'init_from', 'model': the checkpoint's ModelConfig fields, 'tokenizer': whether the
  checkpoint brings one}: from the workdir's record, else read from the checkpoint."""
  record = _read_record(init_from, workdir)
  if record is not None:
    return record
  source, path = sources.find(init_from)
  where = f"config.init_from={init_from!r}"
  try:
    fields, tokenizer = source.describe(path)
  except KeyError as e:
    raise ValueError(f"{where}: config.json lacks {e}") from None
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  return {"init_from": init_from, "model": fields, "tokenizer": tokenizer}


def _from_pretrained(
  record: dict[str, Any], model: dict[str, Any], data: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
  """The model fields of the checkpoint (with the config's runtime fields, max_len and
  num_classes) and the data fields reading its tokenizer.

  A model field the config sets (differs from `default_config()`) that the checkpoint
  decides otherwise is one `ValueError` naming the field and both values. `num_classes`
  is the config's or the data's: a head of another size keeps its initial values.
  """
  init_from, fields = record["init_from"], record["model"]
  where = f"config.init_from={init_from!r}"
  defaults = _as_dict(default_config().model)
  merged = dict(model)
  for name, value in fields.items():
    mine = model.get(name, defaults.get(name))
    if name in RUNTIME_FIELDS or name == "num_classes":
      continue  # the config's (the checkpoint's dropout is not applied; the task's classes)
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
  if record.get("tokenizer"):
    from transformer.convert import tokenizers as pretrained

    default_data = _as_dict(default_config().data)
    if data.get("tokenizer") not in (default_data["tokenizer"], pretrained.KIND):
      _fail("data.tokenizer", data.get("tokenizer"), f"{where} reads the checkpoint's tokenizer")
    if data.get("tokenizer_from"):
      _fail("data.tokenizer_from", data["tokenizer_from"], f"{where} reads its own tokenizer")
    # `train.setup.build` copies it into the workdir and points tokenizer_from there.
    data = {**data, "tokenizer": pretrained.KIND, "tokenizer_from": sources.find(init_from)[1]}
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
