"""The fused attention implementations against the 'xla' reference (itself checked against
float64 NumPy in test_attention.py): splash in Pallas interpret mode on the CPU, forward
and gradients, with causal, sliding-window and segment masks, MHA / GQA / MQA, sharded
under a mesh and inside a model; 'auto' on the CPU (exactly 'xla'); and the one-line
refusals (cuDNN without a GPU, splash with a position bias, the kernels' other limits).

Splash blocks are multiples of 128, so the smallest shapes that exercise block skipping
are 256 long with blocks of 128; a length of 200 checks the padding to a block multiple.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny_lm_config
from conftest import make_random_params, make_tiny_config

from transformer.nn import kernel_rules, kernels, partitioning, splash
from transformer.nn.config import ModelConfig
from transformer.nn.masks import MaskInfo
from transformer.nn.models import build_model, check
from transformer.train import loop


@pytest.fixture
def interpret(monkeypatch):
  monkeypatch.setattr(splash, "INTERPRET", True)


def _segments(rng, b, length, pad=0):
  """Packed segment ids [B, L]: sorted ids 1..3, the last `pad` positions padding (0)."""
  ids = np.sort(rng.integers(1, 4, (b, length)), axis=1)
  if pad:
    ids[:, -pad:] = 0
  return jnp.asarray(ids, jnp.int32)


def _inputs(b, t, s, n, kv, h, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(0.5 * rng.standard_normal((b, t, n, h)), jnp.float32)
  k = jnp.asarray(0.5 * rng.standard_normal((b, s, kv, h)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((b, s, kv, h)), jnp.float32)
  cotangent = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32)
  return rng, (q, k, v), cotangent


def _forward_and_grads(impl, qkv, cotangent, info, mesh=None):
  """(output, (dq, dk, dv)) of dot_product_attention, jitted."""

  def attend(q, k, v):
    return kernels.dot_product_attention(
      q, k, v, info, kernel_rules.AttentionOptions(impl, splash_blocks=(128, 128))
    )

  def run(q, k, v):
    out, vjp = jax.vjp(attend, q, k, v)
    return out, vjp(cotangent)

  with partitioning.activation_layout(mesh) if mesh is not None else contextlib.nullcontext():
    traced = jax.jit(run).trace(*qkv)
    kernel_calls = str(traced.jaxpr).count("pallas_call")
    assert (kernel_calls > 0) == (impl == "splash"), kernel_calls  # no silent fallback
    return traced.lower().compile()(*qkv)


def _assert_matches_xla(qkv, cotangent, info, mesh=None):
  out, grads = _forward_and_grads("splash", qkv, cotangent, info, mesh)
  ref_out, ref_grads = _forward_and_grads("xla", qkv, cotangent, info, mesh)
  np.testing.assert_allclose(out, ref_out, atol=1e-5, rtol=0)
  for name, g, ref in zip("qkv", grads, ref_grads, strict=True):
    np.testing.assert_allclose(g, ref, atol=1e-4, rtol=0, err_msg=f"d{name}")


# (name, B, T, S, N, K, causal, window, segments: None | 'packed' (self) | 'cross')
SPLASH_CASES = [
  ("causal-mha", 1, 256, 256, 4, 4, True, None, None),
  ("causal-window-gqa-packed-padded-length", 2, 200, 200, 4, 2, True, 48, "packed"),
  ("bidirectional-mqa-packed", 1, 256, 256, 4, 1, False, None, "packed"),
  ("bidirectional-window-gqa", 1, 256, 256, 4, 2, False, 40, None),
  ("cross-mqa-packed", 2, 130, 250, 4, 1, False, None, "cross"),
]


@pytest.mark.parametrize("case", SPLASH_CASES, ids=[c[0] for c in SPLASH_CASES])
def test_splash_matches_xla(case, interpret):
  _, b, t, s, n, kv, causal, window, segments = case
  rng, qkv, cotangent = _inputs(b, t, s, n, kv, 32)
  if segments == "cross":  # every query's segment has keys (no fully masked row)
    q_seg, kv_seg = _segments(rng, b, t), _segments(rng, b, s)
    q_seg = q_seg.at[:, 0].set(1).at[:, -1].set(3)
    kv_seg = kv_seg.at[:, 0].set(1).at[:, -1].set(3)
    info = MaskInfo.create(q_seg, kv_seg)
  elif segments == "packed":
    info = MaskInfo.create(_segments(rng, b, t, pad=5), causal=causal, window=window)
  else:
    info = MaskInfo.create(jnp.ones((b, t), jnp.int32), causal=causal, window=window)
    info = info.replace(q_segment_ids=None, kv_segment_ids=None)
  _assert_matches_xla(qkv, cotangent, info)


def test_splash_runs_per_shard_under_a_mesh_and_matches_xla(interpret):
  """Batch over data x fsdp, heads over tensor (GQA: each shard holds whole groups)."""
  mesh = partitioning.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  rng, qkv, cotangent = _inputs(4, 256, 256, 4, 2, 32, seed=1)
  info = MaskInfo.create(_segments(rng, 4, 256), causal=True)

  def attend(q, k, v):
    with partitioning.activation_layout(mesh):
      return kernels.dot_product_attention(
        q, k, v, info, kernel_rules.AttentionOptions("splash", splash_blocks=(128, 128))
      )

  jaxpr = jax.make_jaxpr(attend)(*qkv)
  maps = [e for e in jaxpr.eqns if e.primitive.name == "shard_map"]
  assert len(maps) == 1
  q_spec = maps[0].params["in_specs"][-5]  # q, k, v, q segments, kv segments come last
  assert tuple(q_spec) == (("data", "fsdp"), "tensor", None, None)
  _assert_matches_xla(qkv, cotangent, info, mesh)


def test_splash_inside_a_model_matches_xla(interpret):
  """A packed decoder (RoPE, GQA, sliding window): logits equal those of 'xla'."""
  c = make_tiny_config(position="rope", num_kv_heads=2, sliding_window=6, attention_impl="splash")
  tokens = jnp.asarray(np.random.default_rng(2).integers(1, 40, (2, 16)), jnp.int32)
  segments = jnp.asarray([[1] * 9 + [2] * 7, [1] * 12 + [0] * 4], jnp.int32)
  model = build_model(c)
  params = make_random_params(model, tokens)

  def logits(config):
    m = build_model(config)
    return jax.jit(lambda p: m.apply({"params": p}, tokens, segment_ids=segments))(params)

  apply = lambda p: model.apply({"params": p}, tokens, segment_ids=segments)
  assert "pallas_call" in str(jax.make_jaxpr(apply)(params))
  np.testing.assert_allclose(
    logits(c), logits(c.replace(attention_impl="xla")), atol=1e-5, rtol=1e-5
  )


def test_fused_kernels_use_xla_where_they_cannot_apply(interpret):
  """The documented fallbacks, decided at trace time: weights requested, a prefix-LM or a
  dense mask (splash), and cached decoding, whose query offset is a traced cache index.
  A traced offset with T == S (`nn.remat` traces the 0 of a full pass) keeps the kernel."""
  q16, q1, k = jnp.zeros((1, 16, 4, 32)), jnp.zeros((1, 1, 4, 32)), jnp.zeros((1, 16, 4, 32))
  seg = jnp.ones((1, 16), jnp.int32)
  full = MaskInfo.create(seg, causal=True)

  def impl(q, info, mask=None, weights=False):
    return kernel_rules.call_impl("splash", q, k, mask, info, None, False, weights)

  def traced(q, info_at):
    seen = []
    jax.make_jaxpr(lambda offset: seen.append(impl(q, info_at(offset))) or offset)(0)
    return seen[0]

  def step(offset):  # one query at key index `offset`, as the KV cache builds it
    return MaskInfo(seg[:, :1], seg, seg[:, :1], seg, offset, causal=True)

  assert impl(q16, full) == "splash"
  assert impl(q16, full, weights=True) == "xla"
  assert impl(q16, MaskInfo.create(seg, causal=True, prefix=jnp.zeros((1, 16), bool))) == "xla"
  assert impl(q16, full, mask=jnp.ones((1, 1, 16, 16), bool)) == "xla"
  assert impl(q1, step(0)) == "splash"  # a static offset 0: the kernel's static mask
  assert traced(q1, step) == "xla"  # a decoding step
  assert traced(q16, lambda offset: full.replace(q_offset=offset)) == "splash"


def _program(config: ModelConfig) -> str:
  """The jaxpr of a training-mode forward pass (dropout on) of `config`'s model."""
  model = build_model(config)
  tokens = jnp.ones((2, 16), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens))["params"]
  rngs = {"dropout": jax.random.key(1)}
  apply = lambda p: model.apply({"params": p}, tokens, deterministic=False, rngs=rngs)
  return str(jax.make_jaxpr(apply)(params))


def test_auto_is_the_default_and_exactly_xla_on_the_cpu():
  """'auto' resolves to 'xla' here, and the traced program is the one 'xla' gives."""
  assert ModelConfig().attention_impl == "auto"
  assert kernel_rules.resolve_attention_impl(ModelConfig())[0] == "xla"
  assert kernel_rules.resolve_attention_impl(ModelConfig(attention_impl="chunked"))[0] == "chunked"
  assert kernel_rules.attention_options(ModelConfig()).impl == "xla"
  with pytest.raises(ValueError, match="'auto' names no kernel"):
    kernel_rules.AttentionOptions("auto")
  for overrides in (
    dict(position="rope", num_kv_heads=2),
    dict(position="alibi", attention_dropout_rate=0.1, dtype="bfloat16"),
  ):
    c = make_tiny_config(**overrides)
    assert _program(c) == _program(c.replace(attention_impl="xla"))


def _one_line_error(fn, *phrases):
  with pytest.raises(ValueError) as e:
    fn()
  message = str(e.value)
  assert "\n" not in message, message
  for phrase in phrases:
    assert phrase in message, message


def test_cudnn_without_a_gpu_is_a_one_line_error_before_compiling(tmp_path):
  c = ModelConfig(attention_impl="cudnn", dtype="bfloat16")  # valid: the config cannot
  _one_line_error(  # see the backend; the run's start can
    lambda: kernel_rules.resolve_attention_impl(c),
    "ModelConfig.attention_impl='cudnn'",
    "NVIDIA GPU",
    "backend is cpu",
  )
  q = jnp.zeros((1, 8, 4, 32), jnp.bfloat16)
  cudnn = kernel_rules.AttentionOptions("cudnn")
  _one_line_error(lambda: kernels.dot_product_attention(q, q, q, None, cudnn), "NVIDIA GPU")
  config = tiny_lm_config.get_config()
  config.model.update(attention_impl="cudnn", dtype="bfloat16")
  _one_line_error(lambda: loop.train_and_evaluate(config, str(tmp_path)), "NVIDIA GPU")


def test_splash_without_a_tpu_is_a_one_line_error():
  c = ModelConfig(attention_impl="splash")
  _one_line_error(lambda: kernel_rules.resolve_attention_impl(c), "needs a TPU", "backend is cpu")


@pytest.mark.parametrize(
  "overrides, phrases",
  [
    (dict(attention_impl="splash", position="alibi"), ("takes no logit bias", "'alibi'")),
    (dict(attention_impl="splash", position="relative_shaw"), ("takes no logit bias",)),
    (dict(attention_impl="splash", attention_dropout_rate=0.1), ("no attention dropout",)),
    (dict(attention_impl="cudnn"), ("bfloat16 or float16", "'float32'")),
    (dict(attention_impl="cudnn", dtype="bfloat16", attention_dropout_rate=0.1), ("dropout",)),
    (dict(attention_impl="cudnn", dtype="bfloat16", d_model=40, num_heads=4), ("got 10",)),
  ],
)
def test_fused_kernels_refuse_what_they_cannot_do_at_validation(overrides, phrases):
  field = "ModelConfig.attention_impl=" + repr(overrides["attention_impl"])
  _one_line_error(lambda: check(ModelConfig(**overrides)), field, *phrases)


@pytest.mark.parametrize("field", ["splash_block_q", "splash_block_kv"])
@pytest.mark.parametrize("value", [0, 100, 64, -128, 128.0, True])
def test_splash_block_sizes_are_multiples_of_128(field, value):
  _one_line_error(lambda: ModelConfig(**{field: value}), f"ModelConfig.{field}=", "multiple of 128")


def test_splash_blocks_shrink_to_short_sequences_and_pad_the_rest():
  assert splash.blocks_for(16, 512) == (128, 128)
  assert splash.blocks_for(300, 512) == (384, 384)
  assert splash.blocks_for(700, 512) == (512, 1024)
  assert splash.blocks_for(1024, 256) == (256, 1024)


@pytest.mark.parametrize("window", [None, 48])
def test_splash_under_context_parallelism_matches_xla_on_one_device(interpret, window):
  """All-gather context parallelism with splash: each device's queries (context 2) over
  the gathered keys, batch over data, heads over tensor; GQA, packed causal rows."""
  mesh = partitioning.make_mesh({"context": 2, "data": 2, "tensor": 2})
  rng, qkv, cotangent = _inputs(2, 256, 256, 4, 2, 32, seed=3)
  info = MaskInfo.create(_segments(rng, 2, 256, pad=7), causal=True, window=window)

  def attend(q, k, v):
    with partitioning.activation_layout(mesh):
      return kernels.dot_product_attention(
        q, k, v, info, kernel_rules.AttentionOptions("splash", splash_blocks=(128, 128))
      )

  maps = [e for e in jax.make_jaxpr(attend)(*qkv).eqns if e.primitive.name == "shard_map"]
  q_specs = [tuple(spec) for spec in maps[0].params["in_specs"] if len(spec) == 4]
  assert ("data", "tensor", "context", None) in q_specs  # each device: its own queries
  out, grads = _forward_and_grads("splash", qkv, cotangent, info, mesh)
  ref_out, ref_grads = _forward_and_grads("xla", qkv, cotangent, info)
  np.testing.assert_allclose(out, ref_out, atol=1e-5, rtol=0)
  for name, g, ref in zip("qkv", grads, ref_grads, strict=True):
    np.testing.assert_allclose(g, ref, atol=1e-4, rtol=0, err_msg=f"d{name}")
