"""Which attention kernel runs: the static options of a model's attention
(`AttentionOptions`), what the fused kernels accept, how 'auto' resolves (one rule,
`resolve_attention_impl`, applied once per config by `attention_options`), and which kernel
one call runs (`call_impl`: a fused kernel's fallbacks to 'xla').

Kernel rules live here, beside the kernels (`kernels.py`), rather than in the model
config: the config checks field values only, and a run checks these rules at its start.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from transformer.nn import splash
from transformer.nn.config import ATTENTION_IMPLS, ModelConfig
from transformer.nn.masks import MaskInfo
from transformer.nn.positions import POSITIONS, Position

CUDNN_DTYPES = ("bfloat16", "float16")  # cuDNN fused attention has no float32 kernels
CUDNN_MAX_HEAD_DIM = 256  # Hopper and later (128 before; checked where a run starts)
FUSED = ("cudnn", "splash")  # the kernels a backend must provide
KERNELS = tuple(impl for impl in ATTENTION_IMPLS if impl != "auto")  # what a call can run


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
  """How a model's attention computes, the same for every call: the kernel and its
  settings. What varies per call (masks, logit bias, dropout key, deterministic) is
  `kernels.dot_product_attention`'s arguments. `impl` is never 'auto': a config's 'auto'
  is resolved by `attention_options`.
  """

  impl: str = "xla"  # xla | jax | chunked | cudnn | splash (`kernels.py` says what each takes)
  chunk_size: int = 512  # query/key block size of 'chunked'
  scale: float | None = None  # score multiplier; None = H**-0.5 (T5: 1.0, unscaled)
  dropout_rate: float = 0.0  # dropout on the attention weights, in calls not deterministic
  ops: str = "fast"  # fast | plain (`transformer.ops`): dropout masks, causal query blocks
  splash_blocks: tuple[int, int] = (512, 512)  # (query, key) blocks of 'splash', multiples of 128
  softcap: float | None = None  # scores -> softcap * tanh(scores / softcap) (Gemma 2)
  context: str = "all_gather"  # under a mesh context axis: all_gather | ring (`nn/context.py`)

  def __post_init__(self):
    if self.impl == "auto":
      raise ValueError(
        "attention impl 'auto' names no kernel; attention_options(config)"
        " resolves it for this backend"
      )
    if self.impl not in KERNELS:
      known = ", ".join(KERNELS)
      raise ValueError(f"unknown attention impl {self.impl!r}; expected one of {known}")


@functools.cache
def attention_options(config: ModelConfig) -> AttentionOptions:
  """The attention options of `config`'s model on this backend ('auto' resolved by
  `resolve_attention_impl`), built once per config."""
  impl, _ = resolve_attention_impl(config)
  return AttentionOptions(
    impl=impl,
    chunk_size=config.attention_chunk_size,
    scale=config.attention_scale,
    dropout_rate=config.attention_dropout_rate,
    ops=config.ops,
    splash_blocks=(config.splash_block_q, config.splash_block_kv),
    softcap=config.attention_softcap,
    context=config.context_attention,
  )


def fused_attention_problem(c: ModelConfig, impl: str) -> str | None:
  """Why the fused kernel `impl` ('cudnn' or 'splash') cannot run config `c`, or None.

  What the backend decides (a GPU or TPU present, cuDNN's head-dim limit before Hopper)
  is checked where a run starts, `resolve_attention_impl`.
  """
  name = {"cudnn": "cuDNN attention", "splash": "splash attention"}[impl]
  if c.attention_dropout_rate > 0.0:
    return f"{name} has no attention dropout (attention_dropout_rate={c.attention_dropout_rate})"
  if impl == "cudnn":
    if c.dtype not in CUDNN_DTYPES:
      return f"{name} needs dtype {' or '.join(CUDNN_DTYPES)}, got {c.dtype!r}"
    if c.head_dim % 8 or c.head_dim > CUDNN_MAX_HEAD_DIM:
      return (
        f"{name} needs a head dim that is a multiple of 8 and <= {CUDNN_MAX_HEAD_DIM},"
        f" got {c.head_dim}"
      )
  if c.attention_softcap is not None:
    return f"{name} is not wired for attention_softcap={c.attention_softcap} here"
  if impl == "splash" and adds_logit_bias(c):
    return f"{name} takes no logit bias and position={c.position!r} adds one"
  return None


def adds_logit_bias(c: ModelConfig) -> bool:
  """Whether the position encoding adds a bias to the attention logits (ALiBi, T5, Shaw)."""
  return POSITIONS[c.position].bias is not Position.bias


def resolve_attention_impl(config: ModelConfig) -> tuple[str, str]:
  """The implementation `config`'s model uses on this backend, and why (a line to print):
  the one rule for 'auto', applied by `attention_options` and where a run starts.

  'auto' becomes 'cudnn' on an NVIDIA GPU and 'splash' on a TPU where the config allows
  it (`config.fused_attention_problem`; on the GPU also no logit bias, which cuDNN would
  add in the compute dtype, and this GPU's head-dim limit), else 'xla' (always on the
  CPU). An explicit 'cudnn' or 'splash' whose backend is missing is a one-line
  `ValueError`, raised here before anything compiles. Other choices stay as configured.
  """
  impl, platform = config.attention_impl, jax.default_backend()
  if impl in FUSED:
    problem = _backend_problem(impl, platform, config.head_dim)
    if problem:
      raise ValueError(f"ModelConfig.attention_impl={impl!r}: {problem}; use 'auto'")
    return impl, f"as configured, backend {platform}"
  if impl != "auto":
    return impl, "as configured"
  fused = {"gpu": "cudnn", "tpu": "splash"}.get(platform)
  if fused is None:
    return "xla", f"auto, backend {platform}"
  problem = fused_attention_problem(config, fused) or _backend_problem(
    fused, platform, config.head_dim
  )
  if fused == "cudnn" and problem is None and adds_logit_bias(config):
    problem = f"position={config.position!r} adds a logit bias (kept in float32 by 'xla')"
  if problem:
    return "xla", f"auto, backend {platform}; not {fused}: {problem}"
  return fused, f"auto, backend {platform}"


def call_impl(impl, q, k, mask, mask_info, bias, use_dropout, return_weights) -> str:
  """The implementation this call runs: `impl` (never 'auto'), a fused kernel's missing
  backend or unsupported input refused in one line, and its fallbacks to 'xla' (weights
  requested, cached decoding; for splash also a dense mask or a prefix)."""
  if impl not in FUSED:
    return impl
  problem = _backend_problem(impl, jax.default_backend(), q.shape[-1]) or _input_problem(
    impl, q, bias, use_dropout
  )
  if problem:
    raise ValueError(f"attention_impl={impl!r}: {problem}")
  if return_weights or _decoding(mask_info, q.shape[1], k.shape[1]):
    return "xla"
  if impl == "splash" and (mask is not None or _has_prefix(mask_info)):
    return "xla"
  return impl


def _backend_problem(impl: str, platform: str, head_dim: int) -> str | None:
  """Why this backend cannot run the fused kernel `impl`, or None."""
  if impl == "splash":
    if splash.available(platform):
      return None
    return f"splash attention needs a TPU (Pallas), and this run's backend is {platform}"
  capability = _cuda_capability() if platform == "gpu" else None
  if capability is None:
    return f"cuDNN attention needs an NVIDIA GPU, and this run's backend is {platform}"
  if capability < (9, 0) and head_dim > 128:
    return f"cuDNN attention before Hopper takes head dims <= 128, got {head_dim}"
  return None


def _input_problem(impl: str, q: jax.Array, bias, use_dropout: bool) -> str | None:
  """Why the fused kernel `impl` cannot take this call's inputs, or None."""
  name = {"cudnn": "cuDNN attention", "splash": "splash attention"}[impl]
  if use_dropout:
    return f"{name} has no attention dropout"
  if impl == "splash" and bias is not None:
    return f"{name} takes no logit bias"
  h = q.shape[-1]
  if impl == "cudnn" and jnp.dtype(q.dtype).name not in CUDNN_DTYPES:
    return f"{name} needs {' or '.join(CUDNN_DTYPES)} inputs, got {jnp.dtype(q.dtype).name}"
  if impl == "cudnn" and (h % 8 or h > CUDNN_MAX_HEAD_DIM):
    return f"{name} needs a head dim that is a multiple of 8 and <= {CUDNN_MAX_HEAD_DIM}, got {h}"
  return None


def _cuda_capability() -> tuple[int, int] | None:
  """The first GPU's CUDA compute capability, or None when it is not an NVIDIA GPU."""
  try:
    major, minor = str(jax.devices("gpu")[0].compute_capability).split(".")[:2]
    return int(major), int(minor)
  except (RuntimeError, AttributeError, ValueError):
    return None


def _starts_at_key_zero(info: MaskInfo, t: int, s: int) -> bool:
  """Whether query 0 sits at key index 0 (q_offset 0), as the fused kernels' static masks
  assume. Cached decoding sets q_offset to the cache index, a traced value; `nn.remat`
  traces the 0 of a full pass as well. A traced offset counts as 0 when T == S: the cache
  holds max_len keys, and a call whose queries fill it starts at index 0."""
  offset = info.q_offset
  if isinstance(offset, jax.core.Tracer):
    return t == s
  return int(offset) == 0


def _has_prefix(info: MaskInfo | None) -> bool:
  return info is not None and info.q_prefix is not None


def _decoding(info: MaskInfo | None, t: int, s: int) -> bool:
  """A causal or windowed mask whose query offset the fused kernels cannot take."""
  if info is None or not (info.causal or info.window is not None):
    return False
  return not _starts_at_key_zero(info, t, s)
