"""Shared test set-up: eight fake CPU devices, a session compilation cache, tiny configs,
random parameters, jitted apply.

The XLA flags and the cache must be set before JAX starts, so they come first
(tests/session_env.py: eight devices, the CPU vector width `train.py` sets, so results
computed here and in `train.py` subprocesses round identically, and any flag the caller
gave, such as `make test-isa`'s ISA cap). Fixtures:

  tiny_config(family='decoder', **overrides) -> ModelConfig   a small valid config
  random_params(module, *args, seed=0, method=None, **kwargs) -> params
      random float32 parameters with the structure `module.init` would give
      (found with `jax.eval_shape`, so nothing is compiled); norm scales are near 1
      and biases non-zero, so no parameter is trivially 0 or 1.
  jit_apply(module, method=None, **static_kwargs) -> f(params, *args)
      `module.apply` compiled once with keyword arguments fixed.
"""

import session_env

session_env.configure()

import math  # noqa: E402
from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from fault_runs import trained  # noqa: E402, F401

from transformer.nn.config import ModelConfig  # noqa: E402

TINY = dict(
  vocab_size=40,
  d_model=32,
  num_heads=4,
  num_layers=2,
  d_ff=48,
  max_len=16,
  image_size=8,
  patch_size=4,
  relative_num_buckets=8,
  relative_max_distance=12,
  shaw_max_distance=3,
  attention_chunk_size=5,
)


def make_tiny_config(family: str = "decoder", **overrides: Any) -> ModelConfig:
  """D=32, N=4, F=48, 2 layers, max_len 16 (ViT: 8x8 images of 4x4 patches, 3 classes)."""
  fields = dict(TINY, family=family)
  if family == "vit":
    fields["num_classes"] = 3
  return ModelConfig(**{**fields, **overrides})


def _random_leaf(path: tuple[str, ...], shape: tuple[int, ...], rng: np.random.Generator):
  name = path[-1]
  if name == "scale":
    return 1.0 + 0.2 * rng.standard_normal(shape)
  if name in ("bias", "mlm_bias"):
    return 0.2 * rng.standard_normal(shape)
  if name == "kernel":
    # DenseGeneral to heads [D, N, H] fans in over D; the rest over all but the last axis.
    heads_in = len(shape) == 3 and path[-2] != "out"
    fan_in = shape[0] if heads_in else math.prod(shape[:-1])
    return rng.standard_normal(shape) / math.sqrt(fan_in)
  return 0.5 * rng.standard_normal(shape)  # embeddings, position tables, [CLS], rel. tables


def randomize(shapes: Any, seed: int = 0) -> Any:
  """Random float32 values for a pytree of ShapeDtypeStructs (keyed by flax names)."""
  rng = np.random.default_rng(seed)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  values = []
  for path, leaf in leaves:
    names = tuple(str(getattr(k, "key", k)) for k in path)
    values.append(np.asarray(_random_leaf(names, leaf.shape, rng), np.float32))
  return jax.tree_util.tree_unflatten(treedef, values)


def make_random_params(
  module: nn.Module, *args: Any, seed: int = 0, method=None, **kwargs: Any
) -> Any:
  """Random params shaped like `module.init(key, *args, **kwargs)['params']`."""
  shapes = jax.eval_shape(
    lambda: module.init(jax.random.key(0), *args, method=method, **kwargs)
  ).get("params", {})
  return randomize(shapes, seed)


def make_jit_apply(module: nn.Module, method=None, **static_kwargs: Any):
  """jit(lambda params, *args: module.apply({'params': params}, *args, **static_kwargs))."""

  @jax.jit
  def apply(params, *args):
    return module.apply({"params": params}, *args, method=method, **static_kwargs)

  return apply


@pytest.fixture
def tiny_config():
  return make_tiny_config


@pytest.fixture
def random_params():
  return make_random_params


@pytest.fixture
def jit_apply():
  return make_jit_apply


def pytest_unconfigure(config):
  session_env.remove_cache()
