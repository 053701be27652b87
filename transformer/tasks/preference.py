"""Preference tuning of a decoder on (prompt, chosen, rejected) pairs: DPO, robust DPO,
IPO, hinge (SLiC), SimPO and ORPO, each equal to TRL's (`preference_losses.py`).

A record holds TRL's three columns, read through `data.source='hf'` (JSONL, Parquet, a
Hub dataset):

- text: `prompt`, `chosen` and `rejected` strings; a completion is [BOS] prompt
  completion [EOS], scored on the completion and [EOS];
- conversations: `prompt` a list of {role, content} messages, `chosen` and `rejected`
  the assistant's reply (a list of messages, or a string taken as one assistant message);
  each side renders as a conversation through the checkpoint's chat template or the plain
  one (`tasks/sft.py`), scored on the assistant tokens after the prompt.

A completion's log-probability is the sum over its scored tokens. Each row holds one
pair, padded (never packed); the model scores both completions in one pass of 2B rows.

The frozen reference model (`config.task.reference`):

- '' (the default): the weights the run starts from, `config.init_from`, loaded once when
  the run is built (`Task.frozen`) and kept in the train state's `frozen` variables
  (checkpointed with the run, no optimizer state, never updated);
- '' with LoRA (`model.lora_rank > 0`): the base weights, the policy with its adapters
  off, read from the policy's own parameters (no second copy);
- a run's workdir or hf:DIR: that model, loaded as above.

SimPO and ORPO are reference-free and load none.

  config.task.loss_type        sigmoid (DPO), robust, ipo, hinge, simpo, orpo
  config.task.beta             > 0; the KL weight (DPO family), the reward scale (SimPO),
                               the odds-ratio weight (ORPO)
  config.task.label_smoothing  in [0, 0.5): conservative DPO (sigmoid), robust DPO, SimPO
  config.task.gamma            SimPO's target reward margin
  config.task.reference        above
  config.task.sft_weight       adds that times the mean NLL of the chosen tokens to a
                               DPO-family loss (TRL's loss_type [..., 'sft'], RPO)

Metrics, as TRL names them: rewards/chosen, rewards/rejected, rewards/margins,
rewards/accuracies (the share of pairs whose chosen reward is strictly higher),
logps/chosen, logps/rejected (means over pairs), and for ORPO nll_loss, log_odds_ratio
and log_odds_chosen. The loss and metrics are means over pairs. Evaluations score the
model with the reference that is at hand: the base weights under LoRA, none needed for
SimPO and ORPO; with a separate reference (not passed to evaluations) they score the
policy alone: the loss is the chosen completion's negative log-probability.

Batches [B, T] per side (chosen_*, rejected_*): inputs, targets, weights f32 (the scored
targets), segment_ids (1 on tokens, 0 on padding), positions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import numpy as np

from transformer.data import features, pipeline
from transformer.data.config import DataConfig, fail
from transformer.data.files import one_line
from transformer.data.hf_source import PREFERENCE_COLUMNS
from transformer.data.spec import DataContext, DataSpec
from transformer.nn import lora
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model, flops_per_token
from transformer.tasks import preference_losses as pl
from transformer.tasks import sft
from transformer.tasks.base import LoadFn, Task, token_labels
from transformer.tasks.lm import token_shapes

SIDES = ("chosen", "rejected")
FIELDS = ("inputs", "targets", "weights", "segment_ids", "positions")
KEYS = tuple(f"{side}_{f}" for side in SIDES for f in FIELDS)


@dataclasses.dataclass(frozen=True)
class PreferenceOptions:
  """`config.task.*` of the preference task (module docstring)."""

  loss_type: str = "sigmoid"
  beta: float = 0.1
  label_smoothing: float = 0.0
  gamma: float = 0.5  # SimPO's target margin (TRL's simpo_gamma)
  reference: str = ""  # '' = init_from (LoRA: the base weights); or a workdir, hf:DIR
  sft_weight: float = 0.0  # weight of the chosen tokens' mean NLL added (TRL's 'sft' loss)

  def __post_init__(self):
    if self.loss_type not in pl.LOSS_TYPES:
      fail("task.loss_type", self.loss_type, f"must be one of {', '.join(pl.LOSS_TYPES)}")
    if not (math.isfinite(self.beta) and self.beta > 0):
      fail("task.beta", self.beta, f"must be a number > 0 (loss_type {self.loss_type!r})")
    if not 0.0 <= self.label_smoothing < 0.5:
      fail("task.label_smoothing", self.label_smoothing, "must be in [0, 0.5)")
    if self.label_smoothing and self.loss_type not in pl.SMOOTHED:
      rule = f"loss_type {self.loss_type!r} has none; it applies to {', '.join(pl.SMOOTHED)}"
      fail("task.label_smoothing", self.label_smoothing, rule)
    if not (math.isfinite(self.gamma) and self.gamma >= 0):
      fail("task.gamma", self.gamma, "must be a number >= 0")
    if self.reference and self.loss_type in pl.REFERENCE_FREE:
      fail("task.reference", self.reference, f"loss_type {self.loss_type!r} has no reference")
    if not (math.isfinite(self.sft_weight) and self.sft_weight >= 0):
      fail("task.sft_weight", self.sft_weight, "must be a number >= 0")
    if self.sft_weight and self.loss_type in pl.REFERENCE_FREE:
      rule = f"adds to the DPO family's losses, not to loss_type {self.loss_type!r}"
      fail("task.sft_weight", self.sft_weight, rule)


def completion_ids(tok: Any, prompt: Any, completion: Any) -> tuple[np.ndarray, np.ndarray]:
  """(ids int32 [L], mask bool [L] of the completion's scored tokens) of one side."""
  if isinstance(prompt, str):
    if not isinstance(completion, str):
      raise ValueError("a text prompt takes text completions")
    head = [tok.bos_id, *tok.encode(prompt)]
    body = [*tok.encode(completion), tok.eos_id]
    return np.asarray(head + body, np.int32), np.arange(len(head) + len(body)) >= len(head)
  if isinstance(completion, str):
    completion = [{"role": "assistant", "content": completion}]
  ids, mask = sft.encode(tok, [*prompt, *completion])
  opening = np.asarray(sft.prompt_ids(tok, prompt), np.int32)[: len(ids)]
  differs = np.flatnonzero(ids[: len(opening)] != opening)
  shared = int(differs[0]) if len(differs) else len(opening)
  return ids, mask & (np.arange(len(ids)) >= shared)  # nothing of the prompt's turns


@dataclasses.dataclass(frozen=True)
class Pair(features.TextExample):
  """A record -> unpadded `<side>_inputs`, `<side>_targets`, `<side>_mask` per side (the
  columns are TRL's; `text_key` is unused)."""

  def __call__(self, item: tuple[int, Mapping[str, Any]]) -> dict[str, np.ndarray] | None:
    where = features.where(self.source_name, *item)
    prompt, chosen, rejected = (item[1][k] for k in PREFERENCE_COLUMNS)
    if chosen == rejected:
      raise ValueError(f"{where}: chosen and rejected are identical: {chosen!r:.80}")
    out = {}
    for side, completion in zip(SIDES, (chosen, rejected), strict=True):
      try:
        ids, mask = completion_ids(self.tokenizer, prompt, completion)
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{where}: {side}: {e}") from None
      if not mask.any():
        raise ValueError(f"{where}: the {side} completion has no assistant tokens to score")
      cut = self.fit(ids, self.seq_len + 1, item)
      if cut is None:
        return None
      out[f"{side}_inputs"], out[f"{side}_targets"] = cut[:-1], cut[1:]
      out[f"{side}_mask"] = mask[1 : len(cut)].astype(np.int32)
    return out


def batch_features(ex: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """A padded pair -> the batch keys of both sides."""
  out = {}
  for side in SIDES:
    out[f"{side}_inputs"] = ex[f"{side}_inputs"]
    out[f"{side}_targets"] = ex[f"{side}_targets"]
    out[f"{side}_weights"] = (ex[f"{side}_mask"] > 0).astype(np.float32)
    out[f"{side}_segment_ids"] = ex[f"{side}_inputs_segment_ids"]
    out[f"{side}_positions"] = ex[f"{side}_inputs_positions"]
  return out


def _build(c: DataContext, train: bool, rows: int) -> grain.IterDataset:
  b = dataclasses.replace(c.batching(train, rows), packed=False)  # one pair per row
  source = c.source(train)
  lengths = {f"{side}_{k}": c.seq_len for side in SIDES for k in ("inputs", "targets", "mask")}
  example = Pair(c.tok, c.seq_len, "", b.overlong, c.splits.name)
  ds = pipeline.to_rows(pipeline.examples(source, b).map(example), lengths, b)
  return pipeline.batches(ds.map(batch_features), len(source), b)


def _both(batch: Mapping[str, jax.Array], field: str) -> jax.Array:
  """The chosen rows then the rejected rows of `field`, [2B, T]."""
  return jnp.concatenate([batch[f"chosen_{field}"], batch[f"rejected_{field}"]], axis=0)


def completion_logps(model: Any, batch: Mapping[str, jax.Array], deterministic: bool) -> pl.Logps:
  """The summed log-probabilities of both sides' scored targets under `model` (a bound
  decoder, or a function of (inputs, positions, segment_ids, deterministic))."""
  logits = model(
    _both(batch, "inputs"), positions=_both(batch, "positions"),
    segment_ids=_both(batch, "segment_ids"), deterministic=deterministic,
  )  # fmt: skip
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [2B, T, V]
  targets, weights = _both(batch, "targets"), _both(batch, "weights")
  token = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [2B, T]
  sums = jnp.sum(jnp.where(weights > 0, token * weights, 0.0), axis=-1)
  counts = jnp.sum(weights, axis=-1)
  b = batch["chosen_inputs"].shape[0]
  return pl.Logps(sums[:b], sums[b:], counts[:b], counts[b:])


@dataclasses.dataclass(frozen=True)
class Preference(Task):
  name = "preference"
  families = ("decoder",)
  count_key = None
  prompts = True
  Options = PreferenceOptions

  reference_model: nn.Module | None = None  # built by `frozen`
  base_reference: bool = False  # the reference is the policy without its LoRA adapters

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    super().check(model, data)
    sft.check_records(data, "the preference task", "(prompt, chosen, rejected) records")

  def data_spec(self) -> DataSpec:
    return DataSpec(build=_build, shapes=token_shapes(KEYS), preference=True)

  def frozen(self, model: ModelConfig, load: LoadFn) -> tuple[Preference, Any]:
    """The reference model (module docstring): (this task with its reference model, the
    reference's parameters or None)."""
    o = self.options
    if o.loss_type in pl.REFERENCE_FREE:
      return self, None
    plain = dict(dropout_rate=0.0, attention_dropout_rate=0.0, dtype=model.dtype)
    if model.lora_rank and not o.reference:
      base = build_model(model.replace(lora_rank=0, **plain))
      return dataclasses.replace(self, reference_model=base, base_reference=True), None
    try:
      reference, params = load(o.reference)
    except (OSError, ValueError) as e:
      message = str(e) if str(e).startswith("config.") else one_line(e)
      raise ValueError(f"config.task.reference={o.reference!r}: {message}") from None
    if reference.family != "decoder" or reference.vocab_size != model.vocab_size:
      rule = f"is a {reference.family!r} model with {reference.vocab_size} ids; the policy is a "
      fail("task.reference", o.reference, f"{rule}decoder with {model.vocab_size}")
    built = build_model(reference.replace(**plain))
    return dataclasses.replace(self, reference_model=built), {"reference": params}

  def _reference(self, model: nn.Module, batch: Any, frozen: Any) -> pl.Logps | None:
    """The reference's log-probabilities of both sides, or None where there is none."""
    if self.base_reference:
      adapted = model.variables["params"]
      trained = lora.trains_base(model.config, adapted)
      if trained:  # the base weights change too: they are no reference
        rule = f"trains {trained[0]} beside the adapters; set config.task.reference"
        fail("model.lora_trainable", model.config.lora_trainable, rule)
      variables = {"params": jax.lax.stop_gradient(lora.without_adapters(adapted))}
    elif frozen is not None and self.reference_model is not None:
      variables = {"params": jax.lax.stop_gradient(frozen["reference"])}
    else:
      return None
    run = lambda *args, **kwargs: self.reference_model.apply(variables, *args, **kwargs)  # noqa: E731
    return completion_logps(run, batch, True)

  def loss(self, model, batch, deterministic, frozen):
    o = self.options
    policy = completion_logps(model, batch, deterministic)
    valid = (policy.chosen_tokens > 0) & (policy.rejected_tokens > 0)
    pairs = jnp.sum(valid.astype(jnp.float32))
    total = lambda x: jnp.sum(jnp.where(valid, x, 0.0))  # noqa: E731
    metrics = {"logps/chosen": total(policy.chosen), "logps/rejected": total(policy.rejected)}
    reference = None if o.loss_type in pl.REFERENCE_FREE else self._reference(model, batch, frozen)
    if reference is None and o.loss_type not in pl.REFERENCE_FREE:
      return total(-policy.chosen), pairs, metrics  # evaluation of the policy alone
    losses, chosen, rejected, extra = pl.pair_losses(
      o.loss_type, o.beta, o.label_smoothing, o.gamma, policy, reference
    )
    loss_sum = total(losses)
    if o.sft_weight:  # TRL's 'sft' term: the mean NLL of the batch's chosen tokens
      tokens = jnp.sum(jnp.where(valid, policy.chosen_tokens, 0.0))
      nll = total(-policy.chosen) / jnp.maximum(tokens, 1.0)
      loss_sum = loss_sum + o.sft_weight * nll * pairs
      metrics["sft_loss"] = nll * pairs
    metrics |= {
      "rewards/chosen": total(chosen),
      "rewards/rejected": total(rejected),
      "rewards/margins": total(chosen - rejected),
      "rewards/accuracies": total((chosen > rejected).astype(jnp.float32)),
      **{k: total(v) for k, v in extra.items()},
    }
    return loss_sum, pairs, metrics

  def init_args(self, batch):
    kwargs = {"positions": batch["chosen_positions"], "segment_ids": batch["chosen_segment_ids"]}
    return (batch["chosen_inputs"],), kwargs

  def count(self, batch) -> float:
    return float(sum(np.count_nonzero(np.asarray(batch[f"{s}_segment_ids"])) for s in SIDES))

  def flops_per_count(self, model, info) -> float:
    """A training pass (6 N per token) plus the reference's forward pass (2 N) where one
    runs."""
    training = flops_per_token(model, info.target_seq_len)
    return training * (1.0 if self.options.loss_type in pl.REFERENCE_FREE else 4.0 / 3.0)

  def attention_masks(self, batch):
    valid = np.asarray(batch["chosen_segment_ids"]) > 0
    return lambda name: (valid, valid)

  def attention_labels(self, batch, tokenizer):
    row = token_labels(batch["chosen_inputs"], tokenizer)
    return lambda name: (row, row)
