"""Mixture-of-experts feed-forward: a router sends every token to its top-k of E experts.

Letters: B batch, T length, D model dim, F expert hidden dim, E experts, K experts per
token (top-k), C slots per expert and row (capacity), A = B*T*K token-expert assignments,
I and O a projection's input and output dims.

Routing (`route`), in float32 whatever the compute dtype: logits = x W_r (W_r [D, E], no
bias), p = softmax(logits), the K largest p (ties: the lower expert index). By default
(`moe_norm_topk=None`), with K = 1 the gate is p itself (Switch Transformer, Fedus et al.
2022: a gate of 1 would give the router no gradient); with K > 1 the K probabilities are
renormalised to sum to 1, as Mixtral does (softmax, then top-k, then renormalise; GShard
normalises its top-2 the same way). `moe_norm_topk` True / False renormalises always /
never (Qwen3-MoE's `norm_topk_prob`). Each token's output is sum_k gate_k *
expert_{e_k}(x); a dropped assignment contributes nothing and the other gates are not
renormalised (the token's residual carries it through, as in GShard and Switch). Padding
tokens (segment id 0) are routed nowhere: they take no capacity, get output 0 and are left
out of the auxiliary losses.

Two ways to run the experts:

- capacity (`moe_capacity_factor` = f): each row (one sequence of T tokens) is a group
  (GShard's G = B) with C = ceil(f * K * T / E) slots per expert. Slots are handed out in
  GShard's order: first every token's top-1 choice in position order t = 0..T-1, then
  every top-2 choice in position order, and so on; an assignment finding its expert's C
  slots taken is dropped. Experts run as dense einsums over [B, E, C, D].
- dropless (`moe_capacity_factor=None`): every assignment is computed. The A assignments
  are sorted by expert and both expert matmuls are one `jax.lax.ragged_dot` each (a
  grouped matmul over the sorted rows, group sizes = tokens per expert), then scattered
  back onto their tokens.

Auxiliary losses, over the non-padding tokens of one forward pass, sown into the
`AUX_COLLECTION` collection and summed over layers by `aux_losses`:

- load balance (Switch, eq. 4): E * sum_i f_i P_i, f_i = the fraction of the N*K
  assignments (N tokens) that chose expert i before any capacity drop, P_i = the mean
  router probability of expert i. 1 when routing is uniform, E at total collapse. (For
  K > 1 this is Hugging Face Mixtral's `load_balancing_loss_func` divided by K.)
- router z-loss (ST-MoE, Zoph et al. 2022, eq. 5): mean over tokens of logsumexp(logits)^2.

Under a mesh, expert weights are split over the 'expert' axis (`partitioning`); see
docs/SCALING.md for what the compiler does with the tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from transformer.nn import tree
from transformer.nn.config import ModelConfig
from transformer.nn.layers import ACTIVATIONS, FeedForward, make_dense, make_dropout
from transformer.nn.partitioning import constrain

AUX_COLLECTION = "aux_loss"  # the collection the MoE layers sow their losses into
BALANCE, Z_LOSS = "balance_loss", "router_z_loss"

# Each expert's kernel is xavier-uniform over its own [fan_in, fan_out] (axis 0 = experts).
EXPERT_INIT = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", batch_axis=(0,))
ROUTER_INIT = nn.initializers.xavier_uniform()


def route(
  logits: jax.Array,
  k: int,
  normalise: bool | None = None,
  *,
  sigmoid: bool = False,
  bias: jax.Array | None = None,
  groups: int = 1,
  top_groups: int = 1,
  scale: float = 1.0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(distribution [..., E], chosen experts [..., K] int32, gates [..., K]) of float32
  router logits [..., E]; `normalise` is `moe_norm_topk` (see the module docstring). The
  distribution, for the balance loss, is the softmax, or the sigmoid scores normalised to
  sum to 1 (DeepSeek-V3's sequence-wise balance loss).

  DeepSeek-V3's router (`moe_router='sigmoid'`): the scores are sigmoid(logits); the choice
  ranks scores + `bias` ([E], `moe_selection_bias`, no gradient), among the experts of the
  `top_groups` of `groups` equal groups whose two best biased scores sum highest; the gates
  are the chosen experts' unbiased scores (renormalised with `normalise`, over their sum +
  1e-20), times `scale` (`moe_routed_scale`)."""
  scores = jax.nn.sigmoid(logits) if sigmoid else jax.nn.softmax(logits, axis=-1)  # [..., E]
  choice = scores if bias is None else scores + lax.stop_gradient(bias)  # [..., E]
  if groups > 1:  # group-limited: the experts of the best top_groups groups only
    grouped = choice.reshape(*choice.shape[:-1], groups, -1)  # [..., G, E/G]
    best = jnp.sum(lax.top_k(grouped, 2)[0], axis=-1)  # [..., G]
    kept = jnp.sum(jax.nn.one_hot(lax.top_k(best, top_groups)[1], groups), axis=-2) > 0
    choice = jnp.where(kept[..., None], grouped, -jnp.inf).reshape(choice.shape)  # [..., E]
  experts = lax.top_k(choice, k)[1]  # [..., K]; ties: the lower expert index
  top = jnp.take_along_axis(scores, experts, axis=-1)  # [..., K]
  normalise = k > 1 if normalise is None else normalise
  if normalise:
    top = top / (jnp.sum(top, axis=-1, keepdims=True) + (1e-20 if sigmoid else 0.0))
  gates = top * scale if scale != 1 else top  # [..., K]
  if sigmoid:
    scores = scores / jnp.sum(scores, axis=-1, keepdims=True)  # [..., E]
  return scores, experts.astype(jnp.int32), gates


def balance_loss(probs: jax.Array, experts: jax.Array, valid: jax.Array) -> jax.Array:
  """Switch load-balancing loss E * sum_i f_i P_i over the valid tokens.

  probs [..., E], experts [..., K] (the top-k choices), valid [...] bool -> scalar.
  """
  e, k = probs.shape[-1], experts.shape[-1]
  w = valid.astype(jnp.float32)  # [...]
  tokens = jnp.maximum(jnp.sum(w), 1.0)
  chosen = jnp.sum(jax.nn.one_hot(experts, e, dtype=jnp.float32), axis=-2)  # [..., E]
  f = jnp.sum(chosen * w[..., None], axis=tuple(range(w.ndim))) / (tokens * k)  # [E]
  p = jnp.sum(probs * w[..., None], axis=tuple(range(w.ndim))) / tokens  # [E]
  return e * jnp.sum(f * p)


def router_z_loss(logits: jax.Array, valid: jax.Array) -> jax.Array:
  """ST-MoE router z-loss: mean over valid tokens of logsumexp(logits)^2. [..., E] -> scalar."""
  w = valid.astype(jnp.float32)
  z = jax.nn.logsumexp(logits, axis=-1)  # [...]
  return jnp.sum(w * z**2) / jnp.maximum(jnp.sum(w), 1.0)


def capacity(config: ModelConfig, length: int) -> int:
  """Slots per expert and row of `length` tokens: ceil(f * K * T / E), at least 1."""
  c = config
  return max(1, math.ceil(c.moe_capacity_factor * c.moe_top_k * length / c.moe_experts))


def assign_slots(
  experts: jax.Array, valid: jax.Array, num_experts: int, slots: int
) -> tuple[jax.Array, jax.Array]:
  """(slot [B, T, K] int32, kept [B, T, K] bool) of each assignment in its expert's row
  buffer, handed out in GShard's order: top-1 choices by position, then top-2, ...

  experts [B, T, K] int32, valid [B, T] bool (padding takes no slot).
  """
  b, t, k = experts.shape
  onehot = jax.nn.one_hot(experts, num_experts, dtype=jnp.int32)  # [B, T, K, E]
  onehot = onehot * valid[:, :, None, None].astype(jnp.int32)
  ordered = jnp.swapaxes(onehot, 1, 2).reshape(b, k * t, num_experts)  # [B, K*T, E] choice-major
  taken = jnp.cumsum(ordered, axis=1) - ordered  # [B, K*T, E] slots taken before this one
  slot = jnp.sum(taken * ordered, axis=-1).reshape(b, k, t)  # [B, K, T]
  slot = jnp.swapaxes(slot, 1, 2)  # [B, T, K]
  return slot, valid[:, :, None] & (slot < slots)


class _ExpertWeights(nn.Module):
  """The E experts' copies of one projection: kernel [E, fan_in, fan_out], bias [E, fan_out]."""

  experts: int
  fan_in: int
  fan_out: int
  use_bias: bool

  @nn.compact
  def __call__(self) -> tuple[jax.Array, jax.Array | None]:
    kernel = self.param("kernel", EXPERT_INIT, (self.experts, self.fan_in, self.fan_out))
    bias = None
    if self.use_bias:
      bias = self.param("bias", nn.initializers.zeros, (self.experts, self.fan_out))
    return kernel, bias


class _Router(nn.Module):
  """The router's float32 kernel [D, E], and with `selection_bias` DeepSeek-V3's bias [E]
  on the scores for the choice only (zeros; `route` stops its gradient, and being a bias
  it takes no weight decay)."""

  d_model: int
  experts: int
  selection_bias: bool = False

  @nn.compact
  def __call__(self) -> tuple[jax.Array, jax.Array | None]:
    kernel = self.param("kernel", ROUTER_INIT, (self.d_model, self.experts))
    if not self.selection_bias:
      return kernel, None
    return kernel, self.param("bias", nn.initializers.zeros, (self.experts,))


class MoEFeedForward(nn.Module):
  """A router and E feed-forward experts (each the `FeedForward` of `layers.py`), plus a
  shared expert every token goes through with `moe_shared_d_ff` (gated with
  `moe_shared_gate`; not routed, no capacity; padding tokens still get 0).

  Parameters: router/kernel [D, E]; wi (wi_0 and wi_1 for GLU activations) kernel
  [E, D, F] (+ bias [E, F]); wo kernel [E, F, D] (+ bias [E, D]). Dropout on the experts'
  hidden activations uses `config.dropout_rate`, as in `FeedForward`.
  """

  config: ModelConfig

  @nn.compact
  def __call__(
    self, x: jax.Array, valid: jax.Array | None = None, deterministic: bool = True
  ) -> jax.Array:
    """x [B, T, D], valid [B, T] bool (False = padding; None = all valid) -> [B, T, D]."""
    c = self.config
    e, k = c.moe_experts, c.moe_top_k
    valid = jnp.ones(x.shape[:2], bool) if valid is None else valid.astype(bool)  # [B, T]
    router, bias = _Router(c.d_model, e, c.moe_selection_bias, name="router")()  # [D, E], [E]
    logits = jnp.einsum(
      "BTD,DE->BTE", x.astype(jnp.float32), router, precision=lax.Precision.HIGHEST
    )  # [B, T, E]
    probs, experts, gates = route(  # [B, T, E], [B, T, K], [B, T, K]
      logits,
      k,
      c.moe_norm_topk,
      sigmoid=c.moe_router == "sigmoid",
      bias=bias,
      groups=c.moe_groups,
      top_groups=c.moe_top_groups,
      scale=c.moe_routed_scale,
    )
    gates = gates * valid[..., None]  # [B, T, K]
    self.sow(AUX_COLLECTION, BALANCE, balance_loss(probs, experts, valid))
    self.sow(AUX_COLLECTION, Z_LOSS, router_z_loss(logits, valid))

    def weights(name, fan_in, fan_out):
      kernel, bias = _ExpertWeights(e, fan_in, fan_out, c.use_bias, name=name)()
      dtype = jnp.dtype(c.dtype)
      return kernel.astype(dtype), None if bias is None else bias.astype(dtype)

    names = ("wi_0", "wi_1") if c.gated else ("wi",)
    ffn = _ExpertFFN(
      c,
      w_in=tuple(weights(n, c.d_model, c.expert_d_ff) for n in names),
      w_out=weights("wo", c.expert_d_ff, c.d_model),
      dropout=functools.partial(make_dropout(c), deterministic=deterministic),
    )
    if c.moe_capacity_factor is None:
      y = _dropless(c, ffn, x, experts, gates)  # [B, T, D]
    else:
      y = _with_capacity(c, ffn, x, experts, gates, valid)  # [B, T, D]
    if not c.moe_shared_d_ff:
      return y
    return y + self._shared(x, deterministic) * valid[..., None].astype(y.dtype)  # [B, T, D]

  def _shared(self, x: jax.Array, deterministic: bool) -> jax.Array:
    """The shared expert, a `FeedForward` of width `moe_shared_d_ff` ('shared_ffn'), its
    output times sigmoid(x w) with `moe_shared_gate` ('shared_gate', w [D, 1]). [B, T, D]."""
    c = self.config
    h = FeedForward(c.replace(d_ff=c.moe_shared_d_ff), name="shared_ffn")(x, deterministic)
    if c.moe_shared_gate:
      gate = make_dense(c, 1, "shared_gate", use_bias=False)(x)  # [B, T, 1]
      h = h * nn.sigmoid(gate)
    return h


@dataclasses.dataclass(frozen=True)
class _ExpertFFN:
  """The experts' feed-forward on inputs already grouped by expert, for a given matmul:
  matmul(h, kernel, bias) applies one projection of every row's own expert."""

  config: ModelConfig
  w_in: tuple[tuple[jax.Array, jax.Array | None], ...]  # (kernel, bias) of wi or wi_0, wi_1
  w_out: tuple[jax.Array, jax.Array | None]  # (kernel, bias) of wo
  dropout: Any  # h -> h with the config's dropout (or none when deterministic)

  def __call__(self, matmul, inputs: jax.Array) -> jax.Array:
    act = ACTIVATIONS[self.config.activation]
    h = act(matmul(inputs, *self.w_in[0]))  # [..., F]
    if self.config.gated:
      h = h * matmul(inputs, *self.w_in[1])  # [..., F]
    return matmul(self.dropout(h), *self.w_out)  # [..., D]


def _with_capacity(c: ModelConfig, ffn: _ExpertFFN, x, experts, gates, valid) -> jax.Array:
  """Capacity routing: dispatch to [B, E, C, D], dense expert einsums, combine."""
  dtype = jnp.dtype(c.dtype)
  slots = capacity(c, x.shape[1])
  slot, kept = assign_slots(experts, valid, c.moe_experts, slots)  # [B, T, K] each
  to_expert = jax.nn.one_hot(experts, c.moe_experts, dtype=dtype)  # [B, T, K, E]
  to_slot = jax.nn.one_hot(slot, slots, dtype=dtype) * kept[..., None]  # [B, T, K, C]
  dispatch = jnp.einsum("BTKE,BTKC->BTEC", to_expert, to_slot)  # [B, T, E, C] 0 / 1
  combine = jnp.einsum("BTKE,BTKC,BTK->BTEC", to_expert, to_slot, gates.astype(dtype))
  inputs = jnp.einsum("BTEC,BTD->BECD", dispatch, x.astype(dtype))  # [B, E, C, D]
  # The experts' work is laid out by expert: rows over the data axes, experts over 'expert'.
  layout = ("expert_batch", "expert", None, "embed")
  inputs = constrain(inputs, layout)  # [B, E, C, D]

  def matmul(h, kernel, bias):
    y = jnp.einsum("BECI,EIO->BECO", h, kernel)  # [B, E, C, O]
    return y if bias is None else y + bias[None, :, None]

  out = constrain(ffn(matmul, inputs), layout)  # [B, E, C, D]
  return jnp.einsum("BTEC,BECD->BTD", combine, out)  # [B, T, D]


def _dropless(c: ModelConfig, ffn: _ExpertFFN, x, experts, gates) -> jax.Array:
  """Every assignment computed: sort by expert, `ragged_dot` matmuls, scatter back."""
  dtype = jnp.dtype(c.dtype)
  b, t, d = x.shape
  k = experts.shape[-1]
  flat = experts.reshape(-1)  # [A] expert of assignment (token, choice), token-major
  order = jnp.argsort(flat, stable=True)  # [A] the assignments grouped by expert
  owner = order // k  # [A] token of each sorted assignment
  by_expert = flat[order]  # [A] expert of each sorted assignment
  sizes = jnp.bincount(flat, length=c.moe_experts).astype(jnp.int32)  # [E]
  rows = x.reshape(b * t, d).astype(dtype)[owner]  # [A, D]

  def matmul(h, kernel, bias):
    y = lax.ragged_dot(h, kernel, sizes)  # [A, O]
    return y if bias is None else y + bias[by_expert]

  out = ffn(matmul, rows) * gates.reshape(-1)[order][:, None].astype(dtype)  # [A, D]
  y = jnp.zeros((b * t, d), dtype).at[owner].add(out)  # [B*T, D]
  return y.reshape(b, t, d)


def aux_losses(collection: Any, config: ModelConfig) -> dict[str, jax.Array]:
  """The MoE losses sown in one forward pass (`AUX_COLLECTION` state), summed over layers.

  Returns {'loss': moe_balance_loss * sum_l balance_l + moe_router_z_loss * sum_l z_l,
  'moe_balance_loss': mean_l balance_l, 'moe_router_z_loss': mean_l z_l} (the means are
  what is logged), or {} when nothing was sown.
  """
  totals: dict[str, list[jax.Array]] = {BALANCE: [], Z_LOSS: []}
  for path, leaf in jax.tree_util.tree_leaves_with_path(collection):
    names = tree.path_names(path)
    for name, values in totals.items():
      if name in names:
        values.append(jnp.ravel(leaf))  # one value per layer ([layers] when scanned)
  if not totals[BALANCE]:
    return {}
  balance = jnp.concatenate(totals[BALANCE])  # [layers]
  z = jnp.concatenate(totals[Z_LOSS])  # [layers]
  loss = config.moe_balance_loss * jnp.sum(balance) + config.moe_router_z_loss * jnp.sum(z)
  return {"loss": loss, "moe_balance_loss": jnp.mean(balance), "moe_router_z_loss": jnp.mean(z)}
