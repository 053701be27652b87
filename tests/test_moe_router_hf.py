"""DeepSeek-V3's router (`moe_router='sigmoid'`, the selection bias, group-limited top-k,
the routed scale; `moe.route`) against transformers' own `Glm4MoeTopkRouter` and
`DeepseekV3TopkRouter`, which GLM-4.5 / 4.6 and DeepSeek-V3 / Kimi K2 route with; and the
one-line refusals of the routing and shared-expert fields. (The MoE layer with these
options against the float64 reference and on the expert mesh: tests/test_moe.py.)

HF returns its top-k unsorted, so each token's (expert, gate) pairs are compared as sets.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from transformer.nn import moe
from transformer.nn.config import ModelConfig

D, TOKENS = 16, 64


def _hf_router(kind: str, experts: int, k: int, groups: int, top_groups: int, scale, norm, seed):
  fields = dict(
    hidden_size=D, n_routed_experts=experts, num_experts_per_tok=k, n_group=groups,
    topk_group=top_groups, routed_scaling_factor=scale, norm_topk_prob=norm,
  )  # fmt: skip
  if kind == "glm4_moe":
    router = transformers.models.glm4_moe.modeling_glm4_moe.Glm4MoeTopkRouter(
      transformers.Glm4MoeConfig(**fields)
    )
  else:
    router = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter(
      transformers.DeepseekV3Config(**fields)
    )
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    router.weight.copy_(torch.randn(experts, D, generator=gen))
    router.e_score_correction_bias.copy_(0.3 * torch.randn(experts, generator=gen))
  return router


def _theirs(router, x):
  with torch.no_grad():
    out = router(torch.from_numpy(x))
  weights, indices = out[-2], out[-1]
  return indices.numpy(), weights.float().numpy()


def _ours(router, x, k, groups, top_groups, scale, norm):
  logits = x.astype(np.float32) @ router.weight.detach().numpy().T  # [N, E]
  bias = router.e_score_correction_bias.detach().numpy()
  _, experts, gates = moe.route(
    jnp.asarray(logits), k, norm, sigmoid=True, bias=jnp.asarray(bias), groups=groups,
    top_groups=top_groups, scale=scale,
  )  # fmt: skip
  return np.asarray(experts), np.asarray(gates)


def _as_sets(indices, weights):
  return [
    dict(zip(i.tolist(), w.tolist(), strict=True)) for i, w in zip(indices, weights, strict=True)
  ]


@pytest.mark.parametrize("kind", ["glm4_moe", "deepseek_v3"])
@pytest.mark.parametrize(
  "experts, k, groups, top_groups, scale, norm",
  [
    (16, 4, 4, 2, 2.5, True),  # DeepSeek-V3's shape, scaled down: 8 groups, top 4
    (8, 2, 1, 1, 1.0, False),  # GLM-4.5-Air: one group, gates as they are
    (12, 3, 3, 1, 1.5, True),  # a single group kept: all three from it
  ],
)
def test_routing_equals_transformers(kind, experts, k, groups, top_groups, scale, norm):
  router = _hf_router(kind, experts, k, groups, top_groups, scale, norm, seed=experts)
  x = np.random.default_rng(experts).standard_normal((TOKENS, D)).astype(np.float32)
  their_experts, their_gates = _theirs(router, x)
  ours = _ours(router, x, k, groups, top_groups, scale, norm)
  for got, want in zip(_as_sets(*ours), _as_sets(their_experts, their_gates), strict=True):
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[e] for e in want], list(want.values()), rtol=1e-6)


def test_ties_take_the_lower_index_with_transformers_gates():
  """Two experts with the same router row and bias score alike for every token: ours takes
  the lower index, and the gates equal HF's whichever of the two it took."""
  router = _hf_router("deepseek_v3", 8, 2, 2, 1, 1.0, True, seed=3)
  with torch.no_grad():
    router.weight[5] = router.weight[4]
    router.e_score_correction_bias[5] = (
      router.e_score_correction_bias[4] + 2.0
    )  # chosen over 0-3, 7
    router.e_score_correction_bias[4] += 2.0
    router.weight[6] = router.weight[4]
    router.e_score_correction_bias[6] = router.e_score_correction_bias[4]  # a three-way tie
  x = np.random.default_rng(4).standard_normal((TOKENS, D)).astype(np.float32)
  their_experts, their_gates = _theirs(router, x)
  experts, gates = _ours(router, x, 2, 2, 1, 1.0, True)
  assert np.all(np.sort(experts, axis=-1) == [4, 5])  # of the tied 4, 5 and 6: the lower two
  assert set(np.unique(their_experts)) <= {4, 5, 6}
  np.testing.assert_allclose(np.sort(gates, -1), np.sort(their_gates, -1), rtol=1e-6)


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(moe_shared_gate=True), r"ModelConfig.moe_shared_gate=True: needs a shared expert"),
    (dict(moe_groups=3), r"ModelConfig.moe_groups=3: must divide moe_experts=4 into groups"),
    (dict(moe_groups=2, moe_top_groups=3), r"ModelConfig.moe_top_groups=3: must be an integer"),
    (dict(moe_groups=2, moe_top_k=3), r"ModelConfig.moe_top_k=3: exceeds the experts of the"),
    (dict(moe_router="relu"), r"ModelConfig.moe_router='relu': must be one of softmax, sigmoid"),
    (dict(moe_experts=0, moe_shared_d_ff=8), r"ModelConfig.moe_shared_d_ff=8: needs moe_experts"),
    (dict(moe_routed_scale=0), r"ModelConfig.moe_routed_scale=0: must be a number > 0"),
  ],
)
def test_bad_routing_fields_are_one_line(fields, message):
  with pytest.raises(ValueError, match=message) as e:
    ModelConfig(**{"d_model": 16, "num_heads": 2, "moe_experts": 4, **fields})
  assert "\n" not in str(e.value)
