"""The WSD schedule, Lion and Muon against independent NumPy (float64) references.

WSD: values at chosen steps equal the piecewise formula. Lion: sign(b1 m + (1 - b1) g)
with decoupled, masked weight decay and the b2 momentum. Muon: momentum (Nesterov, bias
corrected as optax), a Newton-Schulz quintic written here from Jordan et al.'s formula
X <- a X + b (X X^T) X + c (X X^T)^2 X, the shape scale, masked decay, and AdamW on
everything that is not a hidden weight matrix. Each optimizer runs three updates so the
momentum matters.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_tiny_config

from transformer.nn.models import build_model
from transformer.nn.tree import path_str
from transformer.train import experiment, muon, schedules
from transformer.train import optimizer as optimizer_lib

# ----------------------------------------------------------------------------------------
# WSD.

SHAPES = {
  "linear": lambda p: 1.0 - p,
  "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
  "1-sqrt": lambda p: 1.0 - math.sqrt(p),
}


def _wsd_formula(step, lr, warmup, total, decay, shape, final):
  """The WSD learning rate of formula step `step` (1-based), from its definition."""
  floor = lr * final
  start = total - decay
  if step <= warmup:
    return lr * step / warmup
  if step <= start:
    return lr
  if step <= total:
    return floor + (lr - floor) * SHAPES[shape]((step - start) / decay)
  return floor


@pytest.mark.parametrize("shape", list(SHAPES))
def test_wsd_values_equal_the_formula(shape):
  lr, warmup, total, fraction, final = 3e-3, 10, 200, 0.15, 0.1  # decay: 30 steps from 170
  schedule = schedules.create_schedule(
    "wsd",
    learning_rate=lr,
    warmup_steps=warmup,
    total_steps=total,
    decay_fraction=fraction,
    decay_shape=shape,
    final_fraction=final,
  )
  steps = [1, 5, 10, 11, 100, 170, 171, 178, 185, 199, 200, 201, 500]
  got = np.array([float(schedule(s - 1)) for s in steps])  # optax count = step - 1
  want = [_wsd_formula(s, lr, warmup, total, 30, shape, final) for s in steps]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert got[steps.index(200)] == pytest.approx(lr * final, rel=1e-6)  # reaches the floor
  under_jit = jax.jit(schedule)(jnp.arange(total))  # traced counts give the same values
  np.testing.assert_allclose(under_jit, [schedule(c) for c in range(total)], rtol=1e-6)


def test_wsd_from_the_config_block_uses_num_train_steps():
  config = experiment.default_config()
  config.data.path = "unused.txt"
  config.num_train_steps = 40
  config.schedule.kind = "wsd"
  config.schedule.warmup_steps = 4
  config.schedule.decay_fraction = 0.25  # 10 decay steps from step 30
  config.schedule.decay_shape = "1-sqrt"
  exp = experiment.validate(config)
  want = [_wsd_formula(s, 1e-3, 4, 40, 10, "1-sqrt", 0.0) for s in (2, 30, 34, 40)]
  np.testing.assert_allclose([float(exp.schedule(s - 1)) for s in (2, 30, 34, 40)], want)


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("decay_shape", "exp", r"config.schedule: decay_shape must be one of .*got 'exp'"),
    ("decay_fraction", 0.0, r"config.schedule: decay_fraction must be a number in \(0, 1\]"),
    ("decay_fraction", 0.01, r"gives round\(0.01 \* total_steps=40\) = 0 decay steps"),
    ("decay_fraction", 0.95, r"warmup_steps=4 \+ 38 .* > total_steps=40"),
  ],
)
def test_bad_wsd_fields_are_one_line_errors(field, value, message):
  config = experiment.default_config()
  config.data.path = "unused.txt"
  config.num_train_steps = 40
  config.schedule.update(kind="wsd", warmup_steps=4, **{field: value})
  with pytest.raises(ValueError, match=message) as error:
    experiment.validate(config)
  assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------------------
# Toy problems.


def _toy_params(rng):
  """A tree named like our models: matrices, a scanned FFN, embeddings, head, norm, biases."""
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  return {
    "token_embed": {"embedding": normal(10, 8)},
    "decoder": {
      "layer_0": {
        "self_attention": {
          "query": {"kernel": normal(8, 2, 3), "bias": normal(2, 3)},  # [D, N, H]
          "out": {"kernel": normal(2, 3, 8)},  # [N, H, D]
        },
        "ffn": {"wi": {"kernel": normal(8, 12)}, "wo": {"kernel": normal(12, 8)}},
        "ffn_norm": {"scale": normal(8)},
      },
      "layers": {"block": {"ffn": {"wi": {"kernel": normal(2, 8, 5)}}}},  # nn.scan: [L, D, F]
    },
    "lm_head": {"kernel": normal(8, 10)},
  }


def _flat(tree):
  return {
    path_str(k): np.asarray(v, np.float64) for k, v in jax.tree_util.tree_leaves_with_path(tree)
  }


def _decayed(path: str) -> bool:
  """Our mask, restated: no decay for biases, norm scales or embeddings."""
  leaf = path.split("/")[-1]
  return leaf not in ("bias", "scale") and "norm" not in path and "embedding" not in leaf


def _run(block, lr, params, grads):
  """Params after each update of `create_optimizer(block, lr, params)`."""
  tx = optimizer_lib.create_optimizer(block, lr, params)
  update = jax.jit(tx.update)
  state, out = tx.init(params), []
  for g in grads:
    updates, state = update(g, state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    out.append(_flat(params))
  return out


def _lr(count):
  return 0.01 * (1.0 + 0.5 * count)  # a schedule, so the count it is called at matters


# ----------------------------------------------------------------------------------------
# Lion.


def test_lion_equals_numpy_reference():
  rng = np.random.default_rng(0)
  params = _toy_params(rng)
  grads = [jax.tree.map(lambda p: rng.standard_normal(p.shape).astype(np.float32), params)]
  grads += [jax.tree.map(lambda p: rng.standard_normal(p.shape).astype(np.float32), params)]
  grads += [grads[0]]
  b1, b2, wd = 0.9, 0.99, 0.3
  block = {"kind": "lion", "b1": b1, "b2": b2, "weight_decay": wd}
  got = _run(block, _lr, params, grads)

  p, m = _flat(params), {k: 0.0 for k in _flat(params)}
  for t, g in enumerate(map(_flat, grads)):
    for k in p:
      c = b1 * m[k] + (1 - b1) * g[k]
      p[k] = p[k] - _lr(t) * (np.sign(c) + (wd * p[k] if _decayed(k) else 0.0))
      m[k] = b2 * m[k] + (1 - b2) * g[k]
    for k in p:
      np.testing.assert_allclose(got[t][k], p[k], rtol=1e-6, atol=1e-6, err_msg=f"{t} {k}")


# ----------------------------------------------------------------------------------------
# Muon.

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # Jordan et al. 2024 (modded-nanogpt), also optax's


def newton_schulz(m: np.ndarray, steps: int) -> np.ndarray:
  """The quintic Newton-Schulz iteration on m / ||m||_F, on the wide orientation."""
  a, b, c = NS_COEFFS
  x = m / (np.linalg.norm(m) + 1e-8)
  tall = x.shape[0] > x.shape[1]
  if tall:
    x = x.T
  for _ in range(steps):
    gram = x @ x.T
    x = a * x + (b * gram + c * gram @ gram) @ x
  return x.T if tall else x


# path -> (stacked batch axes, input axes) of the Muon matrices of `_toy_params`
MATRICES = {
  "decoder/layer_0/self_attention/query/kernel": (0, 1),  # D -> N*H
  "decoder/layer_0/self_attention/out/kernel": (0, 2),  # N*H -> D
  "decoder/layer_0/ffn/wi/kernel": (0, 1),
  "decoder/layer_0/ffn/wo/kernel": (0, 1),
  "decoder/layers/block/ffn/wi/kernel": (1, 1),  # one matrix per layer
}


def _muon_update(mom: np.ndarray, path: str, steps: int, rms: float) -> np.ndarray:
  batch, inputs = MATRICES[path]
  shape = mom.shape
  fan_in = math.prod(shape[batch : batch + inputs])
  fan_out = math.prod(shape[batch + inputs :])
  mats = mom.reshape(-1, fan_in, fan_out)  # batch axes lead
  ortho = np.stack([newton_schulz(x, steps) for x in mats]).reshape(shape)
  scale = rms * math.sqrt(max(fan_in, fan_out)) if rms else math.sqrt(max(1.0, fan_out / fan_in))
  return scale * ortho


@pytest.mark.parametrize("nesterov, rms", [(True, 0.0), (False, 0.2)])
def test_muon_equals_numpy_reference_with_adamw_for_the_rest(nesterov, rms):
  rng = np.random.default_rng(1)
  params = _toy_params(rng)
  grads = [
    jax.tree.map(lambda p: rng.standard_normal(p.shape).astype(np.float32), params)
    for _ in range(3)
  ]
  beta, b1, b2, eps, wd, lr_scale = 0.9, 0.8, 0.95, 1e-6, 0.1, 3.0
  block = {
    "kind": "muon",
    "b1": b1,
    "b2": b2,
    "eps": eps,
    "weight_decay": wd,
    "muon_beta": beta,
    "muon_nesterov": nesterov,
    "muon_lr_scale": lr_scale,
    "muon_consistent_rms": rms,
  }
  got = _run(block, _lr, params, grads)
  labels = jax.tree_util.tree_leaves_with_path(muon.labels(params))
  assert {path_str(k) for k, v in labels if v == "muon"} == set(MATRICES)

  p = _flat(params)
  m = {k: 0.0 for k in p}
  v = {k: 0.0 for k in p}
  for t, g in enumerate(map(_flat, grads), start=1):
    lr = _lr(t - 1)
    for k in p:
      decay = wd * p[k] if _decayed(k) else 0.0
      if k in MATRICES:
        m[k] = beta * m[k] + (1 - beta) * g[k]
        if nesterov:  # optax: bias-corrected look-ahead
          mom = beta * m[k] / (1 - beta ** (t + 1)) + (1 - beta) * g[k] / (1 - beta**t)
        else:
          mom = m[k] / (1 - beta**t)
        p[k] = p[k] - lr_scale * lr * (_muon_update(mom, k, 5, rms) + decay)
      else:  # AdamW
        m[k] = b1 * m[k] + (1 - b1) * g[k]
        v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
        m_hat, v_hat = m[k] / (1 - b1**t), v[k] / (1 - b2**t)
        p[k] = p[k] - lr * (m_hat / (np.sqrt(v_hat) + eps) + decay)
    for k in p:
      np.testing.assert_allclose(got[t - 1][k], p[k], rtol=1e-5, atol=2e-5, err_msg=f"{t} {k}")


def test_muon_treats_only_hidden_matrices_of_real_models_as_matrices():
  def muon_paths(family, **overrides):
    c = make_tiny_config(family, **overrides)
    x = jnp.zeros((1, 8, 8, 3)) if family == "vit" else jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: build_model(c).init(jax.random.key(0), x))["params"]
    labels = jax.tree_util.tree_leaves_with_path(muon.labels(shapes))
    return {path_str(k) for k, v in labels if v == "muon"}

  layer = "decoder/layers/block"
  assert muon_paths("decoder", scan_layers=True, tie_embeddings=False) == {
    f"{layer}/{m}/kernel"
    for m in ("self_attention/query", "self_attention/key", "self_attention/value")
    + ("self_attention/out", "ffn/wi", "ffn/wo")
  }
  classifier = muon_paths("encoder", num_classes=3)
  assert "pooler/kernel" in classifier and not {"classifier/kernel"} & classifier
  vit = muon_paths("vit")
  assert not {"patch_embed/kernel", "head/kernel"} & vit and len(vit) == 2 * 6


def test_muon_without_hidden_matrices_and_bad_fields_are_one_line_errors():
  params = {
    "token_embed": {"embedding": np.zeros((4, 2), np.float32)},
    "norm": {"scale": np.ones(2, np.float32)},
  }
  with pytest.raises(
    ValueError, match=r"^optimizer.kind='muon': the model has no hidden weight"
  ) as e:
    optimizer_lib.create_optimizer({"kind": "muon"}, 0.1, params)
  assert "\n" not in str(e.value)
  for field, value, message in [
    ("muon_ns_steps", 0, r"config.optimizer: muon_ns_steps must be an int >= 1; got 0"),
    ("muon_beta", 1.0, r"config.optimizer: muon_beta must be a number in \[0.0, 1.0\)"),
    ("muon_lr_scale", 0.0, r"config.optimizer: muon_lr_scale must be a finite number > 0"),
    ("kind", "adam", r"config.optimizer: kind must be one of .*'lion', 'muon'"),
  ]:
    bad = experiment.default_config()
    bad.data.path = "unused.txt"
    bad.optimizer[field] = value
    with pytest.raises(ValueError, match=message):
      experiment.validate(bad)
