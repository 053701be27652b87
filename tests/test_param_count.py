"""Parameter counts: every named size pinned, and the analytic formula equals the real count.

Full sizes are built with `jax.eval_shape` (shapes only: no memory, no compilation).
"""

import math

import jax
import numpy as np
import pytest
from conftest import param_shapes

from transformer.nn import config as config_lib
from transformer.nn.config import ModelConfig
from transformer.nn.models import FAMILIES, param_count
from transformer.nn.positions import POSITIONS
from transformer.nn.sizes import NAMED_SIZES, named

_FAMILIES = tuple(FAMILIES)  # registry order: encoder, decoder, seq2seq, vit
_POSITIONS = tuple(POSITIONS)

# Exact counts of our models. Where a source quotes a figure, it is noted.
PINNED = {
  # Vaswani et al. 2017, Table 3 quotes 65M (base) and 213M (big); see the test below.
  "transformer_base": 63_082_496,
  "transformer_big": 214_245_376,
  # Devlin et al. 2019 quote 110M / 340M; we count the MLM head (transform, norm, bias).
  "bert_base": 109_514_298,
  "bert_large": 335_174_458,
  # Radford et al. 2019 Table 2 quotes 117M / 345M / 762M; the released checkpoints have
  # exactly these counts (tied embeddings, 1024 positions).
  "gpt2_small": 124_439_808,
  "gpt2_medium": 354_823_168,
  "gpt2_large": 774_030_080,
  # Dosovitskiy et al. 2021 Table 1: 86M (B) and 307M (L); Touvron et al. 2021: 5M / 22M.
  "vit_ti/16": 5_717_416,
  "vit_s/16": 22_050_664,
  "vit_b/16": 86_567_656,
  "vit_b/32": 88_224_232,
  "vit_l/16": 304_326_632,
  "vit_l/32": 306_535_400,
}


def real_param_count(c: ModelConfig) -> int:
  """Sum of parameter sizes of the model `c` builds, from `jax.eval_shape` of its init."""
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(param_shapes(c)))


def test_every_named_size_is_pinned():
  assert set(PINNED) == set(NAMED_SIZES)


@pytest.mark.parametrize("name", sorted(NAMED_SIZES))
def test_named_size_parameter_count(name):
  c = named(name)
  real = real_param_count(c)
  assert real == PINNED[name]
  assert param_count(c) == real


@pytest.mark.parametrize("name, paper", [("transformer_base", 65e6), ("transformer_big", 213e6)])
def test_transformer_sizes_are_close_to_the_paper(name, paper):
  # The paper's figures are rounded and its exact embedding/vocabulary accounting is not
  # given (we share one 37000-token table for source, target and output logits, and use
  # biases in every projection), so we pin our exact count and require 5% agreement.
  assert abs(PINNED[name] - paper) / paper < 0.05


def _random_config(seed: int) -> ModelConfig:
  """A valid config drawn from every option that changes the parameter count."""
  rng = np.random.default_rng(seed)

  def pick(options):
    return options[rng.integers(len(options))]

  # Family and position cycle, so 28 seeds see every (family, position) pair that is valid.
  family = _FAMILIES[seed % len(_FAMILIES)]
  position = _POSITIONS[(seed // len(_FAMILIES)) % len(_POSITIONS)]
  heads = int(pick([2, 4, 8]))
  fields = dict(
    family=family,
    vocab_size=int(rng.integers(5, 300)),
    d_model=heads * int(pick([4, 8, 12])),
    num_heads=heads,
    num_kv_heads=pick([None, 1, heads // 2, heads]),
    num_layers=int(rng.integers(1, 4)),
    num_decoder_layers=pick([None, 1, 3]),
    d_ff=int(rng.integers(8, 100)),
    max_len=int(rng.integers(40, 100)),
    norm=pick(config_lib.NORMS),
    norm_position=pick(config_lib.NORM_POSITIONS),
    activation=pick(config_lib.ACTIVATIONS),
    use_bias=bool(rng.integers(2)),
    tie_embeddings=bool(rng.integers(2)),
    relative_num_buckets=int(rng.integers(4, 40)),
    relative_max_distance=int(rng.integers(40, 200)),
    shaw_max_distance=int(rng.integers(1, 20)),
    scan_layers=bool(rng.integers(2)),
    qkv_bias=pick([None, True, False]),
    qk_norm=bool(pick([False, True])),
  )
  if family == "vit":
    patch = int(pick([2, 4]))
    fields.update(
      position=position if position in ("learned", "sinusoidal") else "none",
      image_size=patch * int(rng.integers(1, 5)),
      patch_size=patch,
      num_channels=int(rng.integers(1, 4)),
      num_classes=int(rng.integers(1, 20)),
      pooling=pick(config_lib.POOLINGS),
      d_model=heads * 4 * int(pick([1, 2])),  # 2-D sin-cos needs D % 4 == 0
    )
  else:
    fields["position"] = position
  if family == "encoder":
    fields.update(
      type_vocab_size=int(pick([0, 2, 3])),
      num_classes=int(pick([0, 0, 5])),
      pooling=pick(config_lib.POOLINGS),
    )
  if family == "seq2seq":  # BART's embedding norms and logits bias
    fields.update(embed_norm=bool(rng.integers(2)), final_logits_bias=bool(rng.integers(2)))
  experts = int(pick([0, 0, 2, 4]))  # mixture of experts on every moe_every-th layer
  if experts:
    fields.update(
      moe_experts=experts,
      moe_top_k=int(rng.integers(1, experts + 1)),
      moe_every=1 if fields["scan_layers"] else int(rng.integers(1, fields["num_layers"] + 1)),
    )
  return ModelConfig(**fields)


SEEDS = range(len(_FAMILIES) * len(_POSITIONS))


@pytest.mark.parametrize("seed", SEEDS)
def test_analytic_count_equals_real_count_for_random_options(seed):
  c = _random_config(seed)
  assert param_count(c) == real_param_count(c), c


def test_random_options_cover_every_family_and_position_pair():
  """The sampler reaches every valid (family, position) pair, so every count formula."""
  seen = {(c.family, c.position) for c in map(_random_config, SEEDS)}
  vit = {("vit", p) for p in ("learned", "sinusoidal", "none")}
  other = {(f, p) for f in ("encoder", "decoder", "seq2seq") for p in _POSITIONS}
  assert seen == vit | other


# ModernBERT's options, each of which removes or adds parameters: bias-free LayerNorms, an
# embedding norm under pre-LN, layer 0 without its attention norm (in every family's
# stacks), bias-free heads, no MLM output bias, the pooler's GELU + norm.
NORM_AND_HEAD_OPTIONS = {
  "modernbert-mlm": dict(
    family="encoder", norm_bias=False, embed_norm=True, first_layer_attention_norm=False,
    head_bias=False, mlm_output_bias=False, activation="geglu", use_bias=False,
  ),
  "modernbert-classifier": dict(
    family="encoder", num_classes=3, norm_bias=False, embed_norm=True, head_bias=False,
    first_layer_attention_norm=False, pooler_activation="gelu_norm",
  ),
  "untied-mlm-biased-norms": dict(family="encoder", tie_embeddings=False, embed_norm=True),
  "decoder-first-norm": dict(family="decoder", first_layer_attention_norm=False, norm_bias=False),
  "seq2seq-first-norm": dict(family="seq2seq", first_layer_attention_norm=False),
}  # fmt: skip
BASE_NORMS_AND_HEADS = dict(  # the defaults: each case above counts otherwise
  norm_bias=True, embed_norm=False, first_layer_attention_norm=True, head_bias=True,
  mlm_output_bias=True, pooler_activation="tanh",
)  # fmt: skip


@pytest.mark.parametrize("name", list(NORM_AND_HEAD_OPTIONS))
def test_analytic_count_equals_real_count_for_norm_and_head_options(name):
  c = ModelConfig(
    vocab_size=50, d_model=32, num_heads=4, num_layers=3, d_ff=48, **NORM_AND_HEAD_OPTIONS[name]
  )
  assert param_count(c) == real_param_count(c), c
  assert param_count(c) != param_count(ModelConfig(**{**c.to_dict(), **BASE_NORMS_AND_HEADS}))
