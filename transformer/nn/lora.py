"""LoRA (Hu et al. 2021): low-rank adapters on the dense projections, and their merge.

A projection whose path matches one of `config.lora_targets` (regular expressions, found
anywhere in the path with `re.search`) computes

  y = x W + b + (alpha / r) (x A) B,    A = lora_a [D_in, r],  B = lora_b [r, D_out],

beside its kernel ('decoder/layer_0/self_attention/query/kernel' gets '.../query/lora_a'
and '.../query/lora_b'). D_in and D_out are the kernel's input and output sizes,
flattened: the attention query / key / value kernels [D, N, H] map D -> r -> N*H, the
output kernel [N, H, D] maps N*H -> r -> D, a dense kernel [D_in, D_out] is itself. The
paths are those of `tree.path_str` without the leaf: 'query', 'value', 'self_attention/out',
'ffn/(wi|wo)', 'layer_[01]/' select by module or layer. A starts as PEFT's (uniform in
+-1/sqrt(D_in)), B as zeros, so a model with fresh adapters computes exactly its base
function. Expert weights of a mixture of experts get no adapters.

Training only the adapters is the optimizer's job (`trainable`, used by
`train.optimizer.create_optimizer`): the base weights get zero updates, except the
parameters matching `config.lora_trainable` (by default new classification heads). The
base weights come from `init_from` like any others. `merge_lora` folds the adapters into
the kernels (W + alpha/r A B) for export (`convert.save`) and decoding (`eval.py
--merge_lora`).
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn import tree
from transformer.nn.config import ModelConfig, fail

A_INIT = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")  # +-1/sqrt(D_in)
ADAPTERS = ("lora_a", "lora_b")  # the adapters' parameter names


def scale(config: ModelConfig) -> float:
  """alpha / r, the adapter's output multiplier."""
  return config.lora_alpha / config.lora_rank


def targets(config: ModelConfig, path: str) -> bool:
  """Whether the projection at module path `path` ('a/b/query') gets an adapter."""
  return config.lora_rank > 0 and any(re.search(p, path) for p in config.lora_targets)


def adapt(
  module: nn.Module, config: ModelConfig, x: jax.Array, y: jax.Array, in_dims: int
) -> jax.Array:
  """y + alpha/r (x A) B when `module` (a projection x -> y, inside its call) is targeted.

  x [..., *in] (the last `in_dims` axes are contracted), y [..., *out]."""
  if not targets(config, "/".join(module.path)):
    return y
  lead = x.shape[: x.ndim - in_dims]
  d_in, d_out = math.prod(x.shape[x.ndim - in_dims :]), math.prod(y.shape[len(lead) :])
  r = config.lora_rank
  a = module.param("lora_a", A_INIT, (d_in, r))  # [D_in, r]
  b = module.param("lora_b", nn.initializers.zeros, (r, d_out))  # [r, D_out]
  xa = x.reshape(*lead, d_in) @ a.astype(y.dtype)  # [..., r]
  delta = (xa @ b.astype(y.dtype)).reshape(y.shape)  # [..., *out]
  return y + jnp.asarray(scale(config), y.dtype) * delta


def adapted_paths(params: Any) -> list[str]:
  """Module paths ('a/b/query') of the projections that hold adapters in `params`."""
  paths = []
  for keypath, _ in jax.tree_util.tree_leaves_with_path(params):
    names = tree.path_names(keypath)
    if names and names[-1] == "lora_a":
      paths.append("/".join(names[:-1]))
  return paths


def check_targets(config: ModelConfig, params: Any) -> None:
  """Every `lora_targets` pattern adapts some projection of `params` (shapes suffice).

  Raises the one-line `ValueError` naming the pattern, and the projections there are."""
  if not config.lora_rank:
    return
  adapted = adapted_paths(params)
  for pattern in config.lora_targets:
    if not any(re.search(pattern, p) for p in adapted):
      kernels = sorted(
        {
          tree.path_names(k)[-2]
          for k, _ in jax.tree_util.tree_leaves_with_path(params)
          if tree.path_names(k)[-1] == "kernel" and "moe" not in tree.path_names(k)
        }
      )
      fail(
        "lora_targets",
        config.lora_targets,
        f"pattern {pattern!r} matches no projection of this model (projections: "
        f"{', '.join(kernels)}; patterns search paths like 'decoder/layer_0/self_attention/query')",
      )


def trainable(config: ModelConfig, params: Any) -> Any:
  """With adapters (lora_rank > 0): a pytree of bools like `params`, True for the adapters
  and for the parameters whose path matches `config.lora_trainable`; else None (every
  parameter trains)."""
  if not config.lora_rank:
    return None

  def decide(keypath, _):
    names = tree.path_names(keypath)
    path = "/".join(names)
    return names[-1] in ADAPTERS or any(re.search(p, path) for p in config.lora_trainable)

  return jax.tree_util.tree_map_with_path(decide, params)


def without_adapters(params: Any) -> Any:
  """`params` without the adapters: the base model's parameters (the same arrays)."""
  if not hasattr(params, "items"):
    return params
  return {k: without_adapters(v) for k, v in params.items() if k not in ADAPTERS}


def trains_base(config: ModelConfig, params: Any) -> list[str]:
  """Paths of the base parameters that `config.lora_trainable` trains beside the adapters."""
  marks = trainable(config, params)
  if marks is None:
    return []
  names = [(tree.path_names(k), t) for k, t in jax.tree_util.tree_leaves_with_path(marks)]
  return ["/".join(n) for n, t in names if t and n[-1] not in ADAPTERS]


def merge_lora(params: Any, config: ModelConfig) -> tuple[Any, ModelConfig]:
  """(params with every adapter folded into its kernel, W + alpha/r A B, and the adapters
  removed; config with lora_rank=0): the same function as a plain model.

  `params` is the inner tree (no 'params' key); kernels stacked by nn.scan (a leading
  layer axis on kernel, A and B) are merged layer by layer. Computed in float32.
  """
  if not config.lora_rank:
    return params, config
  factor = scale(config)

  def merge(node: Any) -> Any:
    if not isinstance(node, dict) and not hasattr(node, "items"):
      return node
    node = dict(node.items())
    if "lora_a" in node:
      node["kernel"] = _merged(node["kernel"], node.pop("lora_a"), node.pop("lora_b"), factor)
    return {k: merge(v) for k, v in node.items()}

  return merge(params), config.replace(lora_rank=0)


@functools.partial(jax.jit, static_argnames="factor")
def _merged(kernel: jax.Array, a: jax.Array, b: jax.Array, factor: float) -> jax.Array:
  """kernel + factor * A B, A [..., D_in, r], B [..., r, D_out] reshaped like the kernel."""
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  delta = jnp.einsum("...ir,...ro->...io", a, b).reshape(kernel.shape)  # like the kernel
  return (jnp.asarray(kernel, jnp.float32) + factor * delta).astype(kernel.dtype)


def adapter_params(params: Any) -> int:
  """The number of adapter parameters (lora_a, lora_b) in `params`."""
  return sum(
    math.prod(leaf.shape)
    for keypath, leaf in jax.tree_util.tree_leaves_with_path(params)
    if tree.path_names(keypath)[-1] in ADAPTERS
  )
