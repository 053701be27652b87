"""The task protocol: what differs between training objectives, behind one small class.

A task owns everything that depends on it: the model families that can run it, its batch
keys and shapes and the pipeline that builds them (`data_spec`), how a batch feeds the
model (`forward` -> logits, targets, weights), its objective (`loss` -> loss sum,
normalizer, metric sums; by default the cross-entropy of `forward`), the inputs `model.init`
needs, how tokens are counted for throughput, and the masks and labels attention analysis
reads. What a run measures beyond the loss belongs to the evaluators
(`transformer/evaluators`); a task names only its defaults (`evaluators`). Training,
evaluation and analysis code ask the task; they never branch on its name.

A new task is one file defining a `Task` subclass plus one entry in `tasks/__init__.py`.

Letters: B batch, T length, S source length, V vocabulary, C classes.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
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

  # The default (cross-entropy) loss's settings; keyword-only, so that subclasses' own
  # fields keep their positions.
  label_smoothing: float = dataclasses.field(default=0.0, kw_only=True)  # PyTorch's epsilon
  z_loss: float = dataclasses.field(default=0.0, kw_only=True)  # logsumexp(logits)^2 weight

  @classmethod
  def create(cls, data: DataConfig, seq_len: int) -> Task:
    """The task for a run's data settings (options derived from them go in fields)."""
    del data, seq_len
    return cls()

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
  def forward(
    self, model: nn.Module, batch: Batch, deterministic: bool
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(logits [B, T, V] or [B, C], targets [B, T] or [B], weights of the same shape), from
    `model` bound to its variables (called inside `apply` / `forward_with_aux`)."""

  def apply(
    self, model: nn.Module, variables: dict, batch: Batch, deterministic: bool = True,
    rngs: dict | None = None,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """`forward` with `model` bound to `variables` (`flax.linen.apply`)."""
    run = nn.apply(lambda bound, b: self.forward(bound, b, deterministic), model)
    return run(variables, batch, rngs=rngs or {})

  def forward_with_aux(
    self, model: nn.Module, variables: dict, batch: Batch, deterministic: bool, rngs: dict
  ) -> tuple[jax.Array, jax.Array, jax.Array, dict[str, jax.Array]]:
    """`apply`, plus the model's auxiliary losses, sown into `moe.AUX_COLLECTION` and read
    here, the one place that asks for them: the mixture-of-experts terms of
    `moe.aux_losses` ('loss', the weighted sum to add; the logged means), {} without MoE."""
    config = getattr(model, "config", None)
    if config is None or not config.moe_experts:
      return (*self.apply(model, variables, batch, deterministic, rngs), {})
    run = nn.apply(
      lambda bound, b: self.forward(bound, b, deterministic), model, mutable=[moe.AUX_COLLECTION]
    )
    (logits, targets, weights), state = run(variables, batch, rngs=rngs)
    return logits, targets, weights, moe.aux_losses(state.get(moe.AUX_COLLECTION, {}), config)

  def objective(
    self, loss_sum: jax.Array, weight_sum: jax.Array, aux: dict[str, jax.Array]
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The summed loss to differentiate, from the summed cross-entropy of the weighted
    positions and `forward_with_aux`'s auxiliary means; and the auxiliary sums to log
    (name -> sum, each logged as its mean). Default: the cross-entropy plus the auxiliary
    'loss' (the MoE terms), each mean weighted by the pass's `weight_sum`."""
    sums = {k: v * weight_sum for k, v in aux.items()}
    if "loss" in sums:
      loss_sum = loss_sum + sums.pop("loss")
    return loss_sum, sums

  def loss(
    self, model: nn.Module, variables: dict, batch: Batch, deterministic: bool, rngs: dict
  ) -> Loss:
    """(loss_sum, normalizer, metric sums) of one (micro-)batch, float32 scalars: the loss
    summed over what the task averages over (tokens, pairs, sequences, images), that
    count, and the sums behind its logged metrics (name -> sum). The step sums all three
    over micro-batches, devices and hosts, differentiates the loss sum, divides the
    gradients by the global normalizer and logs each metric as sum / normalizer (and a
    `nll` also as its `perplexity`). `variables` holds 'params', and 'frozen' in training
    steps only (evaluation scores the model alone).

    Default: the cross-entropy of `forward_with_aux` with this task's label smoothing and
    z-loss, plus `objective`'s auxiliary terms, over the weighted positions; its metrics
    are `accuracy`, `nll`, `normalized_loss` (0 for a model matching the smoothed
    targets) and the auxiliary means."""
    logits, targets, weights, aux = self.forward_with_aux(
      model, variables, batch, deterministic, rngs
    )
    ce_sum, weight_sum, extra = losses.cross_entropy_with_label_smoothing(
      logits, targets, weights, self.label_smoothing, self.z_loss
    )
    correct, _ = losses.accuracy_sum(logits, targets, weights)
    loss_sum, aux_sums = self.objective(ce_sum, weight_sum, aux)
    metrics = {
      "accuracy": correct,
      "nll": extra["nll_sum"],
      "normalized_loss": loss_sum - extra["normalizing_offset"] * weight_sum,
      **aux_sums,  # e.g. moe_balance_loss, moe_router_z_loss
    }
    return loss_sum, weight_sum, metrics

  def frozen(self, model: ModelConfig, load: LoadFn) -> tuple[Task, Any]:
    """(this task, variables it reads but never trains, e.g. a distillation teacher's
    parameters, or None). Called once where a run is built, with the run's final model
    config and `load(source) -> (ModelConfig, params)` for a run's workdir or `hf:DIR`; the
    variables are kept in the train state (checkpointed, no optimizer state) and reach
    `forward` as `variables['frozen']` in training steps. Default: none."""
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
