"""The task protocol: what differs between training objectives, behind one small class.

A task owns everything that depends on it: the model families that can run it, its batch
keys and shapes and the pipeline that builds them (`data_spec`), how a batch feeds the
model and what it is scored by (`loss` -> loss sum, normalizer, metric sums; the
cross-entropy tasks score `forward`'s logits, targets and weights with `cross_entropy`),
the inputs `model.init` needs, how tokens are counted for throughput, and the masks and
labels attention analysis reads. What a run measures beyond the loss belongs to the evaluators
(`transformer/evaluators`); a task names only its defaults (`evaluators`). Training,
evaluation and analysis code ask the task; they never branch on its name.

A task's settings are its `Options`, a frozen dataclass that a config sets as
`config.task.FIELD` (`CrossEntropyOptions` by default: label smoothing and z-loss). A new
task is one file defining a `Task` subclass (and its `Options`, if it has settings) plus
one entry in `tasks/__init__.py`; a new objective defines `loss` (tests/test_objective.py
registers a pairwise one with an option of its own).

Letters: B batch, T length, S source length, V vocabulary, C classes.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.data.config import IMAGE_SOURCES, DataConfig, fail
from transformer.data.datasets import DataInfo
from transformer.data.spec import DataSpec
from transformer.nn import models, moe
from transformer.nn.config import ModelConfig
from transformer.tasks import losses

Batch = Mapping[str, jax.Array]
# What `Task.loss` returns: (loss_sum, normalizer, metric name -> sum), float32 scalars.
Loss = tuple[jax.Array, jax.Array, dict[str, jax.Array]]
# Names the step logs itself; a task's metric sums take others.
STEP_METRICS = frozenset(
  ("loss", "normalizer", "perplexity", "grad_norm", "param_norm", "update_norm")
  + ("learning_rate", "nonfinite_inputs", "tokens_per_sec", "examples_per_sec", "mfu")
)
# name -> (valid queries [B, T] bool, valid keys [B, S] bool), or (None, None) for all valid
MaskFn = Callable[[str], tuple[np.ndarray | None, np.ndarray | None]]


# name -> (query labels, key labels) of the first row, None where unlabelled
LabelFn = Callable[[str], tuple[list[str] | None, list[str] | None]]

# source (a run's workdir or hf:DIR) -> (its ModelConfig, its parameters)
LoadFn = Callable[[str], tuple[ModelConfig, Any]]


def token_labels(ids: np.ndarray, tokenizer: Any) -> list[str]:
  """The first row's tokens as text, one label per position ('·' for an empty piece)."""
  return [tokenizer.decode([int(i)]) or "·" for i in np.asarray(ids)[0]]


def token_batch(tokenizer: Any, text: str, max_len: int) -> dict[str, np.ndarray]:
  """A one-row batch of `text` (every token-model key) for attention analysis."""
  tokens = np.asarray(tokenizer.encode(text), np.int32)[None, :max_len]  # [1, T]
  if tokens.shape[1] == 0:
    raise ValueError(f"text {text!r} encodes to no tokens")
  ones = np.ones_like(tokens)
  return {
    "inputs": tokens,
    "targets": tokens,
    "positions": np.arange(tokens.shape[1], dtype=np.int32)[None],
    "segment_ids": ones,
    "weights": ones.astype(np.float32),
    "label": np.zeros((1,), np.int32),
  }


@dataclasses.dataclass(frozen=True)
class CrossEntropyOptions:
  """`config.task.*` of a cross-entropy task (`Task.cross_entropy`)."""

  label_smoothing: float = 0.0  # PyTorch's epsilon of the cross-entropy, in [0, 1)
  z_loss: float = 0.0  # coefficient of logsumexp(logits)^2 (PaLM z-loss); 0 = off

  def __post_init__(self):
    if not 0.0 <= self.label_smoothing < 1.0:
      fail("task.label_smoothing", self.label_smoothing, "must be in [0, 1)")
    if not 0.0 <= self.z_loss < float("inf"):
      fail("task.z_loss", self.z_loss, "must be a finite number >= 0")


@dataclasses.dataclass
class Run:
  """A model with its parameters and the data it is evaluated on (what evaluators read)."""

  model: nn.Module
  params: Any
  info: DataInfo
  eval_factory: Callable[[], Iterator[dict[str, np.ndarray]]]
  eval_batches: int  # batches per evaluation; 0 = the whole split
  workdir: str
  step: int


@dataclasses.dataclass(frozen=True)
class Task(abc.ABC):
  """A training objective. Subclasses are frozen dataclasses (hashable: the step is
  compiled with the task as a static argument); they define `data_spec`, `forward` and
  `init_args`, and override the rest where the task differs: an objective other than the
  cross-entropy overrides `loss`."""

  name: ClassVar[str] = ""
  families: ClassVar[tuple[str, ...]] = ()  # model families that can run this task
  count_key: ClassVar[str | None] = "segment_ids"  # tokens/s counts its entries > 0; None: rows
  extra_vocab: ClassVar[int] = 0  # ids the task adds above the tokenizer's (e.g. sentinels)
  images: ClassVar[bool] = False  # batches hold images (no tokenizer)
  prompts: ClassVar[bool] = False  # its model continues text (the 'sample' evaluator)
  evaluators: ClassVar[tuple[str, ...]] = ()  # run when the config names none (evaluators/)

  # The task's settings (`config.task.*`): a frozen dataclass with a default for each field.
  Options: ClassVar[type] = CrossEntropyOptions
  # This task's `Options` (None = their defaults); keyword-only, so that subclasses' own
  # fields keep their positions.
  options: Any = dataclasses.field(default=None, kw_only=True)

  def __post_init__(self):
    if self.options is None:
      object.__setattr__(self, "options", self.Options())
    elif not isinstance(self.options, self.Options):
      raise TypeError(f"task {self.name!r} takes {self.Options.__name__}, not {self.options!r}")

  @classmethod
  def create(cls, data: DataConfig, seq_len: int, options: Any = None) -> Task:
    """The task for a run: its `options` (None = the defaults) and what the data settings
    imply (derived fields)."""
    del data, seq_len
    return cls(options=options)

  # Configuration -------------------------------------------------------------------------

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    """Raises `ValueError` (one line naming the field) for settings this task cannot run."""
    if model.family not in self.families:
      fail("data.kind", data.kind, f"needs model.family {' or '.join(self.families)}, "
           f"not {model.family!r}")  # fmt: skip
    if not self.images and data.source in IMAGE_SOURCES:
      fail("data.source", data.source, f"holds images, but data.kind {self.name!r} reads text")
    if self.images != (data.tokenizer == "none"):
      rule = "must be 'none' for image tasks" if self.images else "the task reads text: not 'none'"
      fail("data.tokenizer", data.tokenizer, rule)

  @abc.abstractmethod
  def data_spec(self) -> DataSpec:
    """The task's batches: keys, shapes and the pipeline that builds them."""

  # The step ------------------------------------------------------------------------------

  @abc.abstractmethod
  def loss(self, model: nn.Module, batch: Batch, deterministic: bool, frozen: Any) -> Loss:
    """(loss_sum, normalizer, metric sums) of one (micro-)batch, float32 scalars: the loss
    summed over what the task averages over (tokens, pairs, sequences, images), that
    count, and the sums behind its logged metrics (name -> sum). The step sums all three
    over micro-batches, devices and hosts, differentiates the loss sum, divides the
    gradients by the global normalizer and logs each metric as sum / normalizer (a `nll`
    also as its `perplexity`). `model` is bound to its parameters (and the dropout rng);
    `frozen` holds the variables of `Task.frozen` in training steps, None in evaluations
    (which score the model alone). A cross-entropy task returns
    `self.cross_entropy(*self.forward(model, batch, deterministic))`."""

  def forward(
    self, model: nn.Module, batch: Batch, deterministic: bool
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(logits [B, T, V] or [B, C], targets [B, T] or [B], weights of the same shape), from
    `model` bound to its variables: what a cross-entropy task scores, and what `apply`
    gives analysis and the evaluators. Tasks without such logits have none."""
    del model, batch, deterministic
    raise ValueError(f"task {self.name!r} has no forward pass to (logits, targets, weights)")

  def apply(
    self, model: nn.Module, variables: dict, batch: Batch, deterministic: bool = True,
    rngs: dict | None = None,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """`forward` with `model` bound to `variables` (`flax.linen.apply`)."""
    run = nn.apply(lambda bound, b: self.forward(bound, b, deterministic), model)
    return run(variables, batch, rngs=rngs or {})

  def cross_entropy(self, logits: jax.Array, targets: jax.Array, weights: jax.Array) -> Loss:
    """`losses.cross_entropy` with the label smoothing and z-loss of this task's options
    (`CrossEntropyOptions`): the loss of a cross-entropy task, with its `accuracy`, `nll`
    and `normalized_loss`."""
    o = self.options
    return losses.cross_entropy(logits, targets, weights, o.label_smoothing, o.z_loss)

  def objective(
    self, model: nn.Module, variables: dict, batch: Batch, deterministic: bool, rngs: dict
  ) -> Loss:
    """What the step optimises: `loss` with `model` bound to `variables['params']` (and
    `variables['frozen']` passed as `frozen`), checked while the step is traced, plus the
    model's auxiliary losses, sown into `moe.AUX_COLLECTION` and read here, the one place
    that asks for them: a mixture-of-experts model's weighted balance and router z-losses
    (`moe.aux_losses`, means over this pass) times the pass's normalizer, added to the
    loss sum, and their means logged. The task never sees them."""
    frozen = variables.get("frozen")
    run = lambda bound, b: self.loss(bound, b, deterministic, frozen)  # noqa: E731
    params = {"params": variables["params"]}
    config = getattr(model, "config", None)
    if config is None or not config.moe_experts:
      return self._checked(*nn.apply(run, model)(params, batch, rngs=rngs))
    out, state = nn.apply(run, model, mutable=[moe.AUX_COLLECTION])(params, batch, rngs=rngs)
    loss_sum, normalizer, metrics = self._checked(*out)
    aux = moe.aux_losses(state.get(moe.AUX_COLLECTION, {}), config)
    sums = {k: v * normalizer for k, v in aux.items()}
    if "loss" in sums:  # none when nothing was sown
      loss_sum = loss_sum + sums.pop("loss")
    return loss_sum, normalizer, {**metrics, **sums}

  def _checked(self, loss_sum: Any, normalizer: Any, metrics: Any) -> Loss:
    """`loss`'s triple as float32, refused in one line naming the task unless each part is
    a scalar and no metric takes a name the step logs itself (shapes are known when the
    step is traced: before any update)."""
    if not isinstance(metrics, Mapping):
      rule = f"returns a dict of metric sums third, not {type(metrics).__name__}"
      raise ValueError(f"task {self.name!r}: Task.loss {rule}")
    taken = sorted(set(metrics) & STEP_METRICS)
    if taken:
      raise ValueError(f"task {self.name!r}: metric names {taken} are the step's own")
    out = []
    for what, value in (("loss_sum", loss_sum), ("normalizer", normalizer), *metrics.items()):
      shape = getattr(value, "shape", ())
      if shape != ():
        rule = "Task.loss returns scalars (sums over the batch)"
        raise ValueError(f"task {self.name!r}: its loss gave {what} of shape {shape}; {rule}")
      out.append(jnp.asarray(value, jnp.float32))
    return out[0], out[1], dict(zip(metrics, out[2:], strict=True))

  def frozen(self, model: ModelConfig, load: LoadFn) -> tuple[Task, Any]:
    """(this task, variables it reads but never trains, e.g. a distillation teacher's
    parameters, or None). Called once where a run is built, with the run's final model
    config and `load(source) -> (ModelConfig, params)` for a run's workdir or `hf:DIR`
    ('': the run's `init_from`); the variables are kept in the train state (checkpointed,
    no optimizer state) and reach `loss` as `frozen` in training steps. Default: none."""
    del model, load
    return self, None

  @abc.abstractmethod
  def init_args(self, batch: Batch) -> tuple[tuple, dict]:
    """Positional and keyword arguments of `model.init` for a batch of this task."""

  def check_batch(self, batch: Mapping[str, np.ndarray]) -> None:  # noqa: B027 (a hook)
    """Host-side check of a batch before it is placed on the devices (default: none)."""

  def count(self, batch: Mapping[str, np.ndarray]) -> float:
    """Tokens (or examples) the batch contributes to the throughput figures."""
    if self.count_key is None:
      return float(len(next(iter(batch.values()))))
    return float(np.count_nonzero(np.asarray(batch[self.count_key]) > 0))

  def flops_per_count(self, model: ModelConfig, info: DataInfo) -> float:
    """Training matmul FLOPs (forward + backward) per unit `count` counts, for MFU: per
    token of rows of `info.target_seq_len` tokens (the target side for seq2seq)."""
    return models.flops_per_token(model, info.target_seq_len)

  # Analysis ------------------------------------------------------------------------------

  def attention_masks(self, batch: Mapping[str, np.ndarray]) -> MaskFn:
    """Valid queries and keys of each attention module (by module name) for a batch."""
    valid = np.asarray(batch["segment_ids"]) > 0
    return lambda name: (valid, valid)

  def attention_labels(self, batch: Mapping[str, np.ndarray], tokenizer: Any) -> LabelFn:
    """Token labels of the first row's queries and keys, per attention module (heatmaps)."""
    row = token_labels(batch["inputs"], tokenizer)
    return lambda name: (row, row)

  def text_batch(self, tokenizer: Any, text: str, max_len: int) -> dict[str, np.ndarray]:
    """A one-row batch of `text` for attention analysis."""
    del tokenizer, max_len
    raise ValueError(f"text input is for token models (lm, mlm, classification); not {text!r} "
                     f"for task {self.name!r}")  # fmt: skip
