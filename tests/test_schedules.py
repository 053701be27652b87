"""Learning-rate schedules: paper values, step convention, shapes of the curves, validation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.train import schedules


def _values(schedule, counts):
  return np.array([float(schedule(c)) for c in counts])


def test_noam_paper_values_at_formula_steps_1_100_4000_8000():
  schedule = schedules.create_schedule("noam", d_model=64, warmup_steps=4000, scale=1.0)
  steps = [1, 100, 4000, 8000]
  counts = [s - 1 for s in steps]  # the update numbered `step` runs at optax count step - 1
  assert [round(v, 5) for v in _values(schedule, counts)] == [0.0, 5e-05, 0.00198, 0.0014]


def test_noam_matches_formula_and_peaks_at_warmup():
  d_model, warmup, scale = 512, 4000, 2.0
  schedule = schedules.noam(d_model, warmup, scale)
  counts = np.arange(0, 20_000, 37)
  got = _values(schedule, counts)
  step = counts + 1.0
  want = scale * d_model**-0.5 * np.minimum(step**-0.5, step * warmup**-1.5)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  peak = float(schedule(warmup - 1))
  assert peak == pytest.approx(scale * (d_model * warmup) ** -0.5, rel=1e-6)
  assert float(schedule(warmup - 2)) < peak and float(schedule(warmup)) < peak


def test_cosine_warmup_reaches_peak_then_decays_to_final_fraction():
  lr, warmup, total, final = 1e-3, 10, 110, 0.1
  schedule = schedules.create_schedule(
    "cosine", learning_rate=lr, warmup_steps=warmup, total_steps=total, final_fraction=final
  )
  assert float(schedule(0)) == pytest.approx(lr / warmup, rel=1e-6)  # first update: step 1
  assert float(schedule(warmup - 1)) == pytest.approx(lr, rel=1e-6)
  midpoint = warmup + (total - warmup) // 2  # formula step
  assert float(schedule(midpoint - 1)) == pytest.approx(lr * (final + (1 - final) * 0.5), rel=1e-5)
  assert float(schedule(total - 1)) == pytest.approx(lr * final, rel=1e-5)
  assert float(schedule(total + 1000)) == pytest.approx(lr * final, rel=1e-5)
  decay = _values(schedule, range(warmup - 1, total))
  assert np.all(np.diff(decay) <= 1e-12)


def test_rsqrt_is_linear_warmup_then_inverse_sqrt_normalised_to_peak():
  lr, warmup = 0.01, 100
  schedule = schedules.create_schedule("rsqrt", learning_rate=lr, warmup_steps=warmup)
  assert float(schedule(49)) == pytest.approx(lr * 0.5, rel=1e-6)
  assert float(schedule(warmup - 1)) == pytest.approx(lr, rel=1e-6)
  assert float(schedule(4 * warmup - 1)) == pytest.approx(lr / 2, rel=1e-6)
  assert float(schedule(100 * warmup - 1)) == pytest.approx(lr / 10, rel=1e-6)


def test_constant_with_and_without_warmup():
  plain = schedules.create_schedule("constant", learning_rate=3e-4)
  assert _values(plain, [0, 1, 10**6]) == pytest.approx([3e-4] * 3, rel=1e-6)
  warm = schedules.create_schedule("constant", learning_rate=3e-4, warmup_steps=4)
  assert _values(warm, [0, 1, 3, 50]) == pytest.approx([0.75e-4, 1.5e-4, 3e-4, 3e-4], rel=1e-6)


@pytest.mark.parametrize(
  "block",
  [
    {"kind": "noam", "d_model": 64, "warmup_steps": 10},
    {"kind": "cosine", "learning_rate": 1.0, "warmup_steps": 3, "total_steps": 40},
    {"kind": "rsqrt", "learning_rate": 1.0, "warmup_steps": 3},
    {"kind": "constant", "learning_rate": 1.0, "warmup_steps": 3},
  ],
)
def test_schedules_trace_under_jit_and_vmap_as_float32(block):
  schedule = schedules.create_schedule(**block)
  counts = jnp.arange(30, dtype=jnp.int32)
  jitted = jax.jit(jax.vmap(schedule))(counts)
  assert jitted.dtype == jnp.float32 and jitted.shape == (30,)
  np.testing.assert_allclose(np.asarray(jitted), _values(schedule, range(30)), rtol=1e-5)
  assert np.all(np.asarray(jitted) > 0)


def test_one_block_may_carry_every_field():
  block = dict(
    kind="rsqrt",
    learning_rate=0.5,
    warmup_steps=4,
    total_steps=100,
    d_model=8,
    scale=3.0,
    final_fraction=0.0,
  )
  assert float(schedules.create_schedule(**block)(3)) == pytest.approx(0.5)


@pytest.mark.parametrize(
  ("block", "field"),
  [
    ({"kind": "linear", "learning_rate": 1.0}, "kind"),
    ({"kind": "noam", "d_model": 64, "warmup_step": 10}, "warmup_step"),
    ({"kind": "noam", "warmup_steps": 10}, "d_model"),
    ({"kind": "noam", "d_model": 0, "warmup_steps": 10}, "d_model"),
    ({"kind": "noam", "d_model": 64, "warmup_steps": 0}, "warmup_steps"),
    ({"kind": "noam", "d_model": 64, "warmup_steps": 10, "scale": -1.0}, "scale"),
    ({"kind": "cosine", "learning_rate": 1.0}, "total_steps"),
    ({"kind": "cosine", "learning_rate": 1.0, "total_steps": 5, "warmup_steps": 5}, "total_steps"),
    ({"kind": "cosine", "learning_rate": 1, "total_steps": 9, "final_fraction": 2}, "final_"),
    ({"kind": "rsqrt", "learning_rate": 1.0}, "warmup_steps"),
    ({"kind": "constant", "learning_rate": math.nan}, "learning_rate"),
    ({"kind": "constant", "learning_rate": 1.0, "warmup_steps": 2.5}, "warmup_steps"),
    ({"kind": "constant"}, "learning_rate"),
  ],
)
def test_bad_fields_raise_value_error_naming_the_field(block, field):
  with pytest.raises(ValueError, match=field):
    schedules.create_schedule(**block)
