"""Position encodings against their definitions, and the properties that motivate them."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_numpy as ref
from conftest import reference_self_attention

from transformer.nn.attention import MultiHeadAttention
from transformer.nn.masks import MaskInfo
from transformer.nn.positions import (
  POSITIONS,
  Position,
  alibi_bias,
  alibi_slopes,
  apply_rope,
  position_for,
  shaw_relative_logits,
  sincos_2d_table,
  sinusoidal_table,
  t5_relative_bias,
  t5_relative_bucket,
)

TOL = dict(rtol=1e-5, atol=1e-5)


def test_sinusoidal_table_is_the_paper_formula():
  table = sinusoidal_table(50, 16)
  assert table.shape == (50, 16) and table.dtype == np.float32
  np.testing.assert_allclose(table, ref.sinusoidal(np.arange(50), 16), atol=1e-6)


def test_sinusoidal_shift_is_a_fixed_rotation():
  """PE(pos + k) = M_k PE(pos), M_k block-diagonal 2x2 rotations independent of pos (3.5)."""
  d, length = 16, 64
  table = sinusoidal_table(length, d).astype(np.float64)
  for k in (1, 5, 17):
    m = np.zeros((d, d))
    for i in range(d // 2):
      w = k / 10000.0 ** (2 * i / d)
      # [sin(a + w), cos(a + w)] = [[cos w, sin w], [-sin w, cos w]] [sin a, cos a]
      m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [
        [math.cos(w), math.sin(w)],
        [-math.sin(w), math.cos(w)],
      ]
    np.testing.assert_allclose(table[:-k] @ m.T, table[k:], atol=1e-5)
    np.testing.assert_allclose(m @ m.T, np.eye(d), atol=1e-12)  # a rotation


def test_sincos_2d_table_encodes_row_then_column():
  np.testing.assert_allclose(sincos_2d_table(3, 8), ref.sincos_2d(3, 8), atol=1e-6)
  with pytest.raises(ValueError, match="divisible by 4"):
    sincos_2d_table(3, 6)


class _Embed(nn.Module):
  """The embedding hook of one position kind, as `Embedder` calls it."""

  config: object

  @nn.compact
  def __call__(self, x, positions):
    return position_for(self.config).embed(self, x, positions)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_absolute_position_embedding_adds_the_table_row(
  kind, tiny_config, random_params, jit_apply
):
  module = _Embed(tiny_config(position=kind, max_len=12, d_model=8, num_heads=2))
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 5, 8)).astype(np.float32)
  positions = np.array([[0, 1, 2, 3, 4], [7, 8, 0, 1, 11]], np.int32)  # packed rows
  params = random_params(module, x, positions)
  out = jit_apply(module)(params, x, positions)
  table = (
    params["positions"]["embedding"] if kind == "learned" else ref.sinusoidal(np.arange(12), 8)
  )
  np.testing.assert_allclose(out, x + np.asarray(table, np.float64)[positions], **TOL)


@pytest.mark.parametrize("theta", [10_000.0, 500.0])
def test_rope_matches_complex_rotation(theta):
  rng = np.random.default_rng(1)
  x = rng.standard_normal((2, 6, 3, 8)).astype(np.float32)
  positions = np.array([[0, 1, 2, 3, 4, 5], [9, 10, 0, 1, 2, 300]], np.int32)
  out = jax.jit(apply_rope, static_argnums=2)(x, positions, theta)
  np.testing.assert_allclose(out, ref.rope(x.astype(np.float64), positions, theta), **TOL)
  np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_rope_scores_depend_only_on_the_offset():
  rng = np.random.default_rng(2)
  q = rng.standard_normal((1, 1, 1, 16)).astype(np.float32)
  k = rng.standard_normal((1, 1, 1, 16)).astype(np.float32)
  starts = np.arange(0, 60, 7)

  @jax.jit
  def scores(offset):
    pos_q = jnp.asarray(starts)[None, :]  # [1, P]
    qr = apply_rope(jnp.broadcast_to(q, (1, len(starts), 1, 16)), pos_q)
    kr = apply_rope(jnp.broadcast_to(k, (1, len(starts), 1, 16)), pos_q + offset)
    return jnp.einsum("BTNH,BTNH->T", qr, kr)  # one score per start position

  for offset in (0, 1, 3, 11):
    s = np.asarray(scores(offset))
    np.testing.assert_allclose(s, s[0], atol=1e-4)
  assert not np.isclose(scores(0)[0], scores(3)[0])  # but it does depend on the offset


def test_alibi_slopes_follow_the_paper():
  for n in range(1, 17):
    np.testing.assert_allclose(alibi_slopes(n), ref.alibi_slopes(n), rtol=1e-7)
  np.testing.assert_allclose(alibi_slopes(8), 2.0 ** -np.arange(1, 9))


def test_alibi_bias_is_minus_slope_times_distance():
  q_pos = np.array([[0, 1, 2, 3], [5, 6, 0, 1]])
  kv_pos = np.array([[0, 1, 2, 3, 4], [5, 6, 0, 1, 2]])
  bias = jax.jit(alibi_bias, static_argnums=2)(q_pos, kv_pos, 6)
  slopes = ref.alibi_slopes(6)
  expected = -slopes[None, :, None, None] * np.abs(q_pos[:, None, :, None] - kv_pos[:, None, None])
  assert bias.shape == (2, 6, 4, 5)
  np.testing.assert_allclose(bias, expected, rtol=1e-6)


T5_SETTINGS = [(32, 128), (8, 12), (16, 64), (6, 20), (64, 1000), (32, 17)]


def test_t5_buckets_match_t5_relative_position_bucket():
  relative = np.arange(-1200, 1201)

  @jax.jit
  def all_buckets(relative):
    return {
      (bi, nb, md): t5_relative_bucket(relative, bi, nb, md)
      for bi in (True, False)
      for nb, md in T5_SETTINGS
    }

  got = all_buckets(jnp.asarray(relative))
  reference = np.vectorize(ref.t5_relative_position_bucket)
  for (bi, nb, md), buckets in got.items():
    expected = reference(relative, bi, nb, md)
    np.testing.assert_array_equal(buckets, expected, err_msg=f"{bi} {nb} {md}")
    assert expected.min() == 0 and expected.max() == nb - 1  # every bucket is reachable


def test_t5_relative_bias_looks_up_its_table():
  table = np.random.default_rng(2).standard_normal((8, 3)).astype(np.float32)  # [buckets, N]
  pos = np.broadcast_to(np.arange(20), (1, 20))
  bias = jax.jit(t5_relative_bias, static_argnums=(3, 4))(table, pos, pos, True, 12)
  rel = pos[0][None, :] - pos[0][:, None]
  buckets = np.vectorize(ref.t5_relative_position_bucket)(rel, True, 8, 12)
  expected = table[buckets].transpose(2, 0, 1)[None]
  np.testing.assert_array_equal(bias, expected)


def test_shaw_relative_logits_clip_the_distance():
  rng = np.random.default_rng(3)
  q = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
  table = rng.standard_normal((2 * 2 + 1, 4)).astype(np.float32)
  q_pos = np.array([[0, 1, 2, 3, 4], [3, 4, 0, 1, 2]])
  kv_pos = np.array([[0, 1, 2, 3, 4, 5], [3, 4, 0, 1, 2, 9]])
  out = jax.jit(shaw_relative_logits)(q, table, q_pos, kv_pos)
  expected = np.zeros((2, 3, 5, 6))
  for b in range(2):
    for t in range(5):
      for s in range(6):
        a = table[min(max(kv_pos[b, s] - q_pos[b, t], -2), 2) + 2]  # a_{clip(j - i, k)}
        expected[b, :, t, s] = q[b, t].astype(np.float64) @ a
  np.testing.assert_allclose(out, expected, **TOL)


@pytest.mark.parametrize(
  "position, causal",
  [
    ("rope", True),
    ("alibi", False),
    ("relative_t5", False),
    ("relative_t5", True),
    ("relative_shaw", True),
  ],
)
def test_attention_with_each_relative_kind_matches_reference(
  tiny_config, random_params, jit_apply, position, causal
):
  """Packed rows: positions restart per segment, and the keys use them too."""
  c = tiny_config(position=position, num_kv_heads=2)
  rng = np.random.default_rng(4)
  b, t = 2, 9
  x = rng.standard_normal((b, t, c.d_model)).astype(np.float32)
  seg = np.array([[1] * 4 + [2] * 5, [1] * 9], np.int32)
  positions = np.array([list(range(4)) + list(range(5)), list(range(9))], np.int32)
  info = MaskInfo.create(jnp.asarray(seg), q_positions=jnp.asarray(positions), causal=causal)
  rel_table = None
  if position == "relative_t5":
    rel_table = (0.5 * rng.standard_normal((c.relative_num_buckets, c.num_heads))).astype(
      np.float32
    )
  module = MultiHeadAttention(c)
  params = random_params(module, x, None, info, rel_table)
  out = jit_apply(module)(params, x, None, info, rel_table)
  expected = reference_self_attention(params, x, c, seg, positions, causal, table=rel_table)
  np.testing.assert_allclose(out, expected, **TOL)


def test_the_registry_names_each_kind_once_with_its_hooks():
  kinds = ("sinusoidal", "learned", "rope", "alibi", "relative_t5", "relative_shaw", "none")
  assert tuple(POSITIONS) == kinds
  assert all(issubclass(kind, Position) for kind in POSITIONS.values())
  assert len(set(POSITIONS.values())) == len(kinds)
