"""Preference losses of (chosen, rejected) pairs, as TRL 1.16 computes them.

Each takes the log-probabilities of the two completions under the policy (and, for the
DPO family, under the frozen reference), summed over the completion tokens, with the
completions' token counts, and returns per-pair losses and rewards. With
d = (policy_c - ref_c) - (policy_r - ref_r), beta and label smoothing ls:

  sigmoid  DPO (Rafailov et al. 2023): -logsig(beta d); with ls > 0 conservative DPO
           (cDPO): -(1 - ls) logsig(beta d) - ls logsig(-beta d)
  robust   robust DPO (Chowdhury et al. 2024): (-(1 - ls) logsig(beta d)
           + ls logsig(-beta d)) / (1 - 2 ls)
  hinge    SLiC (Zhao et al. 2023): relu(1 - beta d)
  ipo      IPO (Azar et al. 2023), each log-ratio averaged over its completion's tokens:
           (ratio_c / n_c - ratio_r / n_r - 1 / (2 beta))^2
  simpo    SimPO (Meng et al. 2024), reference-free, on the token-averaged log-probs
           a_c, a_r: z = (a_c - a_r) - gamma / beta, -(1 - ls) logsig(beta z) - ls logsig(-beta z)
  orpo     ORPO (Hong et al. 2024), reference-free: -a_c (the chosen completion's mean NLL)
           - beta logsig(log_odds), log_odds = (a_c - a_r) - (log(1 - e^a_c) - log(1 - e^a_r))

Rewards are beta (policy - ref) of each completion for the DPO family (TRL's
`DPOTrainer`), beta a_c and beta a_r for SimPO and ORPO (TRL's `CPOTrainer` and
`ORPOTrainer`). tests/test_preference.py checks every loss against TRL's own code.

Letters: B pairs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

LOSS_TYPES = ("sigmoid", "robust", "ipo", "hinge", "simpo", "orpo")
REFERENCE_FREE = ("simpo", "orpo")  # losses of the policy alone
SMOOTHED = ("sigmoid", "robust", "simpo")  # losses that read label_smoothing


@dataclasses.dataclass(frozen=True)
class Logps:
  """Summed completion log-probabilities of each pair's two completions, and their token
  counts, [B] each."""

  chosen: jax.Array
  rejected: jax.Array
  chosen_tokens: jax.Array
  rejected_tokens: jax.Array

  def means(self) -> tuple[jax.Array, jax.Array]:
    """The log-probabilities averaged over each completion's tokens."""
    return (
      self.chosen / jnp.maximum(self.chosen_tokens, 1.0),
      self.rejected / jnp.maximum(self.rejected_tokens, 1.0),
    )


def _smoothed(logits: jax.Array, label_smoothing: float) -> jax.Array:
  """-(1 - ls) logsig(logits) - ls logsig(-logits)."""
  ls = label_smoothing
  return -(1.0 - ls) * jax.nn.log_sigmoid(logits) - ls * jax.nn.log_sigmoid(-logits)


def log1mexp(x: jax.Array) -> jax.Array:
  """log(1 - e^x) for x < 0, accurate near 0 and far from it (x = 0 taken as the tiniest
  negative number, so that a certain completion gives a finite value)."""
  x = jnp.minimum(x, -jnp.finfo(x.dtype).tiny)
  return jnp.where(x > -jnp.log(2.0), jnp.log(-jnp.expm1(x)), jnp.log1p(-jnp.exp(x)))


def pair_losses(
  loss_type: str,
  beta: float,
  label_smoothing: float,
  gamma: float,
  policy: Logps,
  reference: Logps | None,
) -> tuple[jax.Array, jax.Array, jax.Array, dict[str, jax.Array]]:
  """(losses, chosen rewards, rejected rewards, other per-pair metrics), [B] each; the
  reference is None for the reference-free losses (module docstring)."""
  ls = label_smoothing
  if loss_type in REFERENCE_FREE:
    a_c, a_r = policy.means()
    chosen_rewards, rejected_rewards = beta * a_c, beta * a_r
    if loss_type == "simpo":
      z = (a_c - a_r) - gamma / beta
      return _smoothed(beta * z, ls), chosen_rewards, rejected_rewards, {}
    log_odds = (a_c - a_r) - (log1mexp(a_c) - log1mexp(a_r))
    ratio = jax.nn.log_sigmoid(log_odds)
    extra = {"nll_loss": -a_c, "log_odds_ratio": ratio, "log_odds_chosen": log_odds}
    return -a_c - beta * ratio, chosen_rewards, rejected_rewards, extra
  if reference is None:
    raise ValueError(f"loss_type {loss_type!r} needs the reference's log-probabilities")
  ratio_c, ratio_r = policy.chosen - reference.chosen, policy.rejected - reference.rejected
  d = ratio_c - ratio_r
  if loss_type == "sigmoid":
    losses = _smoothed(beta * d, ls)
  elif loss_type == "robust":
    clean = -(1.0 - ls) * jax.nn.log_sigmoid(beta * d)
    flipped = -ls * jax.nn.log_sigmoid(-beta * d)
    losses = (clean - flipped) / (1.0 - 2.0 * ls)
  elif loss_type == "hinge":
    losses = jax.nn.relu(1.0 - beta * d)
  elif loss_type == "ipo":
    n_c, n_r = jnp.maximum(policy.chosen_tokens, 1.0), jnp.maximum(policy.rejected_tokens, 1.0)
    losses = (ratio_c / n_c - ratio_r / n_r - 1.0 / (2.0 * beta)) ** 2
  else:
    raise ValueError(f"loss_type {loss_type!r}: must be one of {', '.join(LOSS_TYPES)}")
  return losses, beta * ratio_c, beta * ratio_r, {}
