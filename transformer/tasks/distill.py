"""Knowledge distillation (Hinton, Vinyals and Dean 2015): a student trained on a frozen
teacher's softened predictions, mixed with the labels.

  loss = (1 - alpha) * CE(labels, student) + alpha * tau^2 * KL(p_teacher || p_student)

per weighted position, with p = softmax(logits / tau) for both models; tau^2 keeps the
soft term's gradients on the scale of the hard term's as tau changes (their section 2).
Label smoothing and the z-loss apply to the CE term as in every task, and a MoE student's
auxiliary losses are added unscaled.

  data.kind='distill'          next-token prediction (the `lm` task's data, samples and
                               evaluations) of a decoder student
  config.task.teacher          a run of this project (its workdir) or hf:DIR
  config.task.temperature      tau > 0
  config.task.alpha            in [0, 1]; 0 trains on the labels alone

The teacher is loaded once, when the run is built (`Task.frozen`), and must share the
student's output space (its vocabulary size; the token ids must mean the same: train the
teacher on the same data and tokenizer). Its parameters live in the train state's
`frozen` variables: checkpointed with the run, with no optimizer state, never updated
(the gradient flows through the student only). It runs in the student's dtype, without
dropout. Evaluations score the student alone, against the labels, so an evaluation loss
compares with an undistilled student's. Metrics: `distill_kl`, the mean soft term (KL at
tau, nats per weighted position), beside the mixed `loss`.

Letters: B batch, T positions, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.data.config import DataConfig, fail
from transformer.data.files import one_line
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model
from transformer.tasks.base import CrossEntropyOptions, LoadFn
from transformer.tasks.lm import LanguageModeling

KL = "distill_kl"  # the metric of the soft term, logged in training steps


def soft_kl_mean(
  teacher_logits: jax.Array, student_logits: jax.Array, weights: jax.Array, temperature: float
) -> jax.Array:
  """Mean over weighted positions of KL(softmax(t / tau) || softmax(s / tau)), float32.

  logits [B, T, V] (or [B, V]), weights of their leading shape; positions with weight 0
  contribute exactly 0 (selected away, so their logits cannot leak a NaN)."""
  t = teacher_logits.astype(jnp.float32) / temperature
  s = student_logits.astype(jnp.float32) / temperature
  log_p, log_q = jax.nn.log_softmax(t, axis=-1), jax.nn.log_softmax(s, axis=-1)
  kl = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)  # [B, T]
  weights = weights.astype(jnp.float32)
  total = jnp.sum(jnp.where(weights > 0, kl * weights, 0.0))
  return total / jnp.maximum(jnp.sum(weights), jnp.finfo(jnp.float32).tiny)


@dataclasses.dataclass(frozen=True)
class DistillOptions(CrossEntropyOptions):
  """`config.task.*` of distillation (label smoothing and z-loss apply to the CE term)."""

  teacher: str = ""  # the frozen teacher: a run's workdir or hf:DIR
  temperature: float = 2.0  # tau: softmax temperature of both distributions
  alpha: float = 0.5  # weight of the soft (KL) term; the labels get 1 - alpha

  def __post_init__(self):
    super().__post_init__()
    if not (math.isfinite(self.temperature) and self.temperature > 0):
      fail("task.temperature", self.temperature, "must be a number > 0")
    if not 0.0 <= self.alpha <= 1.0:
      fail("task.alpha", self.alpha, "must be in [0, 1]")


@dataclasses.dataclass(frozen=True)
class Distillation(LanguageModeling):
  name = "distill"
  Options = DistillOptions

  teacher_model: nn.Module | None = None  # built by `frozen`, from the teacher's config

  def check(self, model: ModelConfig, data: DataConfig) -> None:
    super().check(model, data)
    if not self.options.teacher:
      fail("task.teacher", "", "distill needs a teacher: a run's workdir or hf:DIR")

  def frozen(self, model: ModelConfig, load: LoadFn) -> tuple[Distillation, Any]:
    """The teacher's model and parameters, refused in one line when its output space is
    not the student's."""
    source = self.options.teacher
    try:
      teacher, params = load(source)
    except (OSError, ValueError) as e:
      message = str(e) if str(e).startswith("config.") else one_line(e)
      raise ValueError(f"config.task.teacher={source!r}: {message}") from None
    if teacher.family not in self.families:
      fail("task.teacher", source, f"is a {teacher.family!r} model; distill reads "
           f"{' or '.join(self.families)} teachers")  # fmt: skip
    if teacher.vocab_size != model.vocab_size:
      sizes = f"{teacher.vocab_size} ids and the student's {model.vocab_size}"
      rule = f"its vocabulary has {sizes}: teacher and student must share the output space"
      fail("task.teacher", source, rule)
    teacher = teacher.replace(dropout_rate=0.0, attention_dropout_rate=0.0, dtype=model.dtype)
    return dataclasses.replace(self, teacher_model=build_model(teacher)), {"teacher": params}

  def loss(self, model, batch, deterministic, frozen):
    logits, targets, weights = self.forward(model, batch, deterministic)
    ce_sum, weight_sum, metrics = self.cross_entropy(logits, targets, weights)
    if frozen is None:  # evaluation: the student alone, against the labels
      return ce_sum, weight_sum, metrics
    teacher_logits, _, _ = self.apply(self.teacher_model, {"params": frozen["teacher"]}, batch)
    tau, alpha = self.options.temperature, self.options.alpha
    kl = soft_kl_mean(jax.lax.stop_gradient(teacher_logits), logits, weights, tau)
    kl_sum = kl * weight_sum
    mixed = (1.0 - alpha) * ce_sum + alpha * tau**2 * kl_sum
    return mixed, weight_sum, {**metrics, KL: kl_sum}
