"""A character-level GPT on tiny shakespeare, trained in one compiled loop, for experiments.

The experiments `ln_depth` and `extrapolation` train many small variants of the same
model (`sweep`: every variant and seed); this module gives them one honest, fast training
function: the project's
`DecoderLM`, AdamW with the project's weight-decay mask and clipping, and a warmup-cosine
schedule, with the whole run compiled as one `jax.lax.scan` (batches are drawn inside it
from random offsets of the training text, as nanoGPT does). The numbers it produces are
comparable with the default run (`configs/lm_shakespeare.py`): same data split (last 10%
of the text for validation), same tokenizer, same optimizer settings.

Letters: B batch, T context length, V vocabulary, N characters.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.data.config import shipped_root
from transformer.data.tokenizers import CharTokenizer
from transformer.nn.config import ModelConfig
from transformer.nn.models.decoder import DecoderLM
from transformer.tasks import losses
from transformer.train import optimizer, schedules

DATA = shipped_root() / "data" / "tinyshakespeare.txt.gz"  # the checkout's or the installed one


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Character ids of the training and validation text, and the vocabulary size."""

  train: np.ndarray  # [N_train] int32
  validation: np.ndarray  # [N_val] int32
  vocab_size: int

  def validation_head(self, chars: int = 0) -> np.ndarray:
    """The first `chars` validation characters (0: all of them)."""
    return self.validation[:chars] if chars else self.validation


def gpt_config(vocab_size: int, d_model: int = 128, **changes: Any) -> ModelConfig:
  """The default run's character GPT (`configs/lm_shakespeare.py`: 4 layers, 4 heads,
  d_ff 4 * d_model, context 64, learned positions) without dropout; `changes` override."""
  fields = dict(
    family="decoder", vocab_size=vocab_size, d_model=d_model, num_heads=4, num_layers=4,
    d_ff=4 * d_model, max_len=64, position="learned", dropout_rate=0.0, scan_layers=True,
  )  # fmt: skip
  return ModelConfig(**(fields | changes))


@functools.lru_cache(maxsize=2)
def load_corpus(path: str = str(DATA), validation_fraction: float = 0.1) -> Corpus:
  """Reads the text, builds the character vocabulary, splits off the last fraction."""
  file = Path(path)
  if not file.is_file():
    raise FileNotFoundError(f"text file {file} not found (tiny shakespeare ships in data/)")
  opener = gzip.open if file.suffix == ".gz" else open
  with opener(file, "rt", encoding="utf-8") as f:
    text = f.read()
  tokenizer = CharTokenizer.train([text])
  ids = tokenizer.encode_array(text).astype(np.int32)
  split = int(len(ids) * (1 - validation_fraction))
  return Corpus(ids[:split], ids[split:], tokenizer.vocab_size)


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One training run. Defaults are nanoGPT's recipe (`configs/lm_shakespeare_nanogpt.py`)."""

  steps: int = 2000  # updates
  batch_size: int = 12  # sequences per update
  seq_len: int = 64  # training context T
  learning_rate: float = 1e-3  # peak
  warmup_steps: int = 100  # linear warmup (0: start at the peak)
  final_fraction: float = 0.1  # cosine decay to this fraction of the peak
  weight_decay: float = 0.1  # decoupled, not on biases / norms / embeddings
  clip_norm: float = 1.0  # global-norm clipping
  seed: int = 0  # parameters and batches


def command_line(doc: str, steps: int) -> argparse.ArgumentParser:
  """The flags the experiments share, described by the first line of `doc` (the
  experiment's docstring): `--steps` (default `steps`) and `--eval_chars`."""
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--steps", type=int, default=steps, help="updates per run")
  parser.add_argument("--eval_chars", type=int, default=0, help="0 = whole validation split")
  return parser


def sweep(
  variants: Sequence[str],
  known: Collection[str],
  what: str,
  seeds: Sequence[int],
  measure: Callable[[str, int], Any],
) -> list:
  """`measure(variant, seed)` (one run's result) for every variant, in order, and seed,
  each printed as it comes. A variant not in `known` is a ValueError naming `what`, raised
  before anything trains."""
  for variant in variants:
    if variant not in known:
      raise ValueError(f"{what} must be one of {known}, got {variant!r}")
  results = []
  for variant in variants:
    for seed in seeds:
      results.append(measure(variant, seed))
      print(f"  {results[-1]}", flush=True)
  return results


def train(model_config: ModelConfig, run: RunConfig, corpus: Corpus) -> tuple[dict, np.ndarray]:
  """Trains from scratch -> (params, per-step training loss [steps] float32 NumPy).

  A run that diverges keeps going (its losses turn NaN or stay high); the caller decides
  what counts as a failure.
  """
  if model_config.max_len < run.seq_len:
    raise ValueError(f"max_len {model_config.max_len} < seq_len {run.seq_len}")
  params, step_losses = _train(model_config, run, jnp.asarray(corpus.train))
  return params, np.asarray(step_losses)


@functools.partial(jax.jit, static_argnames=("model_config", "run"))
def _train(model_config: ModelConfig, run: RunConfig, text: jax.Array) -> tuple[dict, jax.Array]:
  model = DecoderLM(model_config)
  k_init, k_data = jax.random.split(jax.random.PRNGKey(run.seed))
  params = model.init(k_init, jnp.zeros((1, run.seq_len), jnp.int32))["params"]
  schedule = schedules.warmup_cosine(
    run.learning_rate, run.steps, run.warmup_steps, run.final_fraction
  )
  block = {"b2": 0.99, "eps": 1e-8, "weight_decay": run.weight_decay, "clip_norm": run.clip_norm}
  tx = optimizer.create_optimizer(block, schedule, params)
  offsets = jnp.arange(run.seq_len + 1)  # [T + 1]

  def loss_fn(p, window):
    logits = model.apply({"params": p}, window[:, :-1])  # [B, T, V]
    total, count, _ = losses.cross_entropy_with_label_smoothing(logits, window[:, 1:])
    return total / count

  def step(carry, key):
    p, opt_state = carry
    starts = jax.random.randint(key, (run.batch_size,), 0, text.shape[0] - run.seq_len - 1)
    window = text[starts[:, None] + offsets]  # [B, T + 1]
    loss, grads = jax.value_and_grad(loss_fn)(p, window)
    updates, opt_state = tx.update(grads, opt_state, p)
    p = jax.tree_util.tree_map(lambda a, u: a + u, p, updates)
    return (p, opt_state), loss

  keys = jax.random.split(k_data, run.steps)
  (params, _), step_losses = jax.lax.scan(step, (params, tx.init(params)), keys)
  return params, step_losses


def evaluate(
  model_config: ModelConfig, params: dict, ids: np.ndarray, length: int, batch_size: int = 64
) -> np.ndarray:
  """Next-character loss (nats) by position, over consecutive non-overlapping windows.

  Returns [length] float64: entry t is the mean loss of predicting character t + 1 of a
  window from its first t + 1 characters (its mean is the overall loss). Every window
  starts from an empty context, so with `length` twice the training context the second
  half of the entries use positions the model never trained on. The tail shorter than
  one window is dropped.
  """
  if length > model_config.max_len:
    raise ValueError(f"length {length} > max_len {model_config.max_len}")
  count = (len(ids) - 1) // length
  if count < 1:
    raise ValueError(f"{len(ids)} characters are too few for one window of {length}")
  starts = np.arange(count) * length
  windows = ids[starts[:, None] + np.arange(length + 1)]  # [count, length + 1]
  total = np.zeros(length)
  for i in range(0, count, batch_size):
    batch = jnp.asarray(windows[i : i + batch_size])
    total += np.asarray(_position_loss_sums(model_config, params, batch), np.float64)
  return total / count


@functools.partial(jax.jit, static_argnames=("model_config",))
def _position_loss_sums(model_config: ModelConfig, params: dict, windows: jax.Array) -> jax.Array:
  """windows [B, T + 1] -> summed loss per position [T] (float32)."""
  logits = DecoderLM(model_config).apply({"params": params}, windows[:, :-1])  # [B, T, V]
  log_probs = jax.nn.log_softmax(logits)  # [B, T, V]
  picked = jnp.take_along_axis(log_probs, windows[:, 1:, None], axis=-1)[..., 0]  # [B, T]
  return -picked.sum(axis=0)
