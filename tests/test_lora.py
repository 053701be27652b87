"""LoRA adapters (transformer/nn/lora.py): exact at init, only adapters train, merge is exact.

- Fresh adapters (B = 0) leave the outputs those of the base model (to float rounding).
- Fine-tuning a Hugging Face directory (`init_from='hf:DIR'`) through the real train loop:
  every base weight in the final checkpoint is bit-identical to the directory's, the
  adapters moved, and the exported directory holds the merged weights (`convert.save`
  merges).
- `merge_lora` folds the adapters into the kernels: the plain model with merged weights
  gives the logits of base + adapters within 1e-5; scanned (stacked) layers merge alike.
- A target pattern that matches no projection is one line naming it, before compiling.
"""

from __future__ import annotations

import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_recipes import make_tiny_hf, tiny

from transformer import convert
from transformer.nn import lora, tree
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.train import checkpoints, setup
from transformer.train import loop as train_lib
from transformer.train.optimizer import create_optimizer

ALL = ("query", "key", "value", "out", "ffn/")  # every attention and FFN projection


def _config(**fields) -> ModelConfig:
  base = dict(
    vocab_size=40, d_model=32, num_heads=4, num_kv_heads=2, num_layers=2, d_ff=48, max_len=16,
    lora_rank=4, lora_alpha=8.0, lora_targets=ALL,
  )  # fmt: skip
  return ModelConfig(**{**base, **fields})


def _tokens(b=2, t=12, vocab=40):
  return jnp.asarray(np.random.default_rng(0).integers(1, vocab, (b, t)), jnp.int32)


def _flat(params):
  return {tree.path_str(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}


def _without_adapters(params):
  flat = {
    tree.path_str(k): v
    for k, v in jax.tree_util.tree_leaves_with_path(params)
    if tree.path_names(k)[-1] not in lora.ADAPTERS
  }
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def test_fresh_adapters_leave_outputs_unchanged():
  c = _config()
  tokens = _tokens()
  params = jax.jit(build_model(c).init)(jax.random.key(0), tokens)["params"]
  adapted = lora.adapted_paths(params)
  assert len(adapted) == 2 * 6, adapted  # query, key, value, out, ffn/wi, ffn/wo per layer
  assert all(re.search("|".join(c.lora_targets), p) for p in adapted)
  with_adapters = jax.jit(build_model(c).apply)({"params": params}, tokens)
  base = build_model(c.replace(lora_rank=0))
  plain = jax.jit(base.apply)({"params": _without_adapters(params)}, tokens)
  # B = 0: the adapters add exact zeros (XLA may fuse the sums differently: float rounding).
  np.testing.assert_allclose(np.asarray(with_adapters), np.asarray(plain), rtol=1e-6, atol=1e-6)


def test_trainable_are_the_adapters_and_the_new_heads():
  c = _config(family="encoder", num_classes=3, lora_targets=("self_attention/query",))
  shapes = jax.eval_shape(build_model(c).init, jax.random.key(0), _tokens())["params"]
  assert lora.adapted_paths(shapes) == [
    f"encoder/layers/layer_{i}/self_attention/query" for i in range(2)
  ]
  mask = {tree.path_str(k): v for k, v in jax.tree_util.tree_leaves_with_path(
    lora.trainable(c, shapes))}  # fmt: skip
  trained = sorted(k for k, v in mask.items() if v)
  assert trained == sorted(
    [f"encoder/layers/layer_{i}/self_attention/query/lora_{x}" for i in range(2) for x in "ab"]
    + ["classifier/bias", "classifier/kernel", "pooler/bias", "pooler/kernel"]
  )  # PEFT's modules_to_save: a classifier head that init_from does not bring trains fully
  assert lora.trainable(c.replace(lora_rank=0), shapes) is None


def _randomize_adapters(params, seed=1):
  rng = np.random.default_rng(seed)

  def fill(keypath, leaf):
    if tree.path_names(keypath)[-1] in lora.ADAPTERS:
      return jnp.asarray(0.3 * rng.standard_normal(leaf.shape), jnp.float32)
    return leaf

  return jax.tree_util.tree_map_with_path(fill, params)


def test_merged_weights_give_the_logits_of_base_plus_adapters():
  c = _config()
  tokens = _tokens()
  params = _randomize_adapters(jax.jit(build_model(c).init)(jax.random.key(0), tokens)["params"])
  with_adapters = jax.jit(build_model(c).apply)({"params": params}, tokens)
  merged, merged_cfg = lora.merge_lora(params, c)
  assert merged_cfg.lora_rank == 0 and lora.adapter_params(merged) == 0
  plain = jax.jit(build_model(merged_cfg).apply)({"params": merged}, tokens)
  np.testing.assert_allclose(np.asarray(plain), np.asarray(with_adapters), atol=1e-5)
  query = "decoder/layer_0/self_attention/query/kernel"
  moved = _flat(merged)[query] - _flat(params)[query]
  assert np.abs(moved).max() > 0.1  # the adapters are not negligible next to the base

  # nn.scan stacks the layers (kernel, A and B get a leading layer axis): merged layer by
  # layer, the stacked tree gives the stacked merged kernels.
  layers = [params["decoder"][f"layer_{i}"] for i in range(c.num_layers)]
  stacked = {"decoder": {"layers": {"block": jax.tree.map(lambda *x: jnp.stack(x), *layers)}}}
  merged_stack, _ = lora.merge_lora(stacked, c.replace(scan_layers=True))
  want = jax.tree.map(
    lambda *x: np.stack(x), *[merged["decoder"][f"layer_{i}"] for i in range(c.num_layers)]
  )
  got = merged_stack["decoder"]["layers"]["block"]
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
  script = make_tiny_hf()
  return script.make("gpt2", tmp_path_factory.mktemp("hf") / "gpt2", texts=script.corpus(60))


def test_fine_tuning_an_hf_model_trains_only_the_adapters(gpt2_dir, tmp_path):
  config = tiny(
    "finetune_gpt2_shakespeare", init_from=f"hf:{gpt2_dir}", num_train_steps=3,
    checkpoint_every=3,
  )  # fmt: skip
  config.model.update(
    dropout_rate=0.0, attention_dropout_rate=0.0, lora_rank=4, lora_targets=("query", "ffn/wo")
  )
  train_lib.train_and_evaluate(config, str(tmp_path / "run"))
  with checkpoints.CheckpointManager(tmp_path / "run" / "checkpoints", async_save=False) as mgr:
    trained = mgr.restore_numpy(mgr.latest_step())["params"]
  _, hf_params = convert.load(gpt2_dir)
  start, end = _flat(hf_params["params"]), _flat(trained)
  adapters = {k for k in end if k.rsplit("/", 1)[-1] in lora.ADAPTERS}
  assert set(end) - set(start) == adapters and len(adapters) == 4  # query and wo, A and B
  for path, value in start.items():  # the base is frozen: not one bit moved
    if path == "embedder/positions/embedding":
      value = value[: config.model.max_len]  # the run keeps the first max_len positions
    np.testing.assert_array_equal(end[path], value, err_msg=path)
  for path in adapters:
    if path.endswith("lora_b"):
      assert np.abs(end[path]).max() > 0, path  # B started at 0 and moved

  # Export merges the adapters: the written weights are W + alpha/r A B (the merged
  # model's logits are compared with base + adapters in the test above).
  lora_cfg = setup.load_model_config(str(tmp_path / "run"))  # the run's, with its adapters
  assert (lora_cfg.lora_rank, lora_cfg.lora_targets) == (4, ("query", "ffn/wo"))
  convert.save(tmp_path / "export", lora_cfg, trained, "GPT2LMHeadModel")
  export_cfg, exported = convert.load(tmp_path / "export")
  assert export_cfg.lora_rank == 0
  merged, _ = lora.merge_lora(trained, lora_cfg)
  exported = _flat(exported["params"])
  assert set(exported) == set(_flat(merged))
  for path, value in _flat(merged).items():
    np.testing.assert_allclose(exported[path], value, rtol=1e-6, atol=1e-7, err_msg=path)
  query = "decoder/layer_0/self_attention/query/kernel"
  assert np.abs(exported[query] - start[query]).max() > 0  # the adapters are in the export


def test_a_target_that_matches_nothing_is_one_line_before_compiling(monkeypatch, tmp_path):
  from tiny_lm_config import get_config

  config = get_config()
  config.model.update(lora_rank=2, lora_targets=("query", "ffn/w_in"))
  compiled = []
  monkeypatch.setattr(jax, "jit", lambda *a, **k: compiled.append(a) or pytest.fail("compiled"))
  with pytest.raises(ValueError) as e:
    train_lib.train_and_evaluate(config, str(tmp_path))
  message = str(e.value)
  assert "\n" not in message and not compiled
  assert message.startswith("ModelConfig.lora_targets=('query', 'ffn/w_in'): pattern 'ffn/w_in'")
  assert "projections: key, out, query, value, wi, wo" in message
  with pytest.raises(ValueError, match=r"ModelConfig.lora_targets=\('\(',\): pattern '\('"):
    _config(lora_targets=("(",))


def test_frozen_parameters_get_zero_updates_and_no_moments():
  params = {"kernel": jnp.ones((3, 4)), "lora_a": jnp.ones((3, 2)), "lora_b": jnp.zeros((2, 4))}
  trainable = {"kernel": False, "lora_a": True, "lora_b": True}
  grads = jax.tree.map(lambda p: jnp.full(p.shape, 100.0), params)
  adam = create_optimizer({}, 0.1, params, trainable=trainable)
  state = jax.jit(adam.init)(params)
  assert sum(x.size for x in jax.tree.leaves(state)) == 2 * (6 + 8) + 1  # m, v, count
  updates, _ = jax.jit(adam.update)(grads, state, params)
  assert not np.any(np.asarray(updates["kernel"]))
  assert np.all(np.asarray(updates["lora_b"]) != 0)
  # Clipping sees the trained gradients only: plain SGD's update is the clipped gradient.
  sgd = create_optimizer(
    {"kind": "sgd", "momentum": 0.0, "clip_norm": 1.0}, 1.0, params, trainable=trainable
  )
  updates, _ = jax.jit(lambda g, p: sgd.update(g, sgd.init(p), p))(grads, params)
  assert not np.any(np.asarray(updates["kernel"]))
  norm = float(optax.tree.norm({k: updates[k] for k in ("lora_a", "lora_b")}))
  assert norm == pytest.approx(1.0, rel=1e-6)
