"""The optimizer: AdamW (default), SGD, Adafactor, Lion or Muon, with a weight-decay mask
and clipping.

`create_optimizer(config_block, schedule, params)` returns one optax
`GradientTransformation`:

  clip_by_global_norm(clip_norm)      (only when clip_norm > 0)
  -> adamw(schedule, b1, b2, eps, weight_decay, mask=decay_mask)   (or the `kind` chosen)

AdamW is decoupled weight decay as in PyTorch `torch.optim.AdamW` (Loshchilov & Hutter
2019): p <- p - lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p), with the decay
scaled by the scheduled learning rate and applied only where the mask is True.

Lion (Chen et al. 2023, `optax.lion`): c = b1 m + (1 - b1) g, p <- p - lr (sign(c) +
weight_decay p) (decay where the mask is True), m <- b2 m + (1 - b2) g. It shares b1 / b2
with AdamW; the paper's defaults are b1 = 0.9, b2 = 0.99, with a learning rate 3-10x
smaller and a weight decay 3-10x larger than AdamW's.

Muon (Jordan et al. 2024, modded-nanogpt) for the hidden weight matrices, AdamW (the
fields above, the same decay mask) for everything else, as its authors prescribe: the
embeddings, the output head / classifier, norms and biases go to AdamW. A Muon update is
  m <- beta m + (1 - beta) g; m_hat = the Nesterov / plain bias-corrected momentum;
  O = NewtonSchulz5(m_hat) (quintic coefficients (3.4445, -4.7750, 2.0315) on
      m_hat / (||m_hat||_F + 1e-8), `optax.contrib.scale_by_muon`);
  p <- p - lr_muon (s O + weight_decay p),  lr_muon = muon_lr_scale * lr,
with the shape scale s = sqrt(max(1, fan_out / fan_in)) (Jordan's width scaling, optax's
default) or, with muon_consistent_rms = r > 0, s = r sqrt(max(fan_in, fan_out)) (Liu et
al. 2025, "Muon is scalable": r = 0.2 matches AdamW's update RMS, so one learning rate
serves both). Which parameters are matrices, and how (`muon.MUON_MATRICES`): the attention
projections are DenseGeneral kernels, query / key / value [D, N, H] and out [N, H, D];
each is orthogonalised as the one matrix D x (N H) (resp. (N H) x D) it is, as Muon
implementations do for fused or separate q / k / v projections, not head by head. The
FFN kernels [D, F] / [F, D] and the encoder's hidden mlm_transform / pooler [D, D] are
plain matrices. Leading axes beyond a kernel's own (the 'layers' axis of `nn.scan`) are
batch axes: each layer's matrix is orthogonalised on its own. optax.contrib.muon's own
Adam arm shares Muon's eps and Nesterov flag and has no decay mask, so the two arms are
composed here (`optax.partition`) from `optax.contrib.scale_by_muon` and our AdamW.

The mask is decided from parameter *path names*, never shapes, so it is the same for
`nn.scan`-stacked layers (an extra leading layer axis) as for unrolled ones. A leaf is
not decayed when its own name is `bias` or `scale` (norm gains), when any module on its
path has `norm` in its name (any case: LayerNorm_0, RMSNorm, final_norm), or, unless
`decay_embeddings`, when its own name contains `embedding` (token, learned position and
relative-position embedding tables; a ViT patch-embedding conv `kernel` is decayed).

`create_optimizer(..., trainable=mask)` freezes the parameters whose mask entry is False
(LoRA: `nn.lora.trainable`): `optax.multi_transform` gives them `optax.set_to_zero()` (no
update, no optimizer state) and the rest the chain above, clipping included.

Everything is float32: the parameters (master weights) must be float32 and the moments
are kept float32, whatever the compute dtype. Gradient accumulation is done by the
train step (one `update` per accumulated batch), not here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax.core import meta
from optax import contrib

from transformer.nn import tree
from transformer.train import muon, schedules

KINDS = ("adamw", "sgd", "adafactor", "lion", "muon")

# Muon's matrices: a `kernel` of one of these modules -> how many of its own leading axes
# are the matrix's input (fan-in) side; its remaining own axes are the output side. The
# kernel's own rank is `len(shape)` of the unstacked layer (3 for the attention
# DenseGeneral kernels, 2 for dense ones); axes before those (nn.scan's 'layers') are
# batch axes. Every other parameter goes to AdamW.


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """The optimizer block of an experiment config. Invalid values raise `ValueError`."""

  kind: str = "adamw"  # adamw | sgd | adafactor | lion | muon (AdamW for non-matrices)
  b1: float = 0.9  # adamw first-moment decay; lion: interpolation of the update's sign
  b2: float = 0.98  # adamw second-moment decay (Vaswani et al. 2017); lion: momentum decay
  eps: float = 1e-9  # adamw denominator epsilon, outside the sqrt
  weight_decay: float = 0.0  # decoupled decay coefficient (multiplied by the learning rate)
  clip_norm: float = 0.0  # clip gradients to this global L2 norm; 0 = no clipping
  decay_embeddings: bool = False  # also decay embedding tables
  momentum: float = 0.9  # sgd momentum (0 = plain sgd)
  nesterov: bool = False  # sgd Nesterov momentum
  muon_beta: float = 0.95  # muon momentum decay (Jordan et al. 2024)
  muon_nesterov: bool = True  # muon Nesterov momentum
  muon_ns_steps: int = 5  # muon Newton-Schulz iterations
  muon_lr_scale: float = 1.0  # muon matrices' learning rate = schedule * this (AdamW: schedule)
  muon_consistent_rms: float = 0.0  # 0: scale sqrt(max(1, fan_out/fan_in)); r > 0: Liu et
  # al. 2025, r * sqrt(max(fan_in, fan_out)) (0.2 matches AdamW's update RMS)

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind must be one of {list(KINDS)}; got {self.kind!r}")
    for name, lo, hi in (
      ("b1", 0.0, 1.0),
      ("b2", 0.0, 1.0),
      ("momentum", 0.0, 1.0),
      ("muon_beta", 0.0, 1.0),
    ):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value < hi:
        raise ValueError(f"{name} must be a number in [{lo}, {hi}); got {value!r}")
    if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or self.eps <= 0:
      raise ValueError(f"eps must be a number > 0; got {self.eps!r}")
    for name in ("weight_decay", "clip_norm", "muon_consistent_rms"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0 (0 = off); got {value!r}")
    scale = self.muon_lr_scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
      raise ValueError(f"muon_lr_scale must be a finite number > 0; got {scale!r}")
    steps = self.muon_ns_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
      raise ValueError(f"muon_ns_steps must be an int >= 1; got {steps!r}")
    for name in ("decay_embeddings", "nesterov", "muon_nesterov"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"{name} must be a bool; got {getattr(self, name)!r}")


DEFAULTS: dict[str, Any] = dataclasses.asdict(OptimizerConfig())  # field -> default


def decay_mask(params: Any, decay_embeddings: bool = False) -> Any:
  """True where weight decay applies, from path names (see module docstring).

  Args:
    params: a parameter pytree (arrays, `jax.ShapeDtypeStruct`s, or flax
      `nn.Partitioned` boxes, whose `value` gets the box's decision).
    decay_embeddings: also decay leaves whose name contains `embedding`.

  Returns:
    A pytree of bools with the structure of `params`.
  """

  def decide(path: tuple[Any, ...], leaf: Any) -> Any:
    decay = _decays(tree.path_names(path), decay_embeddings)
    if isinstance(leaf, meta.AxisMetadata):
      return jax.tree.map(lambda _: decay, leaf)
    return decay

  return jax.tree_util.tree_map_with_path(
    decide, params, is_leaf=lambda x: isinstance(x, meta.AxisMetadata)
  )


def _adamw(cfg: OptimizerConfig, schedule, mask_fn) -> optax.GradientTransformation:
  return optax.adamw(
    schedule,
    b1=cfg.b1,
    b2=cfg.b2,
    eps=cfg.eps,
    mu_dtype=jnp.float32,
    weight_decay=cfg.weight_decay,
    mask=mask_fn,
  )


def _sgd(cfg: OptimizerConfig, schedule, mask_fn) -> optax.GradientTransformation:
  """Weight decay as an L2 gradient term, as torch.optim.SGD."""
  return optax.chain(
    optax.add_decayed_weights(cfg.weight_decay, mask=mask_fn),
    optax.sgd(
      schedule, momentum=cfg.momentum or None, nesterov=cfg.nesterov, accumulator_dtype=jnp.float32
    ),
  )


def _adafactor(cfg: OptimizerConfig, schedule, mask_fn) -> optax.GradientTransformation:
  """optax's Adafactor: its decay is not scaled by the learning rate."""
  return optax.adafactor(
    schedule, weight_decay_rate=cfg.weight_decay or None, weight_decay_mask=mask_fn
  )


def _lion(cfg: OptimizerConfig, schedule, mask_fn) -> optax.GradientTransformation:
  """optax's Lion: decoupled decay scaled by the learning rate, where the mask is True."""
  return optax.lion(
    schedule,
    b1=cfg.b1,
    b2=cfg.b2,
    mu_dtype=jnp.float32,
    weight_decay=cfg.weight_decay,
    mask=mask_fn,
  )


def _muon(cfg: OptimizerConfig, schedule, mask_fn) -> optax.GradientTransformation:
  """Muon on `muon.MUON_MATRICES`, our AdamW on the rest (see the module docstring)."""
  if callable(schedule):
    muon_lr = lambda count: cfg.muon_lr_scale * schedule(count)
  else:
    muon_lr = cfg.muon_lr_scale * schedule
  matrices = optax.chain(
    contrib.scale_by_muon(
      ns_steps=cfg.muon_ns_steps,
      beta=cfg.muon_beta,
      mu_dtype=jnp.float32,
      nesterov=cfg.muon_nesterov,
      weight_dimension_numbers=muon.dimension_numbers,
    ),
    muon.scale_by_shape(cfg.muon_consistent_rms),
    optax.add_decayed_weights(cfg.weight_decay, mask=mask_fn),
    optax.scale_by_learning_rate(muon_lr),
  )
  return optax.partition(
    {"muon": matrices, "adam": _adamw(cfg, schedule, mask_fn)}, param_labels=muon.labels
  )


# kind -> (config, schedule, decay mask function) -> the optimizer before clipping
_OPTIMIZERS = {
  "adamw": _adamw,
  "sgd": _sgd,
  "adafactor": _adafactor,
  "lion": _lion,
  "muon": _muon,
}


def create_optimizer(
  config_block: Mapping[str, Any] | Any,
  schedule: schedules.Schedule | float,
  params: Any,
  *,
  trainable: Any = None,
) -> optax.GradientTransformation:
  """Builds the optimizer described by `config_block` (see `DEFAULTS` for its fields).

  Args:
    config_block: a dict or `ml_collections.ConfigDict` with fields from `DEFAULTS`
      (missing ones take the default).
    schedule: learning rate as a function of the optimizer count (`schedules`), or a
      constant float.
    params: the parameter pytree the optimizer will update (arrays or
      `jax.ShapeDtypeStruct`s): used to validate that master weights are float32 and that
      the weight-decay mask covers something when weight_decay > 0.
    trainable: None (every parameter trains) or a pytree of bools like `params`: the
      False leaves are frozen (zero updates, no optimizer state; clipping sees only the
      True ones). LoRA passes `nn.lora.trainable(config, params)`.

  Raises:
    ValueError: naming the field, for an unknown field or kind, an out-of-range value,
      a non-float32 parameter (naming its path), or Muon for params without matrices.
  """
  cfg = read_block(config_block)
  _check_params(params)
  if not callable(schedule) and not (
    isinstance(schedule, (int, float)) and not isinstance(schedule, bool) and schedule > 0
  ):
    raise ValueError(f"schedule must be callable (count -> lr) or a number > 0; got {schedule!r}")
  mask_fn = lambda p: decay_mask(p, cfg.decay_embeddings)
  if cfg.weight_decay > 0 and not any(jax.tree.leaves(mask_fn(params))):
    raise ValueError("weight_decay > 0 but the decay mask excludes every parameter of params")

  if cfg.kind == "muon" and "muon" not in jax.tree.leaves(muon.labels(params)):
    raise ValueError(
      "optimizer.kind='muon': the model has no hidden weight matrices (attention or "
      f"feed-forward kernels, {sorted(muon.MUON_MATRICES)}) for Muon; use kind='adamw'"
    )
  tx = _OPTIMIZERS[cfg.kind](cfg, schedule, mask_fn)
  if cfg.clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)
  if trainable is not None:  # frozen leaves: optax.set_to_zero, the rest as configured
    if not any(jax.tree.leaves(trainable)):
      raise ValueError("trainable: every parameter is frozen, nothing would train")
    labels = jax.tree.map(lambda t: "train" if t else "frozen", trainable)
    tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
  return tx


def current_learning_rate(schedule: schedules.Schedule | float, step: Any) -> jax.Array:
  """The learning rate of the update applied at train-state step `step` (for logging).

  The update that takes the state from step `s` to `s + 1` uses `schedule(s)`; works
  inside `jax.jit` (traced `step`) and on the host (`float(...)` the result).
  """
  if callable(schedule):
    return jnp.asarray(schedule(step), jnp.float32)
  return jnp.asarray(schedule, jnp.float32)


def _decays(names: tuple[str, ...], decay_embeddings: bool) -> bool:
  if not names:
    return True
  leaf = names[-1]
  if leaf in ("bias", "scale"):
    return False
  if any("norm" in n.lower() for n in names[:-1]):
    return False
  return decay_embeddings or "embedding" not in leaf


def read_block(block: Any) -> OptimizerConfig:
  """The `OptimizerConfig` of a config block (mapping or ConfigDict; missing fields take
  their defaults; fields of a schedule block, `schedules.FIELDS`, may sit in it and are
  ignored). Raises ValueError naming the field, for an unknown field or a bad value."""
  if isinstance(block, OptimizerConfig):
    return block
  if hasattr(block, "to_dict"):
    block = block.to_dict()
  if not isinstance(block, Mapping):
    raise ValueError(f"config_block must be a mapping or ConfigDict; got {type(block).__name__}")
  unknown = sorted(set(block) - set(DEFAULTS) - set(schedules.FIELDS))
  if unknown:
    raise ValueError(f"unknown optimizer field(s) {unknown}; expected a subset of {list(DEFAULTS)}")
  fields = {k: v for k, v in block.items() if k in DEFAULTS}
  for name in ("weight_decay", "clip_norm"):  # None means off
    if name in fields and fields[name] is None:
      fields[name] = 0.0
  return OptimizerConfig(**fields)


def _check_params(params: Any) -> None:
  leaves = jax.tree_util.tree_leaves_with_path(params)
  if not leaves:
    raise ValueError("params must be a non-empty pytree of arrays")
  for path, leaf in leaves:
    dtype = getattr(leaf, "dtype", None)
    if dtype != jnp.float32:
      raise ValueError(
        f"params must be float32 master weights; {jax.tree_util.keystr(path)} has dtype {dtype}"
      )
