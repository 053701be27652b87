"""Token selection: logit filters (top-k, top-p), temperature sampling, greedy argmax.

Letters: B batch, V vocabulary. Every option may be traced (a jitted caller does not
recompile when it changes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
  "Sampling",
  "Select",
  "argmax",
  "checked",
  "filter_logits",
  "sample",
  "selector",
  "top_k_filter",
  "top_p_filter",
]

Select = Callable[[jax.Array, jax.Array], jax.Array]  # (logits [B, V], step i) -> [B]

# Top-k with top-p off and every k <= one of these widths takes its threshold from
# `lax.top_k` of the smallest such width instead of sorting all V logits (on XLA:CPU a
# full sort of a batch of logits is far slower than a narrow `lax.top_k`).
FAST_TOP_K_WIDTHS = (64, 256)
FAST_TOP_K = FAST_TOP_K_WIDTHS[-1]


class Sampling(NamedTuple):
  """Sampling options of `generate`, `translate`, `generate_sliding` and the jitted loops;
  all traced, so new values do not recompile.

  Step i draws with `fold_in(rng, i)`: temperature > 0, then top_k (0 = off), then
  top_p (1 = off). A loop given `sampling=None` is greedy.
  """

  rng: jax.Array | None  # None only with temperature 0 (greedy)
  temperature: float | jax.Array = 1.0
  top_k: int | jax.Array = 0
  top_p: float | jax.Array = 1.0


def checked(method: str, sampling: Sampling | None) -> Sampling | None:
  """The sampling a decoding with `method` runs: for 'sample', `sampling` after checking
  its options (ValueError naming the bad one), None when its temperature is 0 (greedy);
  None for any other method."""
  if method != "sample":
    return None
  if sampling is None:
    raise ValueError("method='sample' needs sampling=Sampling(rng, temperature, top_k, top_p)")
  t, k, p = sampling.temperature, sampling.top_k, sampling.top_p
  if t < 0:
    raise ValueError(f"temperature={t} must be >= 0")
  if k < 0 or not 0.0 < p <= 1.0:
    raise ValueError(f"top_k={k} must be >= 0 and top_p={p} in (0, 1]")
  if sampling.rng is None and t > 0:
    raise ValueError("method='sample' needs Sampling.rng (a jax PRNG key)")
  return None if t == 0 else sampling


def unwrap(params: Any) -> Any:
  """The parameter tree of `params` or of {'params': params}."""
  return params["params"] if isinstance(params, dict) and set(params) == {"params"} else params


def top_k_filter(logits: jax.Array, k: int | jax.Array) -> jax.Array:
  """Keeps the k largest logits of each row [..., V]; the rest become -inf.

  k: a scalar or one per row [...]; k <= 0 or k >= V keeps everything. Ties: every logit
  equal to the k-th largest is kept, so more than k may survive. k may be traced.
  """
  k = _k_or_all(k, logits.shape[-1])
  kth = _kth(-jnp.sort(-logits, axis=-1), k)  # of the logits in descending order
  return jnp.where(logits >= kth, logits, -jnp.inf)


def top_p_filter(logits: jax.Array, p: float | jax.Array) -> jax.Array:
  """Nucleus filter: keeps the smallest set of most probable tokens whose mass reaches p.

  logits: [..., V]; the rest become -inf. p: a scalar or one per row [...]. The most
  probable token is always kept; p >= 1 keeps everything. Ties: every token whose logit
  equals the smallest kept logit is kept, so the result does not depend on the order of
  tied tokens. p may be traced.
  """
  return _top_p_of_sorted(logits, -jnp.sort(-logits, axis=-1), p)


def _top_p_of_sorted(logits: jax.Array, ordered: jax.Array, p: float | jax.Array) -> jax.Array:
  """`top_p_filter(logits, p)` given `ordered`, the logits sorted in descending order."""
  v = logits.shape[-1]
  probs = jax.nn.softmax(ordered, axis=-1)  # [..., V]
  mass_before = jnp.cumsum(probs, axis=-1) - probs  # [..., V] mass of the better tokens
  p = jnp.asarray(p)[..., None]  # [..., 1]
  count = jnp.sum(mass_before < p, axis=-1)  # [...] tokens needed to reach p (>= 1)
  count = jnp.where(p[..., 0] >= 1.0, v, jnp.maximum(count, 1))
  threshold = jnp.take_along_axis(ordered, (count - 1)[..., None], -1)  # [..., 1]
  return jnp.where(logits >= threshold, logits, -jnp.inf)


def sample(
  logits: jax.Array,
  rng: jax.Array,
  temperature: float | jax.Array,
  top_k: int | jax.Array,
  top_p: float | jax.Array,
) -> jax.Array:
  """One token id per row, logits [B, V] -> [B]: temperature (> 0), then top-k, then top-p.

  A draw from `filter_logits(logits / temperature, top_k, top_p)`. Top-k alone, with every
  k <= a width of FAST_TOP_K_WIDTHS, draws among that width's `lax.top_k` candidates
  instead of over all V logits: the same distribution (the same logits are kept), not the
  same draws, and no [B, V] of random bits (docs/PERFORMANCE.md, "Decoding"). Where more
  logits tie with a row's k-th
  largest than the width holds, the draw is over all V.
  """
  x = logits / temperature
  k, widths, branch = _plan(x.shape[-1], top_k, top_p)

  def over_all(y):  # filter_logits takes the same branch
    return jax.random.categorical(rng, filter_logits(y, top_k, top_p), axis=-1)

  def among(width):
    def f(y):
      values, ids = jax.lax.top_k(y, width)  # [B, width] descending
      kth = _kth(values, k)  # [B, 1]

      def from_candidates(_):
        pick = jax.random.categorical(rng, jnp.where(values >= kth, values, -jnp.inf), axis=-1)
        return jnp.take_along_axis(ids, pick[..., None], -1)[..., 0]

      fits = jnp.all(jnp.sum(y >= kth, axis=-1) <= width)  # no kept logit past the width
      return jax.lax.cond(fits, from_candidates, lambda _: over_all(y), None)

    return f

  return jax.lax.switch(branch, [over_all, *map(among, widths), over_all], x)


def _plan(v: int, top_k: int | jax.Array, top_p: float | jax.Array):
  """(k with 0 and > V as V, the fast widths below V, the branch): 0 both filters off,
  n top-k alone within widths[n - 1], len(widths) + 1 a sort."""
  k = _k_or_all(top_k, v)
  widths = [w for w in FAST_TOP_K_WIDTHS if w < v]
  branch = len(widths) + 1  # sort
  for n, w in reversed(list(enumerate(widths, 1))):
    branch = jnp.where(jnp.all(k <= w), n, branch)
  sort = jnp.any(jnp.asarray(top_p) < 1.0)
  branch = jnp.where(sort, len(widths) + 1, jnp.where(jnp.any(k < v), branch, 0))
  return k, widths, branch


def _k_or_all(k: int | jax.Array, v: int) -> jax.Array:
  """int32 k, with k <= 0 or k > V (keep everything) as V."""
  k = jnp.asarray(k, jnp.int32)
  return jnp.where((k <= 0) | (k > v), v, k)


def _kth(ordered: jax.Array, k: jax.Array) -> jax.Array:
  """[..., 1] the k-th largest logit of each row, given its logits in descending order."""
  return jnp.take_along_axis(ordered, jnp.broadcast_to(k - 1, ordered.shape[:-1])[..., None], -1)


def filter_logits(logits: jax.Array, top_k: int | jax.Array, top_p: float | jax.Array):
  """`top_p_filter(top_k_filter(logits, top_k), top_p)`, the same values, sorting the
  vocabulary only where it must, and then once: both off returns the logits; top-k alone
  with every k <= a width of FAST_TOP_K_WIDTHS reads its threshold from `lax.top_k`.
  Only the taken branch runs."""
  k, widths, branch = _plan(logits.shape[-1], top_k, top_p)

  def k_only(width):
    def f(x):
      kth = _kth(jax.lax.top_k(x, width)[0], k)  # [..., width] descending
      return jnp.where(x >= kth, x, -jnp.inf)

    return f

  def sort_once(x):
    ordered = -jnp.sort(-x, axis=-1)  # [..., V] descending
    kth = _kth(ordered, k)
    kept = lambda y: jnp.where(y >= kth, y, -jnp.inf)  # kept(ordered) = sort of kept(x)
    return _top_p_of_sorted(kept(x), kept(ordered), jnp.asarray(top_p))

  return jax.lax.switch(branch, [lambda x: x, *map(k_only, widths), sort_once], logits)


def argmax(logits: jax.Array) -> jax.Array:
  """`jnp.argmax(logits, -1)` (the first maximum; a NaN counts as the maximum), [..., V]
  -> int32 [...], as two plain reductions: XLA:CPU runs argmax's paired (value, index)
  reduction much slower (docs/PERFORMANCE.md, "Decoding")."""
  v = logits.shape[-1]
  hit = (logits == logits.max(axis=-1, keepdims=True)) | jnp.isnan(logits)  # [..., V]
  return jnp.min(jnp.where(hit, jnp.arange(v, dtype=jnp.int32), v), axis=-1)


def selector(sampling: Sampling | None) -> Select:
  """`select(logits [B, V], i) -> [B]`: argmax if `sampling` is None, else step i's draw."""
  if sampling is None:
    return lambda logits, i: argmax(logits)
  rng, temperature, top_k, top_p = sampling
  return lambda logits, i: sample(logits, jax.random.fold_in(rng, i), temperature, top_k, top_p)
