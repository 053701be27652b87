"""Decoding on the KV cache against full forward passes, exhaustive search and NumPy.

Tiny random float32 models, dropout 0. The references never use the cache: a DecoderLM
step is checked against a forward pass over exactly that step's prefix; an
EncoderDecoder step against the teacher-forced pass over the generated targets (causal:
position t sees the targets before t only).
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_model

from transformer import decode
from transformer.data.tokenizers import EOS_ID, PAD_ID

PROMPTS = [[5, 7, 9], [11, 3, 4, 8, 10, 12]]  # two lengths in one batch: P = 6
NEW = 10  # P + NEW = 16 = max_len of the tiny configs


LM_VARIANTS = {
  "rope": dict(position="rope", tie_embeddings=False),
  "learned": dict(position="learned", scan_layers=True),  # tied; nn.scan: cache axis 1
  "alibi": dict(position="alibi", tie_embeddings=False),
  "relative_t5": dict(position="relative_t5", tie_embeddings=False),
  "relative_shaw": dict(position="relative_shaw", tie_embeddings=False),
  "window_gqa": dict(position="sinusoidal", sliding_window=3, num_kv_heads=2, tie_embeddings=False),
  "chunked": dict(position="rope", attention_impl="chunked", tie_embeddings=False),
  "jax_mqa": dict(position="rope", attention_impl="jax", num_kv_heads=1, tie_embeddings=False),
}


@functools.cache
def _lm(variant: str):
  return tiny_model("decoder", **LM_VARIANTS[variant])


@functools.cache
def _s2s():
  return tiny_model("seq2seq", seed=1, position="relative_t5", norm="rmsnorm", tie_embeddings=False)


# Vocabulary 6 for exhaustive search. The seeds give models whose best sequence (no EOS)
# is not the greedy one, so beam search has to search.
@functools.cache
def _tiny_vocab_lm():
  return tiny_model(
    "decoder", seed=3, vocab_size=6, max_len=8, position="rope", tie_embeddings=False,
    scan_layers=True,  # nn.scan: the beams are gathered along cache axis 1
  )  # fmt: skip


@functools.cache
def _tiny_vocab_s2s():
  return tiny_model("seq2seq", vocab_size=6, tie_embeddings=False)


@functools.partial(jax.jit, static_argnums=0)
def _lm_logprobs(model, params, tokens, segments):
  """No cache: tokens [N, T] (real tokens from column 0, then pads of segment 0) -> [N, T, V]."""
  return jax.nn.log_softmax(model.apply({"params": params}, tokens, None, segments))


@functools.partial(jax.jit, static_argnums=0)
def _s2s_logprobs(model, params, inputs, targets):
  """No cache: teacher forcing, every target token real (PAD included) -> [B, T, V]."""
  logits = model.apply({"params": params}, inputs, targets, None, jnp.ones_like(targets))
  return jax.nn.log_softmax(logits)


def _lm_reference(model, params, prompts, generated, width=16):
  """Per row and generated token: argmax [B, L] and log-prob [B, L] of a full forward pass
  over that token's own prefix (prompt + the tokens before it), all prefixes in one batch.
  """
  pairs = zip(prompts, generated, strict=True)
  prefixes = [list(p) + list(g[:j]) for p, g in pairs for j in range(len(g))]
  tokens = np.zeros((len(prefixes), width), np.int32)  # right-padded, segment 0
  segments = np.zeros_like(tokens)
  for i, row in enumerate(prefixes):
    tokens[i, : len(row)], segments[i, : len(row)] = row, 1
  logprobs = np.asarray(_lm_logprobs(model, params, tokens, segments))  # [B * L, T, V]
  last = logprobs[np.arange(len(prefixes)), [len(row) - 1 for row in prefixes]]  # [B * L, V]
  last = last.reshape(len(prompts), -1, last.shape[-1])  # [B, L, V]
  chosen = np.take_along_axis(last, np.asarray(generated)[..., None], -1)[..., 0]
  return last.argmax(-1), chosen


def _first_new_token(row: np.ndarray) -> tuple[int, int]:
  """(step, token) of the first token after step 0 that the row has not emitted before."""
  for j in range(1, len(row)):
    if row[j] not in row[:j]:
      return j, int(row[j])
  raise AssertionError(f"row {row} repeats one token; pick another seed")


def _cut_at(tokens: np.ndarray, eos: int) -> np.ndarray:
  out = tokens.copy()
  for row in out:
    hits = np.flatnonzero(row == eos)
    if hits.size:
      row[hits[0] + 1 :] = PAD_ID
  return out


# ----------------------------------------------------------------------------------------
# Greedy with the cache == full forward.


@pytest.mark.parametrize("variant", list(LM_VARIANTS))
def test_lm_greedy_with_cache_matches_full_forward_at_every_step(variant):
  model, params = _lm(variant)
  out = decode.generate(model, params, PROMPTS, max_new_tokens=NEW, eos_id=None)
  tokens = np.asarray(out.tokens)
  argmax, logprobs = _lm_reference(model, params, PROMPTS, tokens)
  np.testing.assert_array_equal(tokens, argmax)
  np.testing.assert_allclose(out.scores, logprobs.sum(-1), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out.lengths, [NEW, NEW])
  assert len(set(tokens.ravel().tolist())) > 3  # a non-degenerate continuation


def test_rows_stop_at_their_own_eos_and_emit_pad():
  model, params = _lm("rope")
  free = np.asarray(decode.generate(model, params, PROMPTS, max_new_tokens=NEW, eos_id=None).tokens)
  step, eos = _first_new_token(free[0])
  assert step < NEW - 1
  out = decode.generate(model, params, PROMPTS, max_new_tokens=NEW, eos_id=eos)
  want = _cut_at(free, eos)
  np.testing.assert_array_equal(out.tokens, want)
  assert out.lengths[0] == step + 1 and out.tokens[0, step] == eos
  _, logprobs = _lm_reference(model, params, PROMPTS, free)
  np.testing.assert_allclose(
    out.scores, np.where(np.arange(NEW) < out.lengths[:, None], logprobs, 0).sum(-1), rtol=1e-5
  )


def test_seq2seq_greedy_with_cache_matches_full_forward_at_every_step():
  model, params = _s2s()
  inputs = np.array([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]], np.int32)  # row 1 is padded
  out = decode.translate(model, params, inputs, max_len=NEW, eos_id=None)
  logprobs = np.asarray(_s2s_logprobs(model, params, inputs, out.tokens))  # [B, L, V]
  np.testing.assert_array_equal(out.tokens, logprobs.argmax(-1))
  chosen = np.take_along_axis(logprobs, np.asarray(out.tokens)[..., None], -1)[..., 0]
  np.testing.assert_allclose(out.scores, chosen.sum(-1), rtol=1e-5, atol=1e-5)


def test_extra_left_padding_and_array_prompts_change_nothing():
  model, params = _lm("rope")
  prompts = [[5, 7, 9], [11, 3, 4, 8, 10]]
  tight = decode.generate(model, params, prompts, max_new_tokens=NEW, eos_id=None)
  padded = decode.generate(
    model, params, prompts, max_new_tokens=NEW, eos_id=None, prompt_len=6
  )  # the compilation of PROMPTS (P = 6)
  np.testing.assert_array_equal(tight.tokens, padded.tokens)
  np.testing.assert_allclose(tight.scores, padded.scores, rtol=1e-5)
  same_length = decode.generate(
    model, params, np.array([prompts[1]]), max_new_tokens=NEW, eos_id=None
  )
  np.testing.assert_array_equal(same_length.tokens[0], tight.tokens[1])


def test_same_shapes_compile_once():
  model, params = _lm("rope")
  decode.generate(model, params, PROMPTS, max_new_tokens=NEW, eos_id=EOS_ID)
  size = decode.lm_decode._cache_size()
  decode.generate(model, params, [[1], [4, 4, 4]], max_new_tokens=NEW, eos_id=5, prompt_len=6)
  decode.generate(model, params, [[8, 9], [3]], max_new_tokens=NEW, eos_id=None, prompt_len=6)
  assert decode.lm_decode._cache_size() == size


def test_a_batch_sharded_over_two_devices_decodes_as_on_one():
  """Data-parallel decoding (benchmarks/decode_vs_hf.py --cpu-devices 2): the loops follow
  the rows' sharding, each device decodes its own rows, and greedy, sampled and beam
  results are those of one device."""
  model, params = _lm("rope")
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  prompts, lengths = decode.left_pad(PROMPTS)  # [2, 6], [2]
  sampling = decode.Sampling(jax.random.key(0), temperature=2.0, top_p=0.95)
  runs = {
    "greedy": lambda *a: decode.lm_decode(*a, length=NEW),
    "sample": lambda *a, s=sampling: decode.lm_decode(*a, length=NEW, sampling=s),
    "beam": lambda *a: decode.lm_beam_search(*a, length=NEW, beam_size=2, alpha=0.6),
  }
  for name, run in runs.items():
    one = run(model, params, prompts, lengths)
    split = run(
      model, jax.device_put(params, replicated), *jax.device_put((prompts, lengths), rows)
    )
    assert split.tokens.sharding.is_equivalent_to(rows, 2), (name, split.tokens.sharding)
    np.testing.assert_array_equal(split.tokens, one.tokens, err_msg=name)
    np.testing.assert_array_equal(split.lengths, one.lengths, err_msg=name)
    np.testing.assert_allclose(split.scores, one.scores, rtol=1e-5, atol=1e-6, err_msg=name)


# ----------------------------------------------------------------------------------------
# Beam search.


def _penalty(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


def test_beam_size_one_equals_greedy():
  model, params = _lm("rope")
  greedy = decode.generate(model, params, PROMPTS, max_new_tokens=NEW, eos_id=None)
  beam = decode.generate(
    model, params, PROMPTS, max_new_tokens=NEW, eos_id=None, method="beam", beam_size=1
  )
  np.testing.assert_array_equal(beam.tokens, greedy.tokens)
  np.testing.assert_allclose(beam.scores, greedy.scores / _penalty(NEW, 0.6), rtol=1e-5)
  # With EOS and alpha = 0 (score = log-prob): a row whose greedy path ends in EOS ends the
  # same way with beam 1 (its live continuations can only score lower, so the search
  # stops); for another row the finished set may hold an earlier, better EOS hypothesis
  # than the greedy one, so the beam can only score higher.
  _, eos = _first_new_token(np.asarray(greedy.tokens[0]))
  greedy = decode.generate(model, params, PROMPTS, max_new_tokens=NEW, eos_id=eos)
  beam = decode.generate(
    model, params, PROMPTS, max_new_tokens=NEW, eos_id=eos, method="beam", beam_size=1, alpha=0.0
  )
  assert greedy.lengths[0] < NEW and greedy.lengths[1] == NEW
  np.testing.assert_array_equal(beam.tokens[0], greedy.tokens[0])
  np.testing.assert_allclose(beam.scores[0], greedy.scores[0], rtol=1e-5)
  assert beam.scores[1] >= greedy.scores[1]

  s2s, s2s_params = _s2s()
  inputs = np.array([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]], np.int32)
  greedy = decode.translate(s2s, s2s_params, inputs, max_len=NEW, eos_id=None)
  beam = decode.translate(
    s2s, s2s_params, inputs, max_len=NEW, eos_id=None, method="beam", beam_size=1
  )
  np.testing.assert_array_equal(beam.tokens, greedy.tokens)


def _ranked(logprobs: np.ndarray, eos_id, alpha: float) -> list[tuple[float, tuple[int, ...]]]:
  """Every hypothesis, best first, from full-forward log-probs [V**L, L, V] of all the
  length-L continuations (in itertools.product order).

  A hypothesis ends at its first EOS, or at L tokens; score = log-prob / length penalty.
  """
  count, length, vocab = logprobs.shape
  seqs = np.array(list(itertools.product(range(vocab), repeat=length)))  # [V^L, L]
  chosen = np.take_along_axis(logprobs, seqs[..., None], -1)[..., 0]  # [V^L, L]
  best = {}
  for seq, lp in zip(map(tuple, seqs), chosen, strict=True):
    n = seq.index(eos_id) + 1 if eos_id in seq else length
    best[seq[:n]] = lp[:n].sum() / _penalty(n, alpha)
  return sorted(((s, t) for t, s in best.items()), reverse=True)


def _greedy_path(logprobs: np.ndarray) -> tuple[int, ...]:
  """The greedy continuation read off the same log-probs [V**L, L, V]."""
  _, length, vocab = logprobs.shape
  path = []
  for j in range(length):
    row = sum(t * vocab ** (length - 1 - i) for i, t in enumerate(path))  # path + [0, ...]
    path.append(int(logprobs[row, j].argmax()))
  return tuple(path)


def _check_beams(out, row, ranked, k=5):
  """The best hypothesis and the top-k scores of beam search match exhaustive search."""
  (score, seq), (second, _) = ranked[0], ranked[1]
  assert score - second > 1e-4  # a well-posed comparison: no near tie for the best
  want = np.zeros(out.tokens.shape[1], np.int32)
  want[: len(seq)] = seq
  np.testing.assert_array_equal(out.tokens[row], want)
  np.testing.assert_allclose(out.scores[row], score, rtol=1e-5)
  np.testing.assert_allclose(out.beam_scores[row, :k], [s for s, _ in ranked[:k]], rtol=1e-5)
  return len(seq)


# eos None: every hypothesis has L tokens; alpha 0.6 favours short hypotheses, 3 long ones.
CASES = [(None, 0.6), (2, 0.6), (3, 3.0), (2, 3.0)]


def _check_exhaustive(out, logprobs_per_row, eos_id, alpha):
  length = out.tokens.shape[1]
  lengths = []
  for row, logprobs in enumerate(logprobs_per_row):
    ranked = _ranked(logprobs, eos_id, alpha)
    lengths.append(_check_beams(out, row, ranked))
    if eos_id is None:
      assert ranked[0][1] != _greedy_path(logprobs)  # the search beats greedy here
  if eos_id is not None and alpha < 1:
    assert min(lengths) < length  # the EOS path is exercised


@pytest.mark.parametrize("eos_id, alpha", CASES)
def test_lm_beam_search_finds_the_exhaustive_optimum(eos_id, alpha):
  model, params = _tiny_vocab_lm()
  v, length, prompts = 6, 4, [[1, 3, 4], [5, 1, 3]]
  beam = v ** (length - 1)  # every prefix stays live, so the search is exhaustive
  out = decode.generate(
    model,
    params,
    prompts,
    max_new_tokens=length,
    method="beam",
    beam_size=beam,
    alpha=alpha,
    eos_id=eos_id,
  )
  conts = np.array(list(itertools.product(range(v), repeat=length)), np.int32)  # [V^L, L]
  per_row = []
  for prompt in prompts:
    tokens = np.concatenate([np.tile(prompt, (len(conts), 1)), conts], 1)  # [V^L, P + L]
    logprobs = np.asarray(_lm_logprobs(model, params, tokens, np.ones_like(tokens)))
    per_row.append(logprobs[:, len(prompt) - 1 + np.arange(length)])  # [V^L, L, V]
  _check_exhaustive(out, per_row, eos_id, alpha)


@pytest.mark.parametrize("eos_id, alpha", CASES)
def test_seq2seq_beam_search_finds_the_exhaustive_optimum(eos_id, alpha):
  model, params = _tiny_vocab_s2s()
  v, length = 6, 3
  inputs = np.array([[3, 4, 5, 1], [5, 1, 0, 0]], np.int32)
  out = decode.translate(
    model,
    params,
    inputs,
    max_len=length,
    method="beam",
    beam_size=v ** (length - 1),
    alpha=alpha,
    eos_id=eos_id,
  )
  conts = np.array(list(itertools.product(range(v), repeat=length)), np.int32)  # [V^L, L]
  per_row = [
    np.asarray(_s2s_logprobs(model, params, np.tile(source, (len(conts), 1)), conts))
    for source in inputs
  ]  # [V^L, L, V] each
  _check_exhaustive(out, per_row, eos_id, alpha)


# ----------------------------------------------------------------------------------------
# Sampling and filters.


def test_sampling_top_k_1_and_low_temperature_are_greedy_and_seeds_reproduce():
  model, params = _lm("rope")
  kwargs = dict(max_new_tokens=NEW, eos_id=None)
  greedy = np.asarray(decode.generate(model, params, PROMPTS, **kwargs).tokens)

  def sample(seed, **options):
    sampling = decode.Sampling(jax.random.key(seed), **options)
    out = decode.generate(model, params, PROMPTS, method="sample", sampling=sampling, **kwargs)
    return np.asarray(out.tokens)

  np.testing.assert_array_equal(sample(0, top_k=1, temperature=2.0), greedy)
  np.testing.assert_array_equal(sample(1, temperature=1e-4), greedy)
  np.testing.assert_array_equal(sample(1, temperature=0.0), greedy)
  first = sample(0, temperature=2.0, top_p=0.95)
  np.testing.assert_array_equal(sample(0, temperature=2.0, top_p=0.95), first)
  assert not np.array_equal(sample(1, temperature=2.0, top_p=0.95), first)
  assert not np.array_equal(first, greedy)


def _numpy_top_p(logits: np.ndarray, p: float) -> tuple[np.ndarray, float]:
  """Float64 reference: keep the smallest most-probable set with mass >= p, plus ties.

  Returns the kept mask [V] and how far p is from the nearest cumulative mass.
  """
  z = logits.astype(np.float64)
  probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
  ordered = np.sort(probs)[::-1]
  cumulative = np.cumsum(ordered)
  count = int(np.argmax(cumulative >= p)) + 1 if p < 1 else len(z)
  return probs >= ordered[count - 1], float(np.min(np.abs(cumulative - p)))


def test_top_p_filter_matches_numpy_reference_including_ties():
  rng = np.random.default_rng(0)
  real = 2.0 * rng.standard_normal((200, 12))
  tied = rng.integers(0, 4, (200, 12)).astype(np.float64)  # many equal logits
  logits = np.concatenate([real, tied]).astype(np.float32)
  p = np.concatenate([rng.uniform(0.01, 1.0, 400)]).astype(np.float32)
  p[:4] = [1.0, 1e-6, 0.5, 0.999]
  got = np.isfinite(np.asarray(jax.jit(decode.top_p_filter)(logits, p)))
  checked = 0
  for i in range(len(logits)):
    want, margin = _numpy_top_p(logits[i], float(p[i]))
    if margin < 1e-5 and p[i] < 1:
      continue  # p on a cumulative mass: float32 rounding may go either way
    np.testing.assert_array_equal(got[i], want, err_msg=f"row {i}, p={p[i]}")
    checked += 1
  assert checked > 390
  assert got[0].all() and got[1].sum() == 1


def test_top_k_filter_keeps_the_k_largest_and_ties():
  logits = np.array([[3.0, 1.0, 2.0, 2.0, -1.0], [0.5, 0.4, 0.3, 0.2, 0.1]], np.float32)
  keep = lambda k: np.isfinite(np.asarray(decode.top_k_filter(jnp.asarray(logits), k)))
  np.testing.assert_array_equal(keep(1), [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(keep(2), [[1, 0, 1, 1, 0], [1, 1, 0, 0, 0]])  # tie kept
  assert keep(0).all() and keep(5).all() and keep(9).all()


def test_filter_logits_equals_the_two_filters_on_every_branch():
  """`filter_logits` skips sorts (both off; top-k alone via `lax.top_k`) but must give
  exactly `top_p_filter(top_k_filter(.))`, ties, per-row k and k beyond the fast width
  included."""
  from transformer.decode.sampling import FAST_TOP_K, filter_logits

  rng = np.random.default_rng(3)
  v = FAST_TOP_K + 44
  real = rng.standard_normal((6, v)).astype(np.float32)
  tied = rng.integers(0, 3, (6, v)).astype(np.float32)  # ties at every threshold
  logits = jnp.asarray(np.concatenate([real, tied]))
  per_row = jnp.asarray([1, 5, 0, FAST_TOP_K, 50, 7, 2, 9, v, 3, 11, 40], jnp.int32)
  f = jax.jit(filter_logits)
  for k, p in [(0, 1.0), (1, 1.0), (50, 1.0), (FAST_TOP_K, 1.0), (FAST_TOP_K + 1, 1.0),
               (v + 5, 1.0), (0, 0.9), (50, 0.5), (per_row, 1.0), (per_row, 0.7)]:  # fmt: skip
    want = decode.top_p_filter(decode.top_k_filter(logits, k), p)
    np.testing.assert_array_equal(f(logits, k, p), want, err_msg=f"k={k}, p={p}")


def test_sampler_draws_from_temperature_then_top_k_then_top_p():
  logits = np.array([2.0, 1.5, 1.0, 0.6, 0.3, 0.0, -0.5, -2.0], np.float32)
  temperature, top_k, top_p, n = 0.7, 5, 0.8, 20_000
  z = np.exp(logits / temperature)
  z[np.argsort(-z)[top_k:]] = 0
  nucleus, _ = _numpy_top_p(np.log(np.maximum(z, 1e-30)), top_p)
  want = np.where(nucleus, z, 0) / np.where(nucleus, z, 0).sum()
  draw = jax.jit(decode.sample)
  samples = draw(jnp.tile(logits, (n, 1)), jax.random.key(0), temperature, top_k, top_p)
  freq = np.bincount(np.asarray(samples), minlength=len(logits)) / n
  assert (freq[want == 0] == 0).all()
  np.testing.assert_allclose(freq, want, atol=0.015)


def test_top_k_alone_draws_among_its_candidates_from_the_filtered_distribution():
  """V = 300, past both fast widths: k = 5 draws among lax.top_k's 64 candidates, k = 100
  among 256; k = 3 with 70 logits tied at the 3rd largest (more than 64) draws over all V.
  Each against the float64 softmax of the kept logits, ties included."""
  rng = np.random.default_rng(0)
  spread = np.sort(rng.normal(0.0, 1.0, 300).astype(np.float32))[::-1]
  spread[:5] += 3.0  # a head the draws are spread over
  tied = np.concatenate([[3.0, 2.5], np.full(70, 1.0), rng.normal(-2.0, 0.5, 228)])
  tied = tied.astype(np.float32)
  draw = jax.jit(decode.sample)
  n = 20_000
  for logits, top_k, temperature in ((spread, 5, 0.8), (spread, 100, 1.5), (tied, 3, 1.0)):
    z = logits.astype(np.float64) / temperature
    kept = z >= np.sort(z)[::-1][top_k - 1]
    want = np.where(kept, np.exp(z - z.max()), 0.0)
    want /= want.sum()
    rows = jnp.tile(logits, (n, 1))
    samples = np.asarray(draw(rows, jax.random.key(top_k), temperature, top_k, 1.0))
    freq = np.bincount(samples, minlength=logits.size) / n
    assert (freq[~kept] == 0).all(), (top_k, np.flatnonzero(freq[~kept]))
    np.testing.assert_allclose(freq, want, atol=0.015, err_msg=f"top_k={top_k}")
    if top_k == 3:  # the 70 tied logits share their mass evenly: every one is drawn
      assert (freq[2:72] > 0).all(), freq[2:72]


# ----------------------------------------------------------------------------------------
# Bad input: ValueError before anything is compiled.


def _bad_requests():
  lm, lm_params = _lm("rope")
  s2s, s2s_params = _s2s()
  gen = functools.partial(decode.generate, lm, lm_params)
  tr = functools.partial(decode.translate, s2s, s2s_params)
  return {
    "token id = vocab": (lambda: gen([[5, 40]], max_new_tokens=2), "outside the vocabulary"),
    "negative id": (lambda: gen([[5], [-1, 3]], max_new_tokens=2), "outside the vocabulary"),
    "empty prompt": (lambda: gen([[5], []], max_new_tokens=2), "non-empty"),
    "no prompts": (lambda: gen([], max_new_tokens=2), "no prompts"),
    "float ids": (lambda: gen([[1.5, 2.0]], max_new_tokens=2), "integer"),
    "too long": (lambda: gen([[1] * 10], max_new_tokens=7), "max_len=16"),
    "no new tokens": (lambda: gen([[1]], max_new_tokens=0), "max_new_tokens=0"),
    "short prompt_len": (lambda: gen([[1, 2, 3]], max_new_tokens=2, prompt_len=2), "shorter"),
    "method": (lambda: gen([[1]], max_new_tokens=2, method="topk"), "method='topk'"),
    "no sampling": (lambda: gen([[1]], max_new_tokens=2, method="sample"), "needs sampling="),
    "no rng": (
      lambda: gen([[1]], max_new_tokens=2, method="sample", sampling=decode.Sampling(None)),
      "rng",
    ),
    "top_p": (
      lambda: gen(
        [[1]],
        max_new_tokens=2,
        method="sample",
        sampling=decode.Sampling(jax.random.key(0), top_p=0.0),
      ),
      "top_p",
    ),
    "beam_size": (lambda: gen([[1]], max_new_tokens=2, method="beam", beam_size=0), "beam_size"),
    "eos": (lambda: gen([[1]], max_new_tokens=2, eos_id=40), "eos_id=40"),
    "wrong family": (lambda: decode.generate(s2s, s2s_params, [[1]], max_new_tokens=2), "Dec"),
    "source id": (lambda: tr(np.array([[3, 99]]), max_len=4), "outside the vocabulary"),
    "padding-only source": (lambda: tr(np.array([[3, 4], [0, 0]]), max_len=4), "empty"),
    "long source": (lambda: tr(np.ones((1, 17), np.int32), max_len=4), "source length 17"),
    "max_len": (lambda: tr([[3, 4], [5]], max_len=17), "max_len=17"),
  }


@pytest.mark.parametrize("case", list(_bad_requests()))
def test_bad_input_raises_before_compiling(case):
  call, message = _bad_requests()[case]
  jitted = (decode.lm_decode, decode.lm_beam_search, decode.seq2seq_decode)
  sizes = [f._cache_size() for f in jitted]
  with pytest.raises(ValueError, match=message):
    call()
  assert [f._cache_size() for f in jitted] == sizes
