"""DeepSeek-V3 and Kimi K2 (`DeepseekV3ForCausalLM`): multi-head latent attention
(`nn/mla.py`) and GLM-4.5's mixture of experts (`convert.glm4_moe`) in the Llama layout.

- Attention: `kv_lora_rank` (`mla_kv_rank`), `q_lora_rank` (`mla_q_rank`; none: one
  `q_proj`), `qk_nope_head_dim` (`attention_head_dim`), `qk_rope_head_dim`
  (`mla_rope_dim`), `v_head_dim` (`mla_v_dim`). The checkpoints rotate adjacent pairs of
  the rope features (`rope_interleave`): the query's and the rope key's are reordered on
  import as `base.rope_interleaved` does, and back on export.
- `kv_b_proj` [N (H + V), C] splits into `key_up` [C, N, H] and `value_up` [C, N, V].
- YaRN: the rope factor as Llama's (`mscale` / `mscale_all_dim` -> `rope_attention_factor`);
  with `mscale_all_dim` the scores are also scaled by its mscale squared
  (`attention_scale`), which export writes back as `mscale_all_dim`.
- Dense first layers, the router and the shared expert as GLM-4.5's.

The multi-token-prediction layers are left out as GLM-4.5's. Refused in one line:
`attention_bias` (biases on the attention projections only), `rope_interleave=False`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.convert import glm4_moe, llama
from transformer.convert.base import (
  NO_TOKEN_IDS,
  Converter,
  Rule,
  heads_in,
  heads_out,
  linear,
  norm,
  require,
)
from transformer.nn.config import ModelConfig

ARCHITECTURE = "DeepseekV3ForCausalLM"


def _mscale(factor: float, m: float) -> float:
  return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  n = hf["num_attention_heads"]
  require(hf, a, "num_key_value_heads", (n, None))
  require(hf, a, "attention_bias", (False,))
  require(hf, a, "rope_interleave", (True,))
  fields = llama.common({**hf, "head_dim": None, "num_key_value_heads": n}, a, False)
  nope, rope = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"]
  fields |= glm4_moe.moe_from_hf(hf, a) | {
    "attention_head_dim": None if nope * n == hf["hidden_size"] else nope,
    "mla_kv_rank": hf["kv_lora_rank"],
    "mla_q_rank": hf.get("q_lora_rank") or 0,
    "mla_rope_dim": rope,
    "mla_v_dim": hf["v_head_dim"],
  }
  parameters = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
  if fields["rope_scaling"] != "none" and parameters.get("mscale_all_dim"):
    m = _mscale(parameters["factor"], parameters["mscale_all_dim"])
    fields["attention_scale"] = (nope + rope) ** -0.5 * m * m
  return fields


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | glm4_moe.moe_to_hf(c) | NO_TOKEN_IDS
  for key in ("head_dim", "mlp_bias"):
    del out[key]
  out |= {
    "model_type": "deepseek_v3",
    "attention_bias": False,
    "num_key_value_heads": c.num_heads,
    "kv_lora_rank": c.mla_kv_rank,
    "q_lora_rank": c.mla_q_rank or None,
    "qk_nope_head_dim": c.head_dim,
    "qk_rope_head_dim": c.mla_rope_dim,
    "v_head_dim": c.mla_value_dim,
    "rope_interleave": True,
  }
  if c.attention_scale is not None and c.rope_scaling != "none":  # as mscale_all_dim
    factor = c.rope_scaling_factor
    m = math.sqrt(c.attention_scale * (c.head_dim + c.mla_rope_dim) ** 0.5)
    out["rope_parameters"]["mscale_all_dim"] = (m - 1.0) / (0.1 * math.log(factor))
  return out


def _rope_last(rule: Rule, rope: int) -> Rule:
  """`rule` with the last `rope` features of its output (per head) reordered from the
  checkpoint's adjacent pairs to ours (their 2i is our i, their 2i + 1 our i + rope / 2)."""
  order = np.concatenate([np.arange(0, rope, 2), np.arange(1, rope, 2)])
  back = np.argsort(order)

  def to_ours(*x):
    (y,) = rule.to_ours(*x)
    return (np.concatenate([y[..., :-rope], y[..., -rope:][..., order]], axis=-1),)

  def to_hf(y):
    return rule.to_hf(np.concatenate([y[..., :-rope], y[..., -rope:][..., back]], axis=-1))

  return Rule(rule.ours, rule.hf, to_ours, to_hf)


def _attention(c: ModelConfig, ours: str, hf: str) -> list[Rule]:
  n, h, r, rank, v = c.num_heads, c.head_dim, c.mla_rope_dim, c.mla_kv_rank, c.mla_value_dim
  if c.mla_q_rank:
    out = linear(f"{ours}/query_down", f"{hf}.q_a_proj", bias=False)
    out += norm(f"{ours}/query_down_norm", f"{hf}.q_a_layernorm", bias=False)
    (query,) = heads_in(f"{ours}/query_up", f"{hf}.q_b_proj", n, h + r, bias=False)
  else:
    out, (query,) = [], heads_in(f"{ours}/query", f"{hf}.q_proj", n, h + r, bias=False)
  (kv_down,) = linear(f"{ours}/kv_down", f"{hf}.kv_a_proj_with_mqa", bias=False)
  out += [_rope_last(query, r), _rope_last(kv_down, r)]
  out += norm(f"{ours}/kv_down_norm", f"{hf}.kv_a_layernorm", bias=False)

  def split(w):  # [N (H + V), C] -> key_up [C, N, H], value_up [C, N, V]
    w = w.reshape(n, h + v, rank).transpose(2, 0, 1)
    return w[..., :h], w[..., h:]

  def join(k, vv):
    return (np.concatenate([k, vv], axis=-1).transpose(1, 2, 0).reshape(n * (h + v), rank),)

  ups = (f"{ours}/key_up/kernel", f"{ours}/value_up/kernel")
  out.append(Rule(ups, (f"{hf}.kv_b_proj.weight",), split, join))
  return out + heads_out(f"{ours}/out", f"{hf}.o_proj", n, v, bias=False)


def rules(c: ModelConfig) -> list[Rule]:
  return llama.decoder_rules(c, glm4_moe.feed_forward, projections=_attention)


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "deepseek_v3", config_from_hf, config_to_hf, rules, llama.PREFIX
  ),
}
