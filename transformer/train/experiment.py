"""The experiment configuration: typed, frozen blocks, converted and checked once.

`default_config()` is an ml_collections ConfigDict holding every field at its default;
`configs/NAME.py` files start from it. `validate(config)` converts it, block by block, into
the frozen dataclasses below (`Experiment`), type-checking every field against its
annotation and running each block's rules, so a bad value ends in one `ValueError` line
naming the field before anything is built. Code past this boundary trusts the types.

  model       `ModelConfig` (vocab_size / num_classes 0 = taken from the data)
  data        `DataConfig`: what to read and how to shape it; `data.kind` names the task
  task        the task's `Options` (`task_block(kind)`; the default is the lm task's:
              label_smoothing, z_loss)
  evaluate    evaluate.NAME: evaluator NAME's `Options` (e.g. evaluate.bleu.every)
  optimizer   `OptimizerConfig`
  schedule    `ScheduleConfig`
  mesh        `MeshConfig`, mesh_rules: logical axis -> mesh axes
  wandb       `WandbConfig` (Weights & Biases tracking, off by default)
  (top level) the fields of `LoopConfig`, `CheckpointConfig`, `EvalConfig`, `EMAConfig`,
              `TelemetryConfig`, `FaultConfig` (train/guard/config.py)

A field that has moved (`moved_fields.MOVED`) is refused in one line naming its new place
(`eval/evaluate.load_config` moves it in a config saved before).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

import ml_collections
from ml_collections import config_dict

from transformer import evaluators, tasks
from transformer.convert import sources
from transformer.data.config import DataConfig, fail
from transformer.evaluators import NoOptions
from transformer.nn import models
from transformer.nn.config import ModelConfig
from transformer.nn.partitioning import RULES
from transformer.train import mesh_config, moved_fields, schedules
from transformer.train import optimizer as optimizer_lib
from transformer.train import pretrained as pretrained_lib
from transformer.train.guard.config import FaultConfig
from transformer.train.mesh_config import MeshConfig
from transformer.train.typed_config import as_dict, convert, field_type

PARALLELISM = ("jit", "pmap")


def _positive(block: Any, *names: str, minimum: int = 1) -> None:
  for name in names:
    if getattr(block, name) < minimum:
      fail(name, getattr(block, name), f"must be >= {minimum}" if minimum else "must be >= 0")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """Steps and batch of the training loop."""

  seed: int = 0  # seeds parameters, dropout and the data order
  num_train_steps: int = 1000  # optimizer updates in the whole run
  batch_size: int = 32  # global batch (examples per update, all devices and micro-batches)
  seq_len: int = 128  # tokens per row (source length for seq2seq); ignored for images
  grad_accum_steps: int = 1  # micro-batches per update (batch_size must divide evenly)
  parallelism: str = "jit"  # jit (mesh sharding, batch over 'data') or pmap (axis 'batch')
  log_every: int = 50  # steps between training-metric lines
  skip_nonfinite: bool = False  # skip (and count) updates with NaN/Inf instead of stopping
  init_from: str = ""  # workdir / checkpoint folder whose matching parameters init the model,
  # or 'hf:DIR', a Hugging Face directory: its model config, weights and tokenizer,
  # or 'bv:FILE.npz', a big_vision ViT: its model config and weights
  compilation_cache_dir: str = "auto"  # persistent XLA compilation cache: a folder or URL,
  # 'auto' ($JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/transformer/jax, default
  # ~/.cache/transformer/jax), or '' (off); `compile_cache.py`

  def __post_init__(self):
    _positive(self, "num_train_steps", "batch_size", "seq_len", "grad_accum_steps", "log_every")
    if self.batch_size % self.grad_accum_steps:
      fail("grad_accum_steps", self.grad_accum_steps, f"must divide batch_size={self.batch_size}")
    if self.parallelism not in PARALLELISM:
      fail("parallelism", self.parallelism, f"must be one of {', '.join(PARALLELISM)}")


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
      fail("best_mode", self.best_mode, "must be min or max")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Periodic evaluation; the evaluators' own settings are `config.evaluate.NAME`."""

  eval_every: int = 500  # steps between evaluations (and at the end); 0 = only at the end
  eval_batches: int = 0  # batches per evaluation; 0 = the whole evaluation split
  evaluators: tuple[str, ...] = ()  # evaluators/ a run uses; () = its task's (Task.evaluators)

  def __post_init__(self):
    _positive(self, "eval_every", "eval_batches", minimum=0)


@dataclasses.dataclass(frozen=True)
class EMAConfig:
  """An exponential moving average of the parameters, kept in the train state."""

  ema_decay: float = 0.0  # ema <- d * ema + (1 - d) * params after every update; 0 = no EMA
  ema_warmup: bool = False  # d = min(ema_decay, (1 + t) / (10 + t)), t = updates before this

  def __post_init__(self):
    if self.ema_decay != 0.0 and not 0.0 < self.ema_decay < 1.0:
      fail("ema_decay", self.ema_decay, "must be in (0, 1), or 0 for no EMA")
    if self.ema_warmup and self.ema_decay == 0.0:
      fail("ema_warmup", self.ema_warmup, "needs ema_decay in (0, 1)")

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
      fail("profile_steps", steps, "must be () or (first, last): two update numbers")
    if steps and not 1 <= steps[0] <= steps[1]:
      fail("profile_steps", steps, "must have 1 <= first <= last")
    if not self.peak_flops >= 0 or math.isinf(self.peak_flops):
      fail("peak_flops", self.peak_flops, "must be a finite FLOP/s >= 0 (0 = the table's)")


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
      fail("wandb.mode", self.mode, f"must be one of {', '.join(WANDB_MODES)}")
    if not all(isinstance(t, str) and t for t in self.tags):
      fail("wandb.tags", self.tags, "must be non-empty strings")
    if self.mode != "disabled" and not self.project:
      fail("wandb.project", self.project, "must name a W&B project")


TOP_BLOCKS = (LoopConfig, CheckpointConfig, EvalConfig, EMAConfig, TelemetryConfig, FaultConfig)


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
  evaluate: dict[str, Any]  # evaluator name -> its validated `Options`
  mesh: MeshConfig
  rules: dict[str, tuple[str, ...]]  # logical axis -> mesh axes
  vocab_from_data: bool  # model.vocab_size was 0: use the tokenizer's
  classes_from_data: bool  # model.num_classes was 0 for labelled data: use the data's
  ema: EMAConfig = EMAConfig()  # the parameter EMA (off by default)
  telemetry: TelemetryConfig = TelemetryConfig()  # MFU peak, profiler window
  wandb: WandbConfig = WandbConfig()  # Weights & Biases tracking (off by default)
  faults: FaultConfig = FaultConfig()  # preemption, lost and stalled peers, storage
  # A pretrained init_from's record (`pretrained.read_record`): written to the workdir by setup.
  pretrained: dict[str, Any] | None = None


def _block(cls) -> ml_collections.ConfigDict:
  """A ConfigDict with every field of dataclass `cls` at its default (None -> placeholder)."""
  block = ml_collections.ConfigDict()
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    value = field.default
    if value is None:
      value = config_dict.placeholder(field_type(hints[field.name])[0])
    block[field.name] = value
  return block


def task_block(kind: str) -> ml_collections.ConfigDict:
  """`config.task` for task `kind` (`data.kind`): its `Options`, every field at its default.
  A config of another task sets `config.task = task_block(KIND)` before its fields."""
  return _block(tasks.get(kind).Options)


def default_config() -> ml_collections.ConfigDict:
  """Every field of an experiment at its default value."""
  config = ml_collections.ConfigDict()
  config.model = _block(ModelConfig)
  config.model.vocab_size = 0  # 0 = the tokenizer's vocabulary size
  config.data = _block(DataConfig)
  config.task = task_block(DataConfig.kind)
  config.evaluate = ml_collections.ConfigDict()  # evaluate.NAME.FIELD
  for name, cls in evaluators.EVALUATORS.items():
    if cls.Options is not NoOptions:
      config.evaluate[name] = _block(cls.Options)
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
    out |= {f.name: field_type(hints[f.name])[0] for f in dataclasses.fields(cls)}
  return out


def validate(config: ml_collections.ConfigDict, workdir: str | None = None) -> Experiment:
  """Checks every field and returns the typed parts; ValueError names the first bad field.

  `workdir`: the run's, where a pretrained `init_from` (hf:, bv:) recorded what its
  checkpoint decides (`pretrained.RECORD`); read there instead of the checkpoint.
  """
  nested = ("model", "data", "task", "evaluate", "optimizer", "schedule", "mesh", "mesh_rules")
  nested += ("wandb",)
  moved_fields.refuse(config)
  flat = {k: v for k, v in config.items() if k not in nested}
  known = top_level_fields()
  for name in flat:
    if name not in known:
      fail(name, flat[name], f"unknown field; known: {', '.join(sorted([*nested, *known]))}")
  loop, checkpoint, evaluation, ema, telemetry, faults = (
    convert(cls, {f.name: flat[f.name] for f in dataclasses.fields(cls) if f.name in flat})
    for cls in TOP_BLOCKS
  )
  if telemetry.profile_steps and telemetry.profile_steps[0] > loop.num_train_steps:
    fail(
      "profile_steps",
      telemetry.profile_steps,
      f"starts after num_train_steps={loop.num_train_steps}",
    )
  wandb = convert(WandbConfig, as_dict(config.get("wandb", {})), "wandb.")
  if checkpoint.best_metric.startswith("ema_") and not ema.enabled:
    fail("best_metric", checkpoint.best_metric, "ranks the EMA weights: needs ema_decay in (0, 1)")

  data_fields = as_dict(config.data)
  model_fields = as_dict(config.model)
  pretrained = None
  if sources.find(loop.init_from) is not None:
    pretrained = pretrained_lib.read_record(loop.init_from, workdir)
    defaults = default_config()
    model_fields, data_fields = pretrained_lib.merge(
      pretrained, model_fields, data_fields, as_dict(defaults.model), as_dict(defaults.data)
    )
  data = convert(DataConfig, data_fields, "data.")
  options = convert(tasks.get(data.kind).Options, as_dict(config.get("task", {})), "task.")
  task = tasks.create(data, loop.seq_len, options)
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
  evaluate = _evaluator_options(config.get("evaluate", {}))
  evaluators.check(evaluation.evaluators, task, evaluate)

  optimizer = convert(optimizer_lib.OptimizerConfig, as_dict(config.optimizer), "optimizer.")
  schedule_cfg = convert(ScheduleConfig, as_dict(config.schedule), "schedule.")
  fields = dataclasses.asdict(schedule_cfg)
  fields["total_steps"] = fields["total_steps"] or loop.num_train_steps
  fields["d_model"] = fields["d_model"] or model.d_model
  try:
    schedule = schedules.create_schedule(**fields)
  except ValueError as e:
    raise ValueError(f"config.schedule: {e}") from None

  mesh = convert(MeshConfig, as_dict(config.get("mesh", {})), "mesh.")
  mesh_config.check(mesh, loop.parallelism, model)
  rules = mesh_config.rules(config.get("mesh_rules", {}))
  return Experiment(
    model=model,
    data=data,
    task=task,
    optimizer=optimizer,
    schedule=schedule,
    loop=loop,
    checkpoint=checkpoint,
    eval=evaluation,
    evaluate=evaluate,
    mesh=mesh,
    rules=rules,
    vocab_from_data=vocab_from_data,
    classes_from_data=classes_from_data,
    ema=ema,
    pretrained=pretrained,
    telemetry=telemetry,
    wandb=wandb,
    faults=faults,
  )


def _evaluator_options(blocks: Any) -> dict[str, Any]:
  """`config.evaluate`: each evaluator's block converted to its `Options`."""
  named = {n for n, cls in evaluators.EVALUATORS.items() if cls.Options is not NoOptions}
  for name in blocks:
    if name not in named:
      known = ", ".join(sorted(named))
      fail(f"evaluate.{name}", blocks[name], f"not an evaluator with options (those: {known})")
  return {
    name: convert(cls.Options, as_dict(blocks.get(name, {})), f"evaluate.{name}.")
    for name, cls in evaluators.EVALUATORS.items()
  }


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
    fail("model.vocab_size", model.vocab_size, f"must be >= the tokenizer's {vocab_size}{extra}")
  if num_classes and model.num_classes != num_classes:
    fail("model.num_classes", model.num_classes, f"the data has {num_classes} classes")
  return model
