"""The research experiments behave as documented in docs/RESEARCH.md, at reduced sizes.

Each test runs a shortened version of one experiment (fewer steps, a slice of the
validation text) and checks the claim the full run makes, with margins several times the
seed-to-seed spread measured at these sizes. The two long experiments run in a new process
compiled as users' runs are (`in_release_codegen`): their hundreds of updates run about
three times as fast there as under the session's quick compilation, and their numbers are
the ones docs/RESEARCH.md reports.
"""

from __future__ import annotations

import numpy as np
import pytest
from session_env import in_release_codegen

from transformer.nn.config import ModelConfig
from transformer.nn.models.decoder import DecoderLM
from transformer.research import char_lm, extrapolation, ln_depth, order_task


@pytest.fixture(scope="module")
def corpus() -> char_lm.Corpus:
  return char_lm.load_corpus()


def test_order_task_needs_positions():
  """Without positions the classifier cannot beat chance; sinusoidal positions solve it."""
  cfg = order_task.TaskConfig(steps=150, eval_examples=4096)
  accuracy = {p: float(order_task.train_and_test(cfg, p)[0]) for p in ("none", "sinusoidal")}
  assert accuracy["none"] < 0.6, accuracy
  assert accuracy["sinusoidal"] > 0.95, accuracy


def test_post_ln_without_warmup_trains_worse_at_depth(corpus):
  """12 layers, no warmup: post-LN stays near the unigram loss while pre-LN learns."""
  results = in_release_codegen(
    ln_depth.run, ["pre-LN", "post-LN"], seeds=[0], depth=12, d_model=32, steps=300,
    eval_chars=8192, corpus=corpus,
  )  # fmt: skip
  loss = {r.variant: r.validation_loss for r in results}
  unigram = ln_depth.unigram_loss(corpus, corpus.validation[1:8192])
  assert loss["pre-LN"] < unigram - 0.5, (loss, unigram)
  assert loss["post-LN"] > loss["pre-LN"] + 0.4, (loss, unigram)


def test_alibi_extrapolates_and_sinusoidal_does_not(corpus):
  """Trained at 64 characters: at 128, ALiBi's unseen positions cost little, sinusoidal's a lot."""
  results = in_release_codegen(
    extrapolation.run, ["sinusoidal", "alibi"], steps=150, eval_chars=8192, corpus=corpus
  )
  gap = {r.position: r.loss_double_second - r.loss_double_first for r in results}
  assert gap["alibi"] < 0.1, gap
  assert gap["sinusoidal"] > 0.3, gap


def test_unigram_loss_matches_hand_computation():
  """Add-one-smoothed character frequencies of the training text, scored on other ids."""
  tiny = char_lm.Corpus(np.array([0, 0, 1], np.int32), np.array([1], np.int32), vocab_size=3)
  # counts + 1 = [3, 2, 1] of 6: log-probabilities log(3/6), log(2/6), log(1/6)
  expected = -(np.log(3 / 6) + np.log(1 / 6)) / 2
  assert ln_depth.unigram_loss(tiny, np.array([0, 2])) == pytest.approx(expected, rel=1e-12)


def test_evaluate_scores_every_window_position(corpus):
  """Per-position losses match a direct float64 computation from the model's logits."""
  config = ModelConfig(
    family="decoder", vocab_size=corpus.vocab_size, d_model=16, num_heads=2, num_layers=1,
    d_ff=32, max_len=8, position="alibi",
  )  # fmt: skip
  params, step_losses = char_lm.train(
    config, char_lm.RunConfig(steps=3, seq_len=8, warmup_steps=1), corpus
  )
  assert step_losses.shape == (3,) and np.all(np.isfinite(step_losses))
  ids = corpus.validation[:41]  # 5 windows of 8 (+1 target), the tail dropped
  got = char_lm.evaluate(config, params, ids, 8, batch_size=2)
  windows = ids[np.arange(5)[:, None] * 8 + np.arange(9)]
  logits = np.asarray(DecoderLM(config).apply({"params": params}, windows[:, :-1]), np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  want = -np.take_along_axis(log_probs, windows[:, 1:, None], -1)[..., 0].mean(0)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_bad_arguments_are_named(corpus):
  with pytest.raises(ValueError, match="variant"):
    ln_depth.run(["mid-LN"], seeds=[0], corpus=corpus)
  with pytest.raises(ValueError, match="position"):
    extrapolation.run(["absolute"], corpus=corpus)
  config = extrapolation.model_config("rope", corpus.vocab_size, 16)
  with pytest.raises(ValueError, match="max_len 32 < seq_len 64"):
    char_lm.train(config, char_lm.RunConfig(seq_len=64), corpus)
  with pytest.raises(FileNotFoundError, match="missing.txt"):
    char_lm.load_corpus("missing.txt")
