"""Optimizer: decay mask from path names, AdamW equals torch.optim.AdamW, float32 state."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from transformer.train import optimizer, schedules


class _Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    h = nn.LayerNorm(name="pre_norm")(x)
    h = nn.Dense(8, name="mlp")(h)
    return x + h, None


class _Tiny(nn.Module):
  scan: bool

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(16, 8, name="token_embed")(tokens)
    x = x + self.param("pos_embedding", nn.initializers.normal(0.02), (4, 8))
    if self.scan:
      x, _ = nn.scan(_Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)(
        name="layers"
      )(x, None)
    else:
      for i in range(3):
        x, _ = _Block(name=f"layers_{i}")(x, None)
    x = nn.RMSNorm(name="final_norm")(x)
    return nn.Dense(16, use_bias=False, name="head")(x)


@functools.cache
def _init(scan):
  init = jax.jit(lambda: _Tiny(scan=scan).init(jax.random.key(0), jnp.zeros((2, 4), jnp.int32)))
  return init()["params"]


def _flat_mask(mask):
  return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(mask)}


def test_decay_mask_by_path_names_for_unrolled_and_scanned_layers():
  for scan in (False, True):
    params = _init(scan)
    mask = _flat_mask(optimizer.decay_mask(params))
    layer = "['layers']" if scan else "['layers_1']"
    assert mask[f"{layer}['mlp']['kernel']"] is True
    assert mask[f"{layer}['mlp']['bias']"] is False
    assert mask[f"{layer}['pre_norm']['scale']"] is False
    assert mask[f"{layer}['pre_norm']['bias']"] is False
    assert mask["['final_norm']['scale']"] is False
    assert mask["['head']['kernel']"] is True
    assert mask["['token_embed']['embedding']"] is False
    assert mask["['pos_embedding']"] is False
    assert sum(mask.values()) == (2 if scan else 4)  # mlp kernels (1 stacked or 3) + head
  with_embed = _flat_mask(optimizer.decay_mask(_init(True), decay_embeddings=True))
  assert with_embed["['token_embed']['embedding']"] is True
  assert with_embed["['pos_embedding']"] is True
  assert with_embed["['final_norm']['scale']"] is False


def test_decay_mask_sees_through_partitioned_boxes_and_abstract_params():
  boxed = {
    "dense": {
      "kernel": nn.Partitioned(jnp.ones((2, 2)), names=("embed", "mlp")),
      "bias": nn.Partitioned(jnp.ones((2,)), names=("mlp",)),
    }
  }
  mask = optimizer.decay_mask(boxed)
  assert isinstance(mask["dense"]["kernel"], nn.Partitioned)
  assert mask["dense"]["kernel"].value is True and mask["dense"]["bias"].value is False
  abstract = jax.eval_shape(lambda: _init(True))
  assert optimizer.decay_mask(abstract) == optimizer.decay_mask(_init(True))


def _torch_adamw_steps(params, grads_per_step, lr, wd, b1, b2, eps, clip):
  tparams = {
    k: torch.nn.Parameter(torch.tensor(np.asarray(v), dtype=torch.float64))
    for k, v in params.items()
  }
  groups = [
    {"params": [tparams["kernel"]], "weight_decay": wd},
    {"params": [tparams["bias"]], "weight_decay": 0.0},
  ]
  opt = torch.optim.AdamW(groups, lr=lr, betas=(b1, b2), eps=eps)
  for grads in grads_per_step:
    opt.zero_grad()
    for k, p in tparams.items():
      p.grad = torch.tensor(np.asarray(grads[k]), dtype=torch.float64)
    if clip:
      torch.nn.utils.clip_grad_norm_(list(tparams.values()), clip)
    opt.step()
  return {k: p.detach().numpy() for k, p in tparams.items()}


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_adamw_matches_torch_adamw_with_bias_excluded_from_decay(clip):
  rng = np.random.default_rng(0)
  params = {
    "kernel": jnp.asarray(rng.standard_normal((5, 3)), jnp.float32),
    "bias": jnp.asarray(rng.standard_normal((3,)), jnp.float32),
  }
  grads = [
    {k: jnp.asarray(rng.standard_normal(v.shape), jnp.float32) for k, v in params.items()}
    for _ in range(4)
  ]
  block = {"kind": "adamw", "b1": 0.9, "b2": 0.98, "eps": 1e-9, "weight_decay": 0.1}
  block["clip_norm"] = clip
  lr = 1e-2
  tx = optimizer.create_optimizer(block, schedules.constant(lr), params)
  state = tx.init(params)
  p = params
  for g in grads:
    updates, state = tx.update(g, state, p)
    p = optax.apply_updates(p, updates)
  want = _torch_adamw_steps(params, grads, lr, 0.1, 0.9, 0.98, 1e-9, clip)
  for k in params:
    np.testing.assert_allclose(np.asarray(p[k]), want[k], rtol=2e-5, atol=2e-6)


def test_update_at_state_step_s_uses_schedule_of_s():
  params = {"w": jnp.ones((3,), jnp.float32)}
  schedule = schedules.constant(0.5, warmup_steps=4)  # 0.125, 0.25, 0.375, 0.5, ...
  tx = optimizer.create_optimizer({"kind": "sgd", "momentum": 0.0}, schedule, params)
  state = tx.init(params)
  grad = {"w": jnp.ones((3,), jnp.float32)}
  for step in range(6):
    updates, state = tx.update(grad, state, params)
    lr = float(optimizer.current_learning_rate(schedule, step))
    assert lr == pytest.approx(min(1.0, (step + 1) / 4) * 0.5)
    np.testing.assert_allclose(np.asarray(updates["w"]), -lr, rtol=1e-6)
  traced = jax.jit(lambda s: optimizer.current_learning_rate(schedule, s))(jnp.int32(1))
  assert float(traced) == pytest.approx(0.25)
  assert float(optimizer.current_learning_rate(3e-4, 10)) == pytest.approx(3e-4)


def test_optimizer_state_is_float32_and_bf16_master_weights_are_rejected():
  params = _init(scan=True)
  tx = optimizer.create_optimizer({"weight_decay": 0.1, "clip_norm": 1.0}, 1e-3, params)
  state = jax.jit(tx.init)(params)
  dtypes = {leaf.dtype for leaf in jax.tree.leaves(state)}
  assert dtypes == {jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}  # moments, counts
  grads = jax.tree.map(lambda x: jnp.ones_like(x, jnp.bfloat16), params)  # bf16 compute
  updates, state = jax.jit(tx.update)(grads, state, params)
  assert {leaf.dtype for leaf in jax.tree.leaves(state)} == dtypes
  assert {leaf.dtype for leaf in jax.tree.leaves(optax.apply_updates(params, updates))} == {
    jnp.dtype(jnp.float32)
  }
  bf16 = {**params, "head": {"kernel": params["head"]["kernel"].astype(jnp.bfloat16)}}
  with pytest.raises(ValueError, match=r"float32.*\['head'\]\['kernel'\]"):
    optimizer.create_optimizer({}, 1e-3, bf16)


def test_weight_decay_only_touches_masked_leaves():
  params = _init(scan=False)
  tx = optimizer.create_optimizer({"weight_decay": 0.5}, 0.1, params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)  # zero grads: only decay
  mask = optimizer.decay_mask(params)

  def check(u, p, m):
    expected = -0.1 * 0.5 * np.asarray(p) if m else np.zeros(p.shape)
    np.testing.assert_allclose(np.asarray(u), expected, rtol=1e-6, atol=1e-8)

  jax.tree.map(check, updates, params, mask)


@pytest.mark.parametrize("kind", ["sgd", "adafactor", "adamw"])
def test_every_kind_minimises_a_quadratic(kind):
  params = {"dense": {"kernel": jnp.full((4, 4), 3.0), "bias": jnp.full((4,), -2.0)}}
  tx = optimizer.create_optimizer({"kind": kind, "weight_decay": 1e-4}, 0.05, params)
  state = tx.init(params)
  loss = lambda p: sum(jnp.sum(x**2) for x in jax.tree.leaves(p))

  @jax.jit
  def step(p, s):
    updates, s = tx.update(jax.grad(loss)(p), s, p)
    return optax.apply_updates(p, updates), s

  start = float(loss(params))
  for _ in range(100):
    params, state = step(params, state)
  assert float(loss(params)) < 0.5 * start


@pytest.mark.parametrize(
  ("block", "field"),
  [
    ({"kind": "lamb"}, "kind"),
    ({"b2": 1.0}, "b2"),
    ({"b1": -0.1}, "b1"),
    ({"eps": 0.0}, "eps"),
    ({"weight_decay": -1.0}, "weight_decay"),
    ({"clip_norm": -1.0}, "clip_norm"),
    ({"decay_embeddings": "yes"}, "decay_embeddings"),
    ({"weight_decya": 0.1}, "weight_decya"),
  ],
)
def test_bad_fields_raise_value_error_naming_the_field(block, field):
  params = {"w": jnp.ones((2, 2))}
  with pytest.raises(ValueError, match=field):
    optimizer.create_optimizer(block, 1e-3, params)


def test_schedule_fields_in_the_same_block_are_ignored_and_bad_schedule_rejected():
  params = {"w": jnp.ones((2, 2))}
  block = {"kind": "adamw", "learning_rate": 1e-3, "warmup_steps": 10, "weight_decay": 0.1}
  assert isinstance(optimizer.create_optimizer(block, 1e-3, params), optax.GradientTransformation)
  with pytest.raises(ValueError, match="schedule"):
    optimizer.create_optimizer({}, -1.0, params)
  with pytest.raises(ValueError, match="mask excludes every parameter"):
    optimizer.create_optimizer({"weight_decay": 0.1}, 1e-3, {"bias": jnp.ones(2)})
