"""Parity with PyTorch's own modules loaded with the same weights (max abs diff <= 1e-5).

Weight mapping: our query/key/value kernels [D, N, H] flatten to [D, N*H] (head-major),
which is PyTorch's in_proj_weight block transposed; out kernel [N, H, D] -> out_proj.weight.T.
Dense kernels [in, out] are nn.Linear weights transposed. Norm scale/bias -> weight/bias.
PyTorch masks are True = *blocked*; ours are True = may attend.
"""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer.nn.attention import MultiHeadAttention
from transformer.nn.blocks import Block
from transformer.nn.kernels import dot_product_attention
from transformer.nn.masks import MaskInfo

ATOL = 1e-5
B, T, S, D = 2, 7, 9, 32


def _t(x) -> torch.Tensor:
  return torch.tensor(np.asarray(x), dtype=torch.float32)


def _load_mha(torch_mha: torch.nn.MultiheadAttention, p) -> None:
  """Our MultiHeadAttention params -> torch in_proj_weight / in_proj_bias / out_proj."""
  d = p["query"]["kernel"].shape[0]
  with torch.no_grad():
    torch_mha.in_proj_weight.copy_(
      torch.cat([_t(p[n]["kernel"]).reshape(d, -1).T for n in ("query", "key", "value")])
    )
    torch_mha.in_proj_bias.copy_(
      torch.cat([_t(p[n]["bias"]).reshape(-1) for n in ("query", "key", "value")])
    )
    torch_mha.out_proj.weight.copy_(_t(p["out"]["kernel"]).reshape(-1, d).T)
    torch_mha.out_proj.bias.copy_(_t(p["out"]["bias"]))


def _load_linear(linear: torch.nn.Linear, p) -> None:
  with torch.no_grad():
    linear.weight.copy_(_t(p["kernel"]).T)
    linear.bias.copy_(_t(p["bias"]))


def _load_norm(norm: torch.nn.LayerNorm, p) -> None:
  with torch.no_grad():
    norm.weight.copy_(_t(p["scale"]))
    norm.bias.copy_(_t(p["bias"]))


def _torch_layer(cls, c, activation: str, norm_first: bool) -> torch.nn.Module:
  """PyTorch's encoder or decoder layer (`cls`) at the sizes of `c`, without dropout."""
  return cls(
    D,
    c.num_heads,
    c.d_ff,
    dropout=0.0,
    activation=activation,
    layer_norm_eps=c.norm_eps,
    batch_first=True,
    norm_first=norm_first,
  ).eval()


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((B, T, D)).astype(np.float32)
  memory = rng.standard_normal((B, S, D)).astype(np.float32)
  seg = np.ones((B, T), np.int32)
  seg[1, 5:] = 0  # padded target / source slots
  src_seg = np.ones((B, S), np.int32)
  src_seg[0, 6:] = 0
  return x, memory, seg, src_seg


def _max_diff_on_real_rows(ours, theirs, seg):
  """PyTorch lets padded *queries* see real keys, we let them see padding: compare real rows."""
  real = seg.astype(bool)
  return np.abs(np.asarray(ours)[real] - theirs.detach().numpy()[real]).max()


@pytest.mark.parametrize("cross", [False, True], ids=["self-causal-window", "cross"])
def test_multi_head_attention_matches_torch(tiny_config, random_params, jit_apply, cross):
  c = tiny_config(position="none")
  x, memory, seg, src_seg = _inputs()
  if cross:
    info = MaskInfo.create(jnp.ones((B, T), jnp.int32), jnp.asarray(src_seg))
    kv, key_padding, attn_mask = memory, src_seg == 0, None
  else:
    info = MaskInfo.create(jnp.asarray(seg), causal=True, window=4)
    kv, key_padding = None, seg == 0
    q_idx = np.arange(T)
    delta = q_idx[:, None] - q_idx[None, :]
    attn_mask = ~((delta >= 0) & (delta < 4))  # [T, S], True = blocked
  module = MultiHeadAttention(c, is_cross=cross)
  params = random_params(module, x, kv, info)
  ours = jit_apply(module)(params, x, kv, info)

  torch_mha = torch.nn.MultiheadAttention(D, c.num_heads, batch_first=True).eval()
  _load_mha(torch_mha, params)
  kv_t = _t(memory if cross else x)
  with torch.no_grad():
    theirs, _ = torch_mha(
      _t(x),
      kv_t,
      kv_t,
      key_padding_mask=torch.tensor(key_padding),
      attn_mask=None if attn_mask is None else torch.tensor(attn_mask),
      need_weights=False,
    )
  diff = _max_diff_on_real_rows(ours, theirs, np.ones_like(seg) if cross else seg)
  assert diff <= ATOL, diff


def test_grouped_query_attention_matches_torch_sdpa():
  rng = np.random.default_rng(1)
  q = rng.standard_normal((B, T, 8, 16)).astype(np.float32)
  k = rng.standard_normal((B, S, 2, 16)).astype(np.float32)
  v = rng.standard_normal((B, S, 2, 16)).astype(np.float32)
  mask = rng.random((B, 1, T, S)) > 0.3
  mask[..., 0] = True  # no empty rows (PyTorch would return NaN)
  ours = dot_product_attention(q, k, v, mask=jnp.asarray(mask))
  theirs = F.scaled_dot_product_attention(
    *(_t(a).transpose(1, 2) for a in (q, k, v)), attn_mask=torch.tensor(mask), enable_gqa=True
  ).transpose(1, 2)  # torch wants [B, N, T, H]
  assert np.abs(np.asarray(ours) - theirs.numpy()).max() <= ATOL


@pytest.mark.parametrize(
  "norm_first, activation",
  [(True, "relu"), (True, "gelu"), (False, "relu"), (False, "gelu")],
)
def test_encoder_block_matches_torch_encoder_layer(
  tiny_config, random_params, jit_apply, norm_first, activation
):
  c = tiny_config(
    position="none",
    norm_position="pre" if norm_first else "post",
    activation=activation,
    norm_eps=1e-6,
  )
  x, _, seg, _ = _inputs(seed=2)
  info = MaskInfo.create(jnp.asarray(seg))  # bidirectional, padding masked
  module = Block(c)
  params = random_params(module, x, info)
  ours = jit_apply(module)(params, x, info)

  layer = _torch_layer(torch.nn.TransformerEncoderLayer, c, activation, norm_first)
  _load_mha(layer.self_attn, params["self_attention"])
  _load_linear(layer.linear1, params["ffn"]["wi"])
  _load_linear(layer.linear2, params["ffn"]["wo"])
  _load_norm(layer.norm1, params["self_attention_norm"])
  _load_norm(layer.norm2, params["ffn_norm"])
  with torch.no_grad():
    theirs = layer(_t(x), src_key_padding_mask=torch.tensor(seg == 0))
  diff = _max_diff_on_real_rows(ours, theirs, seg)
  assert diff <= ATOL, diff


@pytest.mark.parametrize("norm_first, activation", [(True, "gelu"), (False, "relu")])
def test_decoder_block_matches_torch_decoder_layer(
  tiny_config, random_params, jit_apply, norm_first, activation
):
  c = tiny_config(
    position="none", norm_position="pre" if norm_first else "post", activation=activation
  )
  x, memory, seg, src_seg = _inputs(seed=3)
  info = MaskInfo.create(jnp.asarray(seg), causal=True)
  cross_info = MaskInfo.create(jnp.asarray(seg), jnp.asarray(src_seg))
  module = Block(c, cross_attention=True)
  params = random_params(module, x, info, memory, cross_info)
  ours = jit_apply(module)(params, x, info, memory, cross_info)

  layer = _torch_layer(torch.nn.TransformerDecoderLayer, c, activation, norm_first)
  _load_mha(layer.self_attn, params["self_attention"])
  _load_mha(layer.multihead_attn, params["cross_attention"])
  _load_linear(layer.linear1, params["ffn"]["wi"])
  _load_linear(layer.linear2, params["ffn"]["wo"])
  _load_norm(layer.norm1, params["self_attention_norm"])
  _load_norm(layer.norm2, params["cross_attention_norm"])
  _load_norm(layer.norm3, params["ffn_norm"])
  causal = torch.nn.Transformer.generate_square_subsequent_mask(T).isinf()  # True = blocked
  with torch.no_grad():
    theirs = layer(
      _t(x),
      _t(memory),
      tgt_mask=causal,
      tgt_key_padding_mask=torch.tensor(seg == 0),
      memory_key_padding_mask=torch.tensor(src_seg == 0),
    )
  diff = _max_diff_on_real_rows(ours, theirs, seg)
  assert diff <= ATOL, diff
