"""The order task: can one attention layer tell which of two vectors comes first?

A sequence of L noise vectors holds two fixed vectors, A and B, at two distinct random
positions; the label is 1 when A comes before B. Self-attention without position
information is permutation-equivariant and mean pooling is permutation-invariant, so the
classifier sees the same input for "A then B" and "B then A": without positions its
accuracy is chance, exactly (in expectation). Sinusoidal positions added to the inputs
(Vaswani et al. 2017, section 3.5) make the task solvable by one layer.

  python -m transformer.research.order_task [--steps 300] [--seed 0]

prints the test accuracy of each position variant (chance without positions;
docs/RESEARCH.md).

Letters: B batch, L sequence length, E input vector size, D model dim.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from transformer.nn.blocks import Stack
from transformer.nn.config import ModelConfig
from transformer.nn.masks import MaskInfo
from transformer.nn.positions import sinusoidal_table

POSITIONS = ("none", "sinusoidal", "rope")  # rope: applied inside attention, for comparison


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """The data, the model sizes and the training run."""

  length: int = 8  # L vectors per sequence
  input_dim: int = 16  # E: size of each vector
  noise: float = 1.0  # std of the filler vectors (A and B have N(0, 1) entries)
  jitter: float = 0.1  # std of the noise added to A and B in each example
  d_model: int = 32  # D
  num_heads: int = 4  # attention heads
  d_ff: int = 64  # feed-forward width
  num_layers: int = 1  # blocks
  batch_size: int = 128  # examples per update
  steps: int = 300  # updates
  learning_rate: float = 3e-3  # Adam, constant after 10% warmup
  eval_examples: int = 4096  # fresh test examples
  seed: int = 0  # seeds A, B, the data, the parameters

  def model_config(self, position: str) -> ModelConfig:
    """The block's config; `position` is 'none', 'sinusoidal' (added to inputs) or 'rope'."""
    if position not in POSITIONS:
      raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    return ModelConfig(
      family="encoder", vocab_size=1, d_model=self.d_model, num_heads=self.num_heads,
      num_layers=self.num_layers, d_ff=self.d_ff, max_len=self.length, position=position,
    )  # fmt: skip


def make_batch(
  key: jax.Array, a: jax.Array, b: jax.Array, cfg: TaskConfig, batch_size: int
) -> tuple[jax.Array, jax.Array]:
  """x [B, L, E] float32 (noise with A and B at two distinct positions), label [B] int32.

  label = 1 where A's position is smaller than B's; both orders are equally likely.
  """
  k_noise, k_pos, k_jitter = jax.random.split(key, 3)
  shape = (batch_size, cfg.length, cfg.input_dim)
  x = cfg.noise * jax.random.normal(k_noise, shape)  # [B, L, E]
  order = jnp.argsort(jax.random.uniform(k_pos, (batch_size, cfg.length)), axis=-1)  # [B, L]
  pos_a, pos_b = order[:, 0], order[:, 1]  # [B] distinct positions
  jitter = cfg.jitter * jax.random.normal(k_jitter, (2, batch_size, cfg.input_dim))  # [2, B, E]
  rows = jnp.arange(batch_size)
  x = x.at[rows, pos_a].set(a + jitter[0]).at[rows, pos_b].set(b + jitter[1])
  return x, (pos_a < pos_b).astype(jnp.int32)


class OrderClassifier(nn.Module):
  """Input projection, optional sinusoidal positions, `Stack` of blocks, mean pool, 2 logits."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [B, L, E] -> float32 logits [B, 2]."""
    c = self.config
    h = nn.Dense(c.d_model, name="input_proj")(x)  # [B, L, D]
    if c.position == "sinusoidal":
      h = h + jnp.asarray(sinusoidal_table(x.shape[1], c.d_model))[None]  # [B, L, D]
    info = MaskInfo.create(jnp.ones(x.shape[:2], jnp.int32))  # one segment, no padding
    h = Stack(c, c.num_layers, name="encoder")(h, info)  # [B, L, D]
    return nn.Dense(2, name="head")(h.mean(axis=1))  # [B, 2]


@functools.partial(jax.jit, static_argnames=("cfg", "position"))
def train_and_test(cfg: TaskConfig, position: str) -> tuple[jax.Array, jax.Array]:
  """Trains one variant from scratch (one compiled scan) -> (test accuracy, final loss)."""
  model = OrderClassifier(cfg.model_config(position))
  k_ab, k_init, k_train, k_test = jax.random.split(jax.random.PRNGKey(cfg.seed), 4)
  a, b = jax.random.normal(k_ab, (2, cfg.input_dim))  # [E] each
  x0, _ = make_batch(k_init, a, b, cfg, 2)
  params = model.init(k_init, x0)["params"]
  schedule = optax.linear_schedule(0.0, cfg.learning_rate, max(1, cfg.steps // 10))
  tx = optax.adam(schedule)

  def loss_fn(p, x, y):
    logits = model.apply({"params": p}, x)  # [B, 2]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  def step(carry, key):
    p, opt_state = carry
    x, y = make_batch(key, a, b, cfg, cfg.batch_size)
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    updates, opt_state = tx.update(grads, opt_state, p)
    return (optax.apply_updates(p, updates), opt_state), loss

  keys = jax.random.split(k_train, cfg.steps)
  (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), keys)
  x, y = make_batch(k_test, a, b, cfg, cfg.eval_examples)
  accuracy = jnp.mean(jnp.argmax(model.apply({"params": params}, x), -1) == y)
  return accuracy, losses[-1]


def main(argv: list[str] | None = None) -> dict[str, float]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=TaskConfig.steps, help="updates per variant")
  parser.add_argument("--seed", type=int, default=TaskConfig.seed, help="seed of everything")
  parser.add_argument("--positions", nargs="+", default=["none", "sinusoidal"], choices=POSITIONS)
  args = parser.parse_args(argv)
  cfg = TaskConfig(steps=args.steps, seed=args.seed)
  print(f"order task: L={cfg.length}, {cfg.steps} steps of {cfg.batch_size}, seed {cfg.seed}")
  print("| positions | test accuracy | final train loss |\n| --- | --- | --- |")
  results = {}
  for position in args.positions:
    accuracy, loss = train_and_test(cfg, position)
    results[position] = float(accuracy)
    print(f"| {position} | {float(accuracy):.1%} | {float(loss):.3f} |")
  return results


if __name__ == "__main__":
  main()
