"""Shared test set-up: eight fake CPU devices, a session compilation cache, tiny configs,
random parameters, jitted apply.

The XLA flags and the cache must be set before JAX starts, so they come first
(tests/session_env.py: eight devices, the CPU vector width `train.py` sets, so results
computed here and in `train.py` subprocesses round identically, quick compilation, and any
flag the caller gave, such as `make test-isa`'s ISA cap). Fixtures:

  tiny_config(family='decoder', **overrides) -> ModelConfig   a small valid config
  random_params(module, *args, seed=0, method=None, **kwargs) -> params
      random float32 parameters with the structure `module.init` would give
      (found with `jax.eval_shape`, so nothing is compiled); norm scales are near 1
      and biases non-zero, so no parameter is trivially 0 or 1.
  jit_apply(module, method=None, **static_kwargs) -> f(params, *args)
      `module.apply` compiled once with keyword arguments fixed.

Helpers that test modules import: make_tiny_config, make_random_params, tiny_model,
param_shapes, init_cache, make_decode_step, decode_in_pieces, reference_self_attention,
make_lm_batch, train_losses, shakespeare_data, tensorboard_events, byte_level_bpe.
"""

import session_env

session_env.configure()

import gc  # noqa: E402
import glob  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import reference_numpy as ref  # noqa: E402
from fault_runs import trained  # noqa: E402, F401

from transformer.nn.config import ModelConfig  # noqa: E402

if TYPE_CHECKING:
  from transformer.data import DataConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(REPO, "data", "tinyshakespeare.txt.gz")
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


def param_shapes(c: ModelConfig) -> Any:
  """The parameter shapes of the model `c` builds, from `jax.eval_shape` of its init (no
  compute: full sizes in no time), on one image or one or two rows of 4 tokens."""
  from transformer.nn.models import build_model  # here: the set-up above stays light

  model = build_model(c)
  if c.family == "vit":
    args = (jax.ShapeDtypeStruct((1, c.image_size, c.image_size, c.num_channels), jnp.float32),)
  else:
    tokens = jax.ShapeDtypeStruct((1, 4), jnp.int32)
    args = (tokens, tokens) if c.family == "seq2seq" else (tokens,)
  return jax.eval_shape(lambda *a: model.init(jax.random.key(0), *a), *args)["params"]


def tiny_model(family: str = "decoder", seed: int = 0, **overrides: Any) -> tuple[nn.Module, Any]:
  """The model of `make_tiny_config(family, **overrides)` and random params for it."""
  from transformer.nn.models import build_model  # here: the set-up above stays light

  model = build_model(make_tiny_config(family, **overrides))
  tokens = jnp.zeros((1, 4), jnp.int32)  # only the shapes matter (jax.eval_shape)
  args = (tokens, tokens) if family == "seq2seq" else (tokens,)
  return model, make_random_params(model, *args, seed=seed)


def init_cache(model: nn.Module, *args: Any, method=None) -> Any:
  """The 'cache' collection of `model.init(..., decode=True)` on full-max_len inputs.

  Only the cache is returned from the jitted init, so XLA drops the parameter initialisers.
  """
  init = jax.jit(lambda: model.init(jax.random.key(0), *args, method=method, decode=True)["cache"])
  return init()


def make_decode_step(model: nn.Module, method=None):
  """jit(f(params, cache, *args, **kwargs) -> (out, {'cache': cache})): one cached decoding
  call of `model.apply` (or of `method`) that returns the updated cache."""

  @jax.jit
  def step(params, cache, *args, **kwargs):
    variables = {"params": params, "cache": cache}
    return model.apply(variables, *args, decode=True, mutable=["cache"], method=method, **kwargs)

  return step


def decode_in_pieces(call, cache: Any, total: int, prefill: int) -> tuple[list, Any]:
  """Prefill, then one token a call: `call(cache, start, end) -> (logits, {'cache': ...})`
  decodes positions [start, end) on `cache`, first [0, prefill), then each later one up to
  `total`, each call on the cache the one before left. The logits of every call [B, end -
  start, V] in order, and the last call's variables."""
  logits, state = call(cache, 0, prefill)
  pieces = [logits]
  for i in range(prefill, total):
    logits, state = call(state["cache"], i, i + 1)
    pieces.append(logits)
  return pieces, state


def reference_self_attention(
  params: Any,
  x: np.ndarray,
  config: ModelConfig,
  segments: np.ndarray,
  positions: np.ndarray,
  causal: bool,
  window: int | None = None,
  table: np.ndarray | None = None,
) -> np.ndarray:
  """Float64 NumPy self-attention (tests/reference_numpy.py) of `x` [B, T, D] over packed
  rows: `segments` [B, T] (0: padding), `positions` [B, T] of queries and keys alike, a
  local `window` or None, the T5 bias `table` [buckets, N] or None. [B, T, D]."""
  idx = np.arange(x.shape[1])
  mask = ref.reference_mask(idx, idx, causal, window, segments, segments)  # [B, 1, T, T]
  return ref.multi_head_attention(
    ref.to_numpy(params),
    x.astype(np.float64),
    None,
    config,
    mask,
    positions,
    positions,
    causal,
    None if table is None else table.astype(np.float64),
  )


def make_lm_batch(
  rng: np.random.Generator, b: int = 16, t: int = 8, vocab: int = 32
) -> dict[str, np.ndarray]:
  """An `lm` batch of b unpadded rows: t random tokens in [1, vocab) and their next ones."""
  tokens = rng.integers(1, vocab, size=(b, t + 1)).astype(np.int32)
  return {
    "inputs": tokens[:, :-1],
    "targets": tokens[:, 1:],
    "weights": np.ones((b, t), np.float32),
    "segment_ids": np.ones((b, t), np.int32),
    "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
  }


def train_losses(runner, state, batches) -> tuple[np.ndarray, Any]:
  """The loss of each `runner.train` step over `batches` from `state` (placed on the
  runner's devices first), and the state after them, still placed."""
  state = runner.place_state(state)
  losses = []
  for b in batches:
    state, metrics = runner.train(state, b)
    losses.append(float(metrics["loss"]))
  return np.array(losses), state


def shakespeare_data(tmp_path: os.PathLike, kind: str, **fields: Any) -> "DataConfig":
  """`kind` batches of the shipped tiny shakespeare (its last 10% for validation, no test
  split), prepared under tmp_path/tfds."""
  from transformer.data import DataConfig  # here: the set-up above stays light

  return DataConfig(
    kind=kind,
    path=SHAKESPEARE,
    data_dir=os.path.join(tmp_path, "tfds"),
    validation_fraction=0.1,
    test_fraction=0.0,
    **fields,
  )


def byte_level_bpe(corpus: list[str], specials: list[str], vocab_size: int = 300) -> Any:
  """A GPT-2-style byte-level BPE (`tokenizers.Tokenizer`) trained on `corpus`, with
  `specials` added after its pieces."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False
  )
  tok.train_from_iterator(corpus, trainer)
  tok.add_special_tokens(specials)
  return tok


def tensorboard_events(logdir: str | os.PathLike) -> list:
  """Every event of the TensorBoard event files in `logdir`, the files in name order."""
  from tensorboardX.proto import event_pb2

  events = []
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    offset = 0
    while offset < len(data):  # TFRecord: u64 length, u32 crc, payload, u32 crc
      (length,) = struct.unpack("<Q", data[offset : offset + 8])
      events.append(event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length]))
      offset += 12 + length + 4
  return events


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


def pytest_collection_modifyitems(config, items):
  """The modules marked `one_worker` first. Their tests share a costly module fixture (a
  reference run); `make test`'s `--dist worksteal` hands each worker an equal share of the
  collection in order, and a worker that runs out steals from the end of another's queue,
  so these stay together at the head of one queue and each fixture is built once."""
  items.sort(key=lambda item: item.get_closest_marker("one_worker") is None)


def pytest_collection_finish(session):
  """Freezes what the imports and the collection left (`gc.freeze`, as the commands do in
  `cli.apply_process_settings`): Python's cyclic garbage collector no longer walks those
  objects in each full collection while tests trace. The in-process tests of
  test_models.py, test_decode_cache.py and test_ops.py took 50 s instead of 54 s."""
  gc.collect()  # what the collection left unreachable is freed, not frozen
  gc.freeze()


def pytest_unconfigure(config):
  session_env.remove_cache()
