"""Norms, dense layers, dropout, the feed-forward block and token embeddings.

Letters: B batch, T length, D model dim, F feed-forward hidden dim, V vocabulary.
Parameters are float32; computation runs in `config.dtype` (norm statistics in float32).
Dense layers and dropout take their kernels from `transformer.ops` (`config.ops`); with
`config.lora_rank` > 0 they are `LoRADense` / `LoRADenseGeneral`, which add a low-rank
adapter where their path matches `config.lora_targets` (`lora.py`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn import lora
from transformer.nn.config import ModelConfig
from transformer.nn.positions import position_for
from transformer.ops import select

DENSE_INIT = nn.initializers.xavier_uniform()


def compute_dtype(config: ModelConfig) -> jnp.dtype:
  return jnp.dtype(config.dtype)


class PlusOneRMSNorm(nn.Module):
  """RMSNorm scaled by (1 + scale), scale [D] initialised to 0 (Gemma): x / sqrt(mean(x^2)
  + eps) * (1 + scale), all in float32, then cast to `dtype`."""

  epsilon: float
  dtype: jnp.dtype

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.initializers.zeros, (x.shape[-1],))  # [D]
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.epsilon)
    return (y * (1.0 + scale)).astype(self.dtype)


def rms_norm(config: ModelConfig, name: str | None = None) -> nn.Module:
  """RMSNorm (Zhang & Sennrich 2019: scale only, no mean subtraction) over the last axis;
  its scale applied as (1 + scale) with `config.norm_scale_plus_one`."""
  if config.norm_scale_plus_one:
    return PlusOneRMSNorm(config.norm_eps, compute_dtype(config), name=name)
  return nn.RMSNorm(epsilon=config.norm_eps, dtype=compute_dtype(config), name=name)


NORMS = {
  # Ba et al. 2016: scale and bias (no bias with `norm_bias=False`, ModernBERT); the
  # two-pass variance (`use_fast_variance=False`).
  "layernorm": lambda c, name: nn.LayerNorm(
    epsilon=c.norm_eps,
    dtype=compute_dtype(c),
    use_bias=c.norm_bias,
    use_fast_variance=False,
    name=name,
  ),
  "rmsnorm": rms_norm,
}


def make_norm(config: ModelConfig, name: str | None = None) -> nn.Module:
  """LayerNorm (scale and, with `norm_bias`, bias) or RMSNorm (scale only), statistics in
  float32."""
  return NORMS[config.norm](config, name)


class LoRADense(nn.Dense):
  """`nn.Dense` plus a LoRA adapter when its path matches `lora_config.lora_targets`."""

  lora_config: ModelConfig | None = None

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    return lora.adapt(self, self.lora_config, inputs, super().__call__(inputs), 1)


class LoRADenseGeneral(nn.DenseGeneral):
  """`nn.DenseGeneral` plus a LoRA adapter when its path matches `lora_config.lora_targets`."""

  lora_config: ModelConfig | None = None

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    in_dims = len(self.axis) if isinstance(self.axis, tuple) else 1
    return lora.adapt(self, self.lora_config, inputs, super().__call__(inputs), in_dims)


def make_dense(
  config: ModelConfig,
  features: int,
  name: str | None = None,
  *,
  use_bias: bool | None = None,
  kernel_init: nn.initializers.Initializer = DENSE_INIT,
) -> nn.Dense:
  """A dense layer [..., D_in] -> [..., features] on the `config.ops` contraction.

  use_bias: None = `config.use_bias` (the projections); heads pass their own.
  """
  extra = {"lora_config": config} if config.lora_rank else {}
  return (LoRADense if config.lora_rank else nn.Dense)(
    features,
    use_bias=config.use_bias if use_bias is None else use_bias,
    dtype=compute_dtype(config),
    kernel_init=kernel_init,
    dot_general=select(config.ops).dot_general,
    name=name,
    **extra,
  )


def make_dense_general(
  config: ModelConfig,
  features: int | tuple[int, ...],
  name: str,
  *,
  use_bias: bool,
  axis: int | tuple[int, ...] = -1,
) -> nn.DenseGeneral:
  """A projection contracting `axis` of x into `features` (the attention heads'
  [D] -> [N, H] and [N, H] -> [D]), xavier-uniform kernels, on the `config.ops` contraction."""
  extra = {"lora_config": config} if config.lora_rank else {}
  return (LoRADenseGeneral if config.lora_rank else nn.DenseGeneral)(
    features,
    axis=axis,
    use_bias=use_bias,
    dtype=compute_dtype(config),
    kernel_init=DENSE_INIT,
    dot_general=select(config.ops).dot_general,
    name=name,
    **extra,
  )


def make_dropout(config: ModelConfig, rate: float | None = None) -> nn.Dropout:
  """Dropout at `rate` (default `config.dropout_rate`) with the `config.ops` masks."""
  return select(config.ops).dropout(config.dropout_rate if rate is None else rate)


ACTIVATIONS = {
  "relu": nn.relu,
  "gelu": lambda x: nn.gelu(x, approximate=False),
  "gelu_tanh": lambda x: nn.gelu(x, approximate=True),  # GPT-2 (Hendrycks & Gimpel 2016)
  "silu": nn.silu,  # x * sigmoid(x), ungated (Marian's `swish`)
  "swiglu": nn.silu,  # gate activation of SwiGLU (Shazeer 2020)
  "geglu": lambda x: nn.gelu(x, approximate=False),  # gate activation of GeGLU
  "geglu_tanh": lambda x: nn.gelu(x, approximate=True),  # GeGLU, tanh GELU (T5 v1.1)
}


class FeedForward(nn.Module):
  """Position-wise feed-forward: wo(act(wi x)), or wo(act(wi_0 x) * wi_1 x) for GLU variants.

  Hidden-size convention: `config.d_ff` is the hidden width F actually used. A gated unit
  has three D x F matrices instead of two, so to match a 4*D two-matrix FFN's parameters
  set F = 2/3 * 4 * D (`sizes.gated_hidden_size`, the 2/3 rule of Shazeer 2020 / LLaMA).
  Dropout on the hidden activations uses `config.dropout_rate`.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    c = self.config
    act = ACTIVATIONS[c.activation]
    if c.gated:
      h = act(make_dense(c, c.d_ff, "wi_0")(x)) * make_dense(c, c.d_ff, "wi_1")(x)  # [B, T, F]
    else:
      h = act(make_dense(c, c.d_ff, "wi")(x))  # [B, T, F]
    h = make_dropout(c)(h, deterministic=deterministic)
    return make_dense(c, c.d_model, "wo")(h)  # [B, T, D]


def make_embed(config: ModelConfig, num_embeddings: int, name: str | None = None) -> nn.Embed:
  """Token embedding table [V, D], init normal(D**-0.5); `.attend(x)` gives x @ E^T logits."""
  return nn.Embed(
    num_embeddings,
    config.d_model,
    embedding_init=nn.initializers.normal(stddev=config.d_model**-0.5),
    dtype=compute_dtype(config),
    name=name,
  )


class Embedder(nn.Module):
  """Token embedding (times sqrt(D) and `embedding_multiplier` if configured) + absolute
  positions, (a norm,) then dropout.

  `embed` is the token table, owned by the model so that inputs, targets and output
  logits can share it. tokens, positions: [B, T] ints -> [B, T, D].
  """

  config: ModelConfig
  embed: nn.Module
  dropout: bool = True  # False: the caller applies dropout after adding more embeddings
  norm: bool = False  # a norm 'embed_norm' on the sum, before dropout (BART's layernorm_embedding)

  @nn.compact
  def __call__(self, tokens: jax.Array, positions: jax.Array, deterministic: bool) -> jax.Array:
    c = self.config
    x = self.embed(tokens)  # [B, T, D]
    if c.scale_embeddings:
      x = x * jnp.asarray(c.d_model**0.5, x.dtype)
    if c.embedding_multiplier != 1:
      x = x * jnp.asarray(c.embedding_multiplier, x.dtype)
    x = position_for(c).embed(self, x, positions)  # [B, T, D]
    if self.norm:
      x = make_norm(c, "embed_norm")(x)
    if self.dropout:
      x = make_dropout(c)(x, deterministic=deterministic)
    return x


def default_positions(tokens: jax.Array) -> jax.Array:
  """Positions 0..T-1 for every row: [B, T] -> int32 [B, T]."""
  return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
