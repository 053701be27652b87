"""T5 span corruption (tasks/span_corruption.py): noise statistics, exact reconstruction,
sentinel order, the pipeline's batches, and the families that may run it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import shakespeare_data

from transformer import tasks
from transformer.data import make_datasets
from transformer.data.tokenizers import EOS_ID
from transformer.tasks import span_corruption as sc
from transformer.train import experiment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTINEL = 1000  # first sentinel id in the unit tests (above every token drawn)


def _runs(mask: np.ndarray) -> list[int]:
  """Lengths of the runs of True in `mask`."""
  padded = np.concatenate([[0], mask.astype(int), [0]])
  edges = np.flatnonzero(np.diff(padded))
  return list(edges[1::2] - edges[::2])


def test_noise_density_and_mean_span_length_over_many_draws():
  rng = np.random.default_rng(0)
  noise = spans = tokens = 0
  fractions = []
  for _ in range(3000):
    length = int(rng.integers(40, 400))
    mask = sc.noise_mask(length, rng)
    runs = _runs(mask)
    noise, spans, tokens = noise + sum(runs), spans + len(runs), tokens + length
    fractions.append(mask.mean())
  # Rounding to whole tokens and spans is the only deviation: a few tenths of a percent.
  assert np.mean(fractions) == pytest.approx(0.15, abs=0.003)
  assert noise / tokens == pytest.approx(0.15, abs=0.003)
  assert noise / spans == pytest.approx(3.0, abs=0.05)
  # The span lengths really vary (a random composition, not fixed spans of 3).
  lengths = np.concatenate([_runs(sc.noise_mask(200, rng)) for _ in range(200)])
  assert lengths.min() == 1 and lengths.max() >= 8


def _reconstruct(inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
  """The original window from inputs and targets (sentinels replaced by their spans)."""
  assert inputs[-1] == EOS_ID and targets[-1] == EOS_ID
  spans, current = {}, None
  for token in targets[:-1]:
    if token >= SENTINEL:
      current = int(token)
      spans[current] = []
    else:
      spans[current].append(int(token))
  out = []
  for token in inputs[:-1]:
    out += spans[int(token)] if token >= SENTINEL else [int(token)]
  return np.asarray(out)


def test_inputs_and_targets_reconstruct_the_window_with_distinct_ordered_sentinels():
  rng = np.random.default_rng(1)
  for _ in range(500):
    length = int(rng.integers(2, 300))
    tokens = rng.integers(7, SENTINEL, size=length).astype(np.int32)
    mask = sc.noise_mask(length, rng)
    inputs, targets = sc.corrupt(tokens, mask, SENTINEL)
    np.testing.assert_array_equal(_reconstruct(inputs, targets), tokens)
    in_sentinels = inputs[inputs >= SENTINEL]
    out_sentinels = targets[targets >= SENTINEL]
    expected = SENTINEL + np.arange(len(_runs(mask)))
    np.testing.assert_array_equal(in_sentinels, expected)  # distinct, in order, one per span
    np.testing.assert_array_equal(out_sentinels, expected)
    assert targets[0] == SENTINEL  # targets start with the first sentinel
    noise, spans = int(mask.sum()), len(expected)
    assert len(inputs) == length - noise + spans + 1 and len(targets) == noise + spans + 1


def test_window_length_fits_inputs_and_targets_as_t5():
  for inputs_len, targets_len in ((512, 114), (128, 32), (16, 32)):
    length = sc.window_length(inputs_len, targets_len, 0.15, 3.0)
    noise, spans = sc._counts(length, 0.15, 3.0)
    assert length - noise + spans + 1 <= inputs_len and noise + spans + 1 <= targets_len
    noise, spans = sc._counts(length + 1, 0.15, 3.0)
    assert length + 1 - noise + spans + 1 > inputs_len or noise + spans + 1 > targets_len
  # T5's own numbers: inputs of 512 come from windows of 568 tokens, targets of 114.
  assert sc.window_length(512, 114, 0.15, 3.0) == 568


def test_pipeline_batches_are_corrupted_windows_of_the_text(tmp_path):
  cfg = shakespeare_data(tmp_path, "span_corruption", target_seq_len=16)
  task = tasks.create(cfg, 48)
  train, eval_factory, info = make_datasets(cfg, task.data_spec(), tmp_path, 4, 48, 0, 0, 1)
  batch = next(train)
  shapes = info.batch_shapes(True)
  assert set(batch) == set(shapes)
  for key, value in batch.items():
    assert (value.shape, value.dtype) == shapes[key], key
  vocab = info.tokenizer.vocab_size
  for row in range(4):
    n_in = int(batch["inputs_segment_ids"][row].sum())
    n_out = int(batch["targets_segment_ids"][row].sum())
    inputs, targets = batch["inputs"][row, :n_in], batch["targets"][row, :n_out]
    sentinels = inputs[inputs >= vocab]
    np.testing.assert_array_equal(sentinels, vocab + np.arange(len(sentinels)))
    text = info.tokenizer.decode(
      _reconstruct(
        np.where(inputs >= vocab, inputs - vocab + SENTINEL, inputs),
        np.where(targets >= vocab, targets - vocab + SENTINEL, targets),
      )  # fmt: skip
    )
    assert len(text) == sc.window_length(48, 16, 0.15, 3.0)
    assert text in info.tokenizer.decode(info.tokenizer.encode(_shakespeare()))
    assert np.all(batch["weights"][row, :n_out] == 1) and np.all(batch["weights"][row, n_out:] == 0)
  assert sum(1 for _ in eval_factory()) == info.eval_batches


def _shakespeare() -> str:
  import gzip

  with gzip.open(os.path.join(REPO, "data", "tinyshakespeare.txt.gz"), "rt") as f:
    return f.read()


def test_span_corruption_needs_an_encoder_decoder():
  config = experiment.default_config()
  config.data.kind = "span_corruption"
  config.model.family = "decoder"
  with pytest.raises(ValueError) as error:
    experiment.validate(config)
  message = str(error.value)
  assert message.startswith("config.data.kind='span_corruption': needs model.family seq2seq")
  assert "\n" not in message
  config.model.family = "seq2seq"
  exp = experiment.validate(config)
  model = experiment.finalize_model(exp, vocab_size=72, num_classes=0)
  assert model.vocab_size == 72 + sc.NUM_SENTINELS  # the sentinels get their own ids
