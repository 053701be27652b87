"""Prefix-LM (tasks/prefix_lm.py): the prefix is bidirectional and the suffix causal through
the task's forward pass, the loss covers the suffix only, and the pipeline cuts windows."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import make_tiny_config, shakespeare_data

from transformer import tasks
from transformer.data import make_datasets
from transformer.nn.models import build_model
from transformer.tasks import prefix_lm
from transformer.train import experiment

T, PREFIX = 12, 5


def _batch(tokens: np.ndarray) -> dict[str, np.ndarray]:
  window = np.concatenate([tokens, [3]]).astype(np.int32)  # [T + 1]
  return {k: v[None] for k, v in prefix_lm.split_window(window, T, PREFIX).items()}


def test_weights_cover_the_suffix_and_the_mask_the_prefix():
  row = prefix_lm.split_window(np.arange(10, 10 + T + 1), T, PREFIX)
  t = np.arange(T)
  np.testing.assert_array_equal(row["prefix_mask"], t < PREFIX)
  # Position t predicts token t + 1: weights exactly on the predictions of suffix tokens.
  np.testing.assert_array_equal(row["weights"], (t + 1 >= PREFIX).astype(np.float32))
  np.testing.assert_array_equal(
    row["targets"][row["weights"] > 0], np.arange(10 + PREFIX, 10 + T + 1)
  )
  short = prefix_lm.split_window(np.arange(10, 17), T, 3)  # a window cut by the stream's end
  assert short["segment_ids"].sum() == 6 and short["weights"][6:].sum() == 0


@pytest.mark.parametrize("impl", ["xla", "chunked"])
def test_prefix_is_bidirectional_and_suffix_causal_through_the_task(impl, random_params):
  config = make_tiny_config("decoder", attention_impl=impl, max_len=T)
  model = build_model(config)
  task = tasks.get("prefix_lm")()
  tokens = np.random.default_rng(0).integers(7, config.vocab_size, size=T)
  batch = _batch(tokens)
  args, kwargs = task.init_args(batch)
  params = random_params(model, *args, **kwargs)
  forward = jax.jit(lambda b: task.apply(model, {"params": params}, b)[0])
  base = np.asarray(forward(batch))  # [1, T, V]

  def changed_positions(position: int) -> np.ndarray:
    other = tokens.copy()
    other[position] = 7 + (other[position] - 6) % (config.vocab_size - 7)
    out = np.asarray(forward(_batch(other)))
    return np.flatnonzero(np.abs(out - base).max(axis=-1)[0] > 1e-6)

  # A prefix token reaches every prefix position, earlier ones included, and the suffix.
  np.testing.assert_array_equal(changed_positions(PREFIX - 1), np.arange(T))
  np.testing.assert_array_equal(changed_positions(2), np.arange(T))
  # A suffix token reaches only itself and later positions: nothing before it changes.
  np.testing.assert_array_equal(changed_positions(PREFIX + 2), np.arange(PREFIX + 2, T))


def test_pipeline_cuts_every_window_inside_it(tmp_path):
  cfg = shakespeare_data(tmp_path, "prefix_lm")
  spec = tasks.create(cfg, 32).data_spec()
  train, eval_factory, info = make_datasets(cfg, spec, tmp_path, 8, 32, 0, 0, 1)
  batches = [next(train) for _ in range(4)]
  shapes = info.batch_shapes(True)
  prefixes = []
  for batch in batches:
    assert set(batch) == set(prefix_lm.KEYS) == set(shapes)
    for key, value in batch.items():
      assert (value.shape, value.dtype) == shapes[key], key
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    p = batch["prefix_mask"].sum(axis=1)
    assert (p >= 1).all() and (p <= 31).all()
    np.testing.assert_array_equal(batch["weights"], np.arange(32)[None] + 1 >= p[:, None])
    prefixes += list(p)
  assert len(set(prefixes)) > 8  # the cut point is random
  assert sum(1 for _ in eval_factory()) == info.eval_batches


def test_prefix_lm_needs_a_decoder():
  config = experiment.default_config()
  config.data.kind = "prefix_lm"
  config.model.family = "encoder"
  with pytest.raises(
    ValueError, match=r"^config.data.kind='prefix_lm': needs model.family decoder"
  ):
    experiment.validate(config)
