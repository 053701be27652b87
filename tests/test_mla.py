"""Multi-head latent attention (transformer/nn/mla.py) against a float64 NumPy reference.

The layer on packed, padded causal inputs equals the reference written from the DeepSeek-V2
paper's equations (queries low-rank or not, values narrower or wider than the query
heads, biases); every attention implementation agrees; decoding, which caches only the
latent and the rope key and attends in the latent, gives the logits of a full forward
pass at every step; the analytic counts equal the real ones; bad fields fail in one line.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_numpy as ref
from conftest import make_jit_apply, make_random_params, make_tiny_config, tiny_model
from test_config import _matmul_flops_per_token
from test_param_count import real_param_count

from transformer import decode, tasks
from transformer.nn import models
from transformer.nn.masks import MaskInfo
from transformer.nn.mla import LatentAttention
from transformer.train.parallel import StepRunner, make_mesh
from transformer.train.step import StepConfig, create_train_state, train_step

MLA = dict(mla_kv_rank=12, mla_rope_dim=6, attention_head_dim=10, position="rope", rope_theta=50.0)
CASES = {
  "full-query": dict(MLA),
  "low-rank-query": dict(MLA, mla_q_rank=20, mla_v_dim=8),
  "wide-values": dict(MLA, mla_q_rank=20, mla_v_dim=24, use_bias=True),
}
TOL = dict(rtol=1e-5, atol=1e-5)


def reference_mla(p, x: np.ndarray, positions: np.ndarray, mask: np.ndarray, c) -> np.ndarray:
  """x [B, T, D] float64 -> [B, T, D], from the equations (DeepSeek-V2, 2.1.2-2.1.3)."""
  h, r, rank = c.head_dim, c.mla_rope_dim, c.mla_kv_rank
  if c.mla_q_rank:
    q_latent = ref.rms_norm(ref.dense(x, p["query_down"]), p["query_down_norm"], c.norm_eps)
    q = ref.dense(q_latent, p["query_up"])  # [B, T, N, H + R]
  else:
    q = ref.dense(x, p["query"])
  compressed = ref.dense(x, p["kv_down"])  # [B, T, C + R]
  latent = ref.rms_norm(compressed[..., :rank], p["kv_down_norm"], c.norm_eps)  # [B, T, C]
  k_nope = np.einsum("btc,cnh->btnh", latent, p["key_up"]["kernel"])  # [B, T, N, H]
  v = np.einsum("btc,cnv->btnv", latent, p["value_up"]["kernel"])  # [B, T, N, V]
  k_rope = ref.rope(compressed[:, :, None, rank:], positions, c.rope_theta)  # [B, T, 1, R]
  k_rope = np.broadcast_to(k_rope, (*k_nope.shape[:3], r))
  q = np.concatenate([q[..., :h], ref.rope(q[..., h:], positions, c.rope_theta)], -1)
  k = np.concatenate([k_nope, k_rope], -1)  # [B, T, N, H + R]
  weights = ref.attention(q, k, k, mask, return_weights=True)[1]  # [B, N, T, S], (H + R)^-1/2
  out = np.einsum("bnts,bsnv->btnv", weights, v)
  return np.einsum("btnv,nvd->btd", out, p["out"]["kernel"]) + p["out"].get("bias", 0.0)


def _inputs(b=2, t=7, d=32, seed=0):
  x = np.random.default_rng(seed).standard_normal((b, t, d)).astype(np.float32)
  segments = np.array([[1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0]], np.int32)
  positions = np.array([[0, 1, 2, 3, 0, 1, 2], [0, 1, 2, 3, 4, 0, 0]], np.int32)
  return x, segments, positions


@pytest.mark.parametrize("name", list(CASES))
def test_layer_equals_float64_reference(name):
  c = make_tiny_config(**CASES[name])
  x, segments, positions = _inputs()
  info = MaskInfo.create(jnp.asarray(segments), q_positions=jnp.asarray(positions), causal=True)
  module = LatentAttention(c)
  params = make_random_params(module, x, None, info)
  out = make_jit_apply(module)(params, x, None, info)
  idx = np.arange(x.shape[1])
  mask = ref.reference_mask(idx, idx, True, None, segments, segments)
  expected = reference_mla(ref.to_numpy(params), x.astype(np.float64), positions, mask, c)
  real = segments > 0
  np.testing.assert_allclose(np.asarray(out)[real], expected[real], **TOL)


@pytest.mark.parametrize("impl", ["jax", "chunked"])
def test_every_attention_implementation_agrees(impl):
  """Values padded to the query heads' width (or queries and keys to the values') give
  every kernel the same function."""
  x, segments, positions = _inputs()
  info = MaskInfo.create(jnp.asarray(segments), q_positions=jnp.asarray(positions), causal=True)
  for name in ("low-rank-query", "wide-values"):
    c = make_tiny_config(**CASES[name])
    module = LatentAttention(c)
    params = make_random_params(module, x, None, info)
    want = make_jit_apply(module)(params, x, None, info)
    other = LatentAttention(c.replace(attention_impl=impl, attention_chunk_size=4))
    got = make_jit_apply(other)(params, x, None, info)
    np.testing.assert_allclose(np.asarray(got)[segments > 0], np.asarray(want)[segments > 0], **TOL)


@functools.partial(jax.jit, static_argnums=0)
def _logprobs(model, params, tokens, segments):
  return jax.nn.log_softmax(model.apply({"params": params}, tokens, None, segments))


@pytest.mark.parametrize("name", ["full-query", "wide-values"])
def test_decoding_from_the_latent_cache_equals_full_forward(name):
  """Greedy tokens of ragged prompts through the latent cache (grown from 8 slots) are the
  argmax of a full forward pass over each prefix, with the same log-probabilities."""
  model, params = tiny_model(seed=3, vocab_size=40, max_len=32, **CASES[name])
  rng = np.random.default_rng(5)
  prompts = [rng.integers(4, 40, 9).tolist(), rng.integers(4, 40, 3).tolist()]
  new = 12
  tokens, lengths = decode.left_pad(prompts)
  out = decode.lm_decode(model, params, tokens, lengths, length=new, initial_cache_len=8)
  generated = np.asarray(out.tokens)
  prefixes = [
    p + g[:j].tolist() for p, g in zip(prompts, generated, strict=True) for j in range(new)
  ]
  full = np.zeros((len(prefixes), max(map(len, prefixes))), np.int32)
  segments = np.zeros_like(full)
  for i, row in enumerate(prefixes):
    full[i, : len(row)], segments[i, : len(row)] = row, 1
  logprobs = np.asarray(_logprobs(model, params, full, segments))
  last = logprobs[np.arange(len(prefixes)), [len(row) - 1 for row in prefixes]]
  last = last.reshape(len(prompts), new, -1)  # [B, L, V]
  np.testing.assert_array_equal(generated, last.argmax(-1))
  chosen = np.take_along_axis(last, generated[..., None], -1)[..., 0]
  np.testing.assert_allclose(out.scores, chosen.sum(-1), rtol=1e-4, atol=1e-4)


def test_the_cache_holds_the_latent_and_the_rope_key_only():
  """Per layer and token: C + R numbers, against 2 N H for the keys and values of
  ordinary attention with the same heads."""
  c = make_tiny_config(**CASES["low-rank-query"])
  model = models.build_model(c)
  cache = decode.init_cache(model, batch=2, length=16)
  layer = cache["decoder"]["layer_0"]["self_attention"]
  assert sorted(layer) == ["cache_index", "cached_latent", "cached_positions", "cached_segment_ids"]
  assert layer["cached_latent"].shape == (2, 16, c.mla_kv_rank + c.mla_rope_dim)


def _train_losses(c, mesh, batch, steps=3):
  model = models.build_model(c)
  tx = optax.sgd(0.3)
  step_config = StepConfig(model=model, tx=tx, task=tasks.get("lm")())
  runner = StepRunner(step_config, "jit", mesh, update=train_step)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"]
  state = runner.place_state(create_train_state(params, tx, jax.random.PRNGKey(1)))
  losses = []
  for _ in range(steps):
    state, metrics = runner.train(state, batch)
    losses.append(float(metrics["loss"]))
  return np.array(losses), state


def test_heads_sharded_over_tensor_train_as_one_device():
  """fsdp 2 x tensor 4 fake devices: the up-projections split by head, the train steps'
  losses those of one device."""
  c = make_tiny_config(**CASES["low-rank-query"], vocab_size=40, ops="plain")
  rng = np.random.default_rng(2)
  tokens = rng.integers(1, 40, size=(8, 9)).astype(np.int32)
  batch = {
    "inputs": tokens[:, :-1],
    "targets": tokens[:, 1:],
    "weights": np.ones((8, 8), np.float32),
    "segment_ids": np.ones((8, 8), np.int32),
    "positions": np.broadcast_to(np.arange(8, dtype=np.int32), (8, 8)).copy(),
  }
  sharded, state = _train_losses(c, make_mesh(shape={"fsdp": 2, "tensor": 4}), batch)
  single, _ = _train_losses(c, make_mesh(jax.devices()[:1]), batch)
  np.testing.assert_allclose(sharded, single, rtol=1e-5)
  assert single[-1] < single[0]
  key_up = state.params["decoder"]["layer_0"]["self_attention"]["key_up"]["kernel"]
  assert key_up.sharding.spec[1] == "tensor"  # [C, N, H]: the heads split


def test_analytic_counts_equal_real_parameter_counts_and_flops():
  """FLOPs: 2 per weight of every projection (each token's key and value expanded), and
  per layer (T / 2) * N * 2 (H + R) for the scores, (T / 2) * N * 2 V for p v (causal)."""
  t = 50
  for name, fields in CASES.items():
    c = make_tiny_config(**fields)
    assert models.param_count(c) == real_param_count(c), name
    n, layers = c.num_heads, c.num_layers
    plain_products = 4.0 * (t / 2) * n * c.head_dim * layers  # what the helper adds
    products = 2.0 * (t / 2) * n * (c.head_dim + c.mla_rope_dim + c.mla_value_dim) * layers
    expected = _matmul_flops_per_token(c, t) - plain_products + products
    assert models.flops_per_token(c, t, training=False) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(MLA, mla_rope_dim=5), "ModelConfig.mla_rope_dim=5: must be an even integer > 0"),
    (dict(MLA, position="learned"), "ModelConfig.position='learned': must be 'rope' with latent"),
    (dict(MLA, num_kv_heads=2), "ModelConfig.num_kv_heads=2: must be 4 with latent attention"),
    (dict(MLA, qk_norm=True), "ModelConfig.qk_norm=True: must be False with latent attention"),
    (dict(mla_q_rank=8), "ModelConfig.mla_q_rank=8: needs mla_kv_rank > 0"),
    (dict(MLA, family="encoder"), "ModelConfig.family='encoder': must be 'decoder' with latent"),
    (dict(MLA, lora_rank=2, lora_targets=("key_up",)), "ModelConfig.lora_targets='key_up': latent"),
  ],
)
def test_bad_fields_are_one_line(fields, message):
  with pytest.raises(ValueError, match=re.escape(message)) as e:
    make_tiny_config(**fields)
  assert "\n" not in str(e.value)
