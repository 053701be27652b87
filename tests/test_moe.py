"""Mixture-of-experts feed-forward (transformer/nn/moe.py) against independent references.

- The layer equals a float64 NumPy version that sends every token through its top-k
  experts one by one, with GShard's drop order (top-1 choices by position, then top-2)
  when a capacity is set, and without drops when it is not.
- The load-balancing loss and the router z-loss equal their formulas on fixed logits, and
  the values the layers sow are those formulas on their own router logits.
- The dropless path (sorted tokens, `jax.lax.ragged_dot`) equals gathering every token's
  expert weights, in its output and its gradients.
- A train step on 8 fake CPU devices with an 'expert' axis (data 2 x expert 4) gives the
  one-device losses; with a capacity the routed tokens move by all-to-all.
- Analytic parameter counts equal the real ones; a bad field is one line.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_numpy as ref

from transformer import tasks
from transformer.nn import models, moe, partitioning
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.train import experiment
from transformer.train.parallel import StepRunner, make_mesh
from transformer.train.step import StepConfig, create_train_state, summarize_eval, train_step

D, F, E = 16, 24, 4


def _config(**fields) -> ModelConfig:
  base = dict(
    vocab_size=40, d_model=D, num_heads=2, num_layers=2, d_ff=F, max_len=16, moe_experts=E
  )
  return ModelConfig(**{**base, **fields})


def _layer_params(c: ModelConfig, seed: int) -> dict:
  """Random MoE parameters; a wide router so that the top-k choices are clear-cut."""
  rng = np.random.default_rng(seed)

  def weights(fan_in, fan_out):
    p = {"kernel": rng.standard_normal((E, fan_in, fan_out)) / math.sqrt(fan_in)}
    if c.use_bias:
      p["bias"] = 0.1 * rng.standard_normal((E, fan_out))
    return p

  params = {"router": {"kernel": 2.0 * rng.standard_normal((D, E))}}
  if c.moe_selection_bias:
    params["router"]["bias"] = 0.5 * rng.standard_normal(E)
  for name in ("wi_0", "wi_1") if c.gated else ("wi",):
    params[name] = weights(D, c.expert_d_ff)
  params["wo"] = weights(c.expert_d_ff, D)
  if c.moe_shared_d_ff:  # the shared expert [D, S], [S, D] and its gate [D, 1]
    s = c.moe_shared_d_ff
    names = ("wi_0", "wi_1") if c.gated else ("wi",)

    def dense(fan_in, fan_out):
      p = {"kernel": rng.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in)}
      return p | ({"bias": 0.1 * rng.standard_normal(fan_out)} if c.use_bias else {})

    params["shared_ffn"] = {n: dense(D, s) for n in names} | {"wo": dense(s, D)}
    if c.moe_shared_gate:
      params["shared_gate"] = {"kernel": rng.standard_normal((D, 1))}
  return jax.tree.map(lambda a: np.asarray(a, np.float32), params)


def _inputs(seed: int, b: int = 3, t: int = 8):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((b, t, D)).astype(np.float32)
  valid = np.ones((b, t), bool)
  valid[0, -3:] = False  # padding at the end of row 0
  valid[2, 2] = False  # and one in the middle of row 2
  return x, valid


def _expert(p: dict, i: int, v: np.ndarray, activation: str) -> np.ndarray:
  routed = ("wi", "wi_0", "wi_1", "wo")
  one = {name: {k: w[i] for k, w in p[name].items()} for name in p if name in routed}
  return ref.feed_forward(v, one, activation)


def _ranked(scores: np.ndarray, p, c: ModelConfig) -> np.ndarray:
  """A token's K experts, best first. DeepSeek-V3: the scores + the choice bias, within the
  `moe_top_groups` groups whose two best sum highest."""
  scores = scores + p["router"].get("bias", 0.0)
  groups = np.split(scores, c.moe_groups)
  best = np.argsort([-np.sort(g)[-2:].sum() for g in groups], kind="stable")
  keep = np.repeat(np.isin(np.arange(c.moe_groups), best[: c.moe_top_groups]), E // c.moe_groups)
  return np.argsort(-np.where(keep, scores, -np.inf), kind="stable")[: c.moe_top_k]


def reference_moe(p, x, valid, c: ModelConfig) -> tuple[np.ndarray, int]:
  """(output [B, T, D], dropped assignments): float64, token by token."""
  p = ref.to_numpy(p)
  x = np.asarray(x, np.float64)
  b, t, _ = x.shape
  k = c.moe_top_k
  slots = None
  if c.moe_capacity_factor is not None:
    slots = max(1, math.ceil(c.moe_capacity_factor * k * t / E))
  logits = x @ p["router"]["kernel"]  # [B, T, E]
  sigmoid = c.moe_router == "sigmoid"
  probs = 1 / (1 + np.exp(-logits)) if sigmoid else ref.softmax(logits)  # [B, T, E]
  y = np.zeros_like(x)
  dropped = 0

  for row in range(b):
    choice = [_ranked(probs[row, i], p, c) for i in range(t)]
    used = np.zeros(E, int)
    for j in range(k):  # GShard: every top-1 choice first, then top-2, each by position
      for i in range(t):
        if not valid[row, i]:
          continue
        expert = choice[i][j]
        if slots is not None and used[expert] >= slots:
          dropped += 1
          continue
        used[expert] += 1
        top = probs[row, i, choice[i]]
        normalise = k > 1 if c.moe_norm_topk is None else c.moe_norm_topk
        gate = (top[j] / top.sum() if normalise else top[j]) * c.moe_routed_scale
        y[row, i] += gate * _expert(p, expert, x[row, i], c.activation)
  if c.moe_shared_d_ff:  # every real token through the shared expert, times its gate
    shared = ref.feed_forward(x, p["shared_ffn"], c.activation)
    if c.moe_shared_gate:
      shared = shared / (1 + np.exp(-(x @ p["shared_gate"]["kernel"])))
    y += shared * valid[..., None]
  return y, dropped


def _apply_layer(c, params, x, valid):
  layer = moe.MoEFeedForward(c)
  return jax.jit(lambda p, x, v: layer.apply({"params": p}, x, v, mutable=[moe.AUX_COLLECTION]))(
    params, x, valid
  )


# DeepSeek-V3's router: sigmoid scores, the choice bias, the better of 2 groups, scaled gates.
DEEPSEEK = dict(
  moe_router="sigmoid", moe_selection_bias=True, moe_groups=2, moe_top_groups=1,
  moe_routed_scale=2.0, moe_shared_d_ff=8,
)  # fmt: skip


LAYER_CASES = {
  "top2-dropless": dict(moe_top_k=2, activation="swiglu", use_bias=False),  # Mixtral
  "top2-capacity": dict(moe_top_k=2, activation="relu", moe_capacity_factor=0.5),  # GShard
  "top1-capacity": dict(moe_top_k=1, activation="gelu", moe_capacity_factor=1.0),  # Switch
  "top3-raw": dict(moe_top_k=3, activation="swiglu", moe_norm_topk=False),  # Qwen3-MoE
  "top1-normalised": dict(moe_top_k=1, activation="swiglu", moe_norm_topk=True),  # gate 1
  "shared-gated": dict(moe_top_k=2, activation="swiglu", moe_shared_d_ff=20, moe_shared_gate=True),
  "narrow-experts": dict(moe_top_k=2, activation="swiglu", moe_d_ff=6, moe_shared_d_ff=8),
  "shared-capacity": dict(activation="gelu", moe_capacity_factor=0.5, moe_shared_d_ff=8),
  # DeepSeek-V3: sigmoid scores, the choice bias, 2 groups of 2 (the better one), scaled
  "deepseek-v3": dict(DEEPSEEK, activation="swiglu", moe_routed_scale=2.5, moe_norm_topk=True),
  "sigmoid-capacity": dict(
    moe_top_k=1, activation="relu", moe_router="sigmoid", moe_capacity_factor=1.0
  ),
}


@pytest.mark.parametrize("fields", list(LAYER_CASES.values()), ids=list(LAYER_CASES))
def test_layer_equals_numpy_reference(fields):
  c = _config(**fields)
  params = _layer_params(c, seed=1)
  x, valid = _inputs(seed=2)
  y, aux = _apply_layer(c, params, x, valid)
  expected, dropped = reference_moe(params, x, valid, c)
  if c.moe_capacity_factor is None:
    assert dropped == 0
  else:
    assert dropped > 0  # the capacity binds, so the drop order is what is compared
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(y)[~valid] == 0)  # padding is routed nowhere
  # The sown losses are the formulas on this layer's router logits.
  logits = x.astype(np.float64) @ params["router"]["kernel"].astype(np.float64)
  balance, z = reference_losses(logits, valid, c.moe_top_k)
  if c.moe_router == "sigmoid":  # DeepSeek-V3: P over the scores normalised to sum to 1
    scores = 1 / (1 + np.exp(-logits[valid]))  # [N, E]
    chosen = np.array([_ranked(s, ref.to_numpy(params), c) for s in scores])  # [N, K]
    f = np.bincount(chosen.ravel(), minlength=E) / chosen.size
    balance = E * float(np.sum(f * (scores / scores.sum(-1, keepdims=True)).mean(0)))
  sown = aux[moe.AUX_COLLECTION]
  np.testing.assert_allclose(float(sown[moe.BALANCE][0]), balance, rtol=1e-5)
  np.testing.assert_allclose(float(sown[moe.Z_LOSS][0]), z, rtol=1e-5)


def reference_losses(logits: np.ndarray, valid: np.ndarray, k: int) -> tuple[float, float]:
  """Switch's E * sum_i f_i P_i and ST-MoE's mean logsumexp^2, over the valid tokens."""
  e = logits.shape[-1]
  rows = logits[valid]  # [N, E]
  probs = ref.softmax(rows)
  chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # [N, K]
  f = np.bincount(chosen.ravel(), minlength=e) / chosen.size  # share of the N*K choices
  balance = e * float(np.sum(f * probs.mean(0)))
  top = rows.max(-1)
  z = top + np.log(np.exp(rows - top[:, None]).sum(-1))
  return balance, float(np.mean(z**2))


def test_losses_equal_their_formulas_on_fixed_logits():
  logits = np.array(
    [
      [[2.0, 0.0, -1.0, 0.5], [0.1, 3.0, 0.2, 0.0], [0.0, 0.0, 4.0, 1.0]],
      [[1.0, 1.5, 0.0, -2.0], [9.0, 9.0, 9.0, 9.0], [-3.0, 0.0, 2.5, 2.0]],
    ]
  )  # [B=2, T=3, E=4]
  valid = np.array([[True, True, True], [True, False, True]])

  @functools.partial(jax.jit, static_argnums=2)
  def losses(logits, valid, k):
    probs, experts, _ = moe.route(logits, k)
    return moe.balance_loss(probs, experts, valid), moe.router_z_loss(logits, valid)

  for k in (1, 2):
    balance, z = losses(jnp.asarray(logits, jnp.float32), jnp.asarray(valid), k)
    want_balance, want_z = reference_losses(logits, valid, k)
    np.testing.assert_allclose(float(balance), want_balance, rtol=1e-6)
    np.testing.assert_allclose(float(z), want_z, rtol=1e-6)
  # Uniform routing is balanced: E * sum_i (1/E)(1/E) = 1; total collapse gives E.
  uniform = np.zeros((1, 4, 4))
  experts = jnp.asarray(np.arange(4).reshape(1, 4, 1))
  ones = jnp.ones((1, 4), bool)
  assert float(moe.balance_loss(jax.nn.softmax(uniform), experts, ones)) == pytest.approx(1.0)
  collapsed = jax.nn.one_hot(np.zeros((1, 4), int), 4)
  assert float(moe.balance_loss(collapsed, jnp.zeros((1, 4, 1), int), ones)) == 4.0


def _gather_reference(c, params, x, valid):
  """Every token's K experts' weights gathered, [B, T, K, D, F]: dense, no sorting."""
  logits = jnp.einsum("BTD,DE->BTE", x, params["router"]["kernel"], precision="highest")
  _, experts, gates = moe.route(logits, c.moe_top_k)  # [B, T, K]
  gates = gates * valid[..., None]

  def project(h, name):
    w = params[name]["kernel"][experts]  # [B, T, K, I, O]
    return jnp.einsum("BTKI,BTKIO->BTKO", h, w) + params[name]["bias"][experts]

  xk = jnp.broadcast_to(x[:, :, None], (*experts.shape, x.shape[-1]))  # [B, T, K, D]
  h = jax.nn.silu(project(xk, "wi_0")) * project(xk, "wi_1")  # [B, T, K, F]
  return jnp.einsum("BTK,BTKD->BTD", gates, project(h, "wo"))


def test_dropless_ragged_dot_equals_dense_gather():
  c = _config(moe_top_k=2, activation="swiglu", use_bias=True)
  params = _layer_params(c, seed=3)
  x, valid = _inputs(seed=4)
  probe = np.random.default_rng(5).standard_normal(x.shape).astype(np.float32)
  layer = moe.MoEFeedForward(c)

  def ragged(p, x):
    return jnp.sum(layer.apply({"params": p}, x, valid) * probe)

  def gathered(p, x):
    return jnp.sum(_gather_reference(c, p, x, valid) * probe)

  (got, got_grads) = jax.jit(jax.value_and_grad(ragged, argnums=(0, 1)))(params, x)
  (want, want_grads) = jax.jit(jax.value_and_grad(gathered, argnums=(0, 1)))(params, x)
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
  for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)


def _lm_batch(rng, b=8, t=8, vocab=40):
  tokens = rng.integers(1, vocab, size=(b, t + 1)).astype(np.int32)
  segments = np.ones((b, t), np.int32)
  segments[0, -2:] = 0  # a little padding
  return {
    "inputs": tokens[:, :-1],
    "targets": tokens[:, 1:],
    "weights": (segments > 0).astype(np.float32),
    "segment_ids": segments,
    "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
  }


def _moe_losses(c: ModelConfig, mesh, batches, train: bool):
  """[steps, 3]: loss, balance and z-loss of train steps (or of evaluations, `train` False)."""
  model = build_model(c)
  tx = optax.sgd(0.3)
  step_cfg = StepConfig(model=model, tx=tx, task=tasks.get("lm")())
  runner = StepRunner(step_cfg, "jit", mesh, update=train_step)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"]
  state = runner.place_state(create_train_state(params, tx, jax.random.PRNGKey(1)))
  names = ("loss", "moe_balance_loss", "moe_router_z_loss")
  out = []
  for b in batches:
    if train:
      state, metrics = runner.train(state, b)
    else:
      metrics = summarize_eval({k: float(v) for k, v in runner.eval(state, b).items()})
    out.append([float(metrics[k]) for k in names])
  return np.array(out)


@pytest.mark.parametrize(
  "capacity, train, router",
  [(1.0, True, {}), (None, False, {}), (1.0, True, DEEPSEEK)],
  ids=["capacity-train", "dropless-eval", "deepseek-capacity-train"],
)
def test_expert_mesh_losses_equal_one_device(capacity, train, router):
  """Capacity routing: three train steps (gradients included); dropless: the evaluation
  losses (its gradients are checked against the dense gather above). DeepSeek-V3's router
  and a shared expert route the same on the mesh."""
  assert jax.device_count() == 8, "tests/conftest.py fakes 8 CPU devices"
  c = _config(
    num_layers=1, moe_top_k=2, moe_capacity_factor=capacity, moe_balance_loss=0.1, ops="plain",
    **router,
  )  # fmt: skip
  rng = np.random.default_rng(6)
  batches = [_lm_batch(rng)] * 3 if train else [_lm_batch(rng), _lm_batch(rng)]
  mesh = make_mesh(shape={"data": 2, "expert": 4})
  sharded = _moe_losses(c, mesh, batches, train)
  single = _moe_losses(c, make_mesh(jax.devices()[:1]), batches, train)
  np.testing.assert_allclose(sharded, single, atol=1e-5)
  if train:
    assert single[-1, 0] < single[0, 0]  # one batch three times: the loss falls


def test_capacity_routing_moves_tokens_by_all_to_all():
  """Under data 2 x expert 4 each expert's weights live on their own devices and the
  dispatched tokens [B, E, C, D] are exchanged by all-to-all (docs/SCALING.md)."""
  c = _config(num_layers=1, moe_top_k=2, moe_capacity_factor=1.0)
  model = build_model(c)
  tokens = jnp.ones((8, 8), jnp.int32)
  mesh = make_mesh(shape={"data": 2, "expert": 4})
  params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
  shardings = partitioning.param_shardings(params, mesh)
  wi = shardings["decoder"]["layer_0"]["moe"]["wi"]["kernel"]
  assert wi.spec == jax.sharding.PartitionSpec("expert", None, None)

  def forward(p, t):
    with partitioning.activation_layout(mesh):
      return model.apply({"params": p}, t).sum()

  batch = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "expert")))
  hlo = jax.jit(forward, in_shardings=(shardings, batch)).lower(params, tokens).compile().as_text()
  assert " all-to-all(" in hlo


def test_analytic_counts_equal_real_parameter_counts():
  from test_param_count import real_param_count

  cases = [
    _config(moe_every=1, activation="swiglu", use_bias=False),
    _config(num_layers=3, moe_every=2, moe_top_k=1),
    _config(family="encoder", moe_every=2, num_classes=3),
    _config(family="seq2seq", num_decoder_layers=3, moe_every=2, activation="geglu"),
    _config(family="vit", moe_top_k=1, image_size=8, patch_size=4, num_classes=3),
    _config(scan_layers=True, moe_top_k=2),
    _config(moe_shared_d_ff=20, moe_shared_gate=True, activation="swiglu", use_bias=False),
    _config(family="seq2seq", moe_every=2, moe_shared_d_ff=8),
    _config(moe_router="sigmoid", moe_selection_bias=True, moe_groups=2, moe_top_k=1),
    _config(num_layers=3, moe_first_dense=1, moe_d_ff=6, moe_shared_d_ff=8, activation="swiglu"),
  ]
  for c in cases:
    assert models.param_count(c) == real_param_count(c), c
  # Active FLOPs: the router plus K experts per token, so a top-2 model of 4 experts costs
  # (router aside) what a dense model of twice the width costs.
  moe_cfg = _config(num_layers=2, moe_every=1, moe_top_k=2)
  dense = moe_cfg.replace(moe_experts=0, d_ff=2 * F)
  router = 2 * moe_cfg.num_layers * D * E
  assert models.flops_per_token(moe_cfg, 16, training=False) == (
    models.flops_per_token(dense, 16, training=False) + router
  )


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(moe_top_k=5), r"ModelConfig.moe_top_k=5: must be an integer in \[1, moe_experts=4\]"),
    (dict(moe_every=3), r"ModelConfig.moe_every=3: must be an integer in \[1, num_layers=2\]"),
    (dict(moe_capacity_factor=0.0), "ModelConfig.moe_capacity_factor=0.0: must be a number > 0"),
    (dict(scan_layers=True, moe_every=2), "ModelConfig.moe_every=2: must be 1 with scan_layers"),
    (dict(moe_norm_topk="yes"), r"ModelConfig.moe_norm_topk='yes': must be True, False or None"),
    (dict(moe_first_dense=2), r"ModelConfig.moe_first_dense=2: must be an integer in \[0, num_"),
    (dict(moe_experts=0, moe_d_ff=8), "ModelConfig.moe_d_ff=8: needs moe_experts > 0"),
  ],
)
def test_bad_moe_fields_are_one_line(fields, message):
  with pytest.raises(ValueError, match=message) as e:
    _config(**fields)
  assert "\n" not in str(e.value)


def test_bad_moe_field_in_an_experiment_config_is_one_line():
  config = experiment.default_config()
  config.model.update(moe_experts=2, moe_top_k=3)
  with pytest.raises(ValueError) as e:
    experiment.validate(config)
  assert str(e.value).endswith("ModelConfig.moe_top_k=3: must be an integer in [1, moe_experts=2]")
  assert "\n" not in str(e.value)
