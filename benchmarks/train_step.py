"""Train-step throughput, compile time and MFU of our train step on the benchmark workloads.

  python benchmarks/train_step.py [--workload gpt] [--steps 20] [--dtype float32]

Workloads (`WORKLOADS`, shared with `torch_reference.py` and `compare.py`), all pre-LN,
exact GELU, learned positions, dropout 0.1 (embeddings, residual branches, feed-forward
hidden, attention weights), label smoothing 0.1, AdamW (3e-4, b2 0.98, eps 1e-9, weight
decay 1e-4), clipping at global norm 1.0:

  gpt      decoder LM: vocab 4096, D 256, 4 layers, 4 heads, F 1024, T 256, batch 16
  bert     masked LM of the same size (bidirectional, MLM head tied; 38 = round(15% of 256)
           positions per row scored, the head runs on those only)
  seq2seq  encoder-decoder of the same size, 4 + 4 layers, cross-attention, S = T = 256
  vit      ViT-Ti/4 on 28x28x1 images: D 192, 3 heads, 12 layers, F 768, 49 patches + [CLS],
           10 classes, batch 64

The step is `transformer.train.step` compiled by `StepRunner` (jit, one device,
state donated). MFU is model matmul FLOPs per second (`transformer.nn.models.flops_per_token`,
forward + backward) over the machine's matmul peak, measured here with large square
matmuls in the same dtype (`matmul_peak`). Prints a Markdown table.

Two process settings are applied before JAX starts (docs/PERFORMANCE.md): `--malloc heap`
(glibc keeps freed memory instead of unmapping it, so the step's temporaries are not
page-faulted in again every step) and `--xla_flags=--xla_cpu_prefer_vector_width=512`
(AVX-512 code for XLA's own loops). Pass `--malloc default --xla_flags=` for neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer import process_settings, tasks
from transformer.data import masking
from transformer.data.config import DataConfig
from transformer.nn.config import ModelConfig
from transformer.nn.models import build_model, flops_per_token
from transformer.train.machine import cpu_isa
from transformer.train.parallel import StepRunner, make_mesh
from transformer.train.step import StepConfig, create_train_state, train_step

# The reference GPT; the other workloads keep its sizes.
REFERENCE = dict(
  family="decoder", vocab_size=4096, d_model=256, num_heads=4, num_layers=4, d_ff=1024,
  max_len=256, position="learned", activation="gelu", dropout_rate=0.1,
  attention_dropout_rate=0.1,
)  # fmt: skip
VIT_TI_4 = dict(
  family="vit", d_model=192, num_heads=3, num_layers=12, d_ff=768, image_size=28,
  patch_size=4, num_channels=1, num_classes=10, max_len=50, position="learned",
  activation="gelu", norm_eps=1e-6, dropout_rate=0.1, attention_dropout_rate=0.1,
)  # fmt: skip
LEARNING_RATE, B2, EPS, WEIGHT_DECAY, CLIP, LABEL_SMOOTHING, MASK_RATE = (
  3e-4, 0.98, 1e-9, 1e-4, 1.0, 0.1, 0.15,
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Workload:
  """One benchmark model and its batch. `seq` is the tokens per example that tokens/s counts
  (the target side for seq2seq, patches + [CLS] for ViT)."""

  name: str
  model: ModelConfig
  kind: str  # lm | mlm | seq2seq | image (the task, transformer/tasks)
  batch: int
  seq: int

  @property
  def tokens_per_step(self) -> int:
    return self.batch * self.seq

  @property
  def task(self) -> tasks.Task:
    """The workload's task, with the MLM head at the masked positions as in training, and
    the label smoothing of the loss."""
    cls = tasks.get(self.kind)
    wanted = {"label_smoothing": LABEL_SMOOTHING, "mask_rate": MASK_RATE}
    taken = {f.name for f in dataclasses.fields(cls.Options)}
    options = cls.Options(**{k: v for k, v in wanted.items() if k in taken})
    return cls.create(DataConfig(kind=self.kind), self.seq, options)

  @property
  def mlm_predictions(self) -> int | None:
    """Positions per row the MLM head runs on (the MLM task's `max_predictions`)."""
    return masking.max_selected(MASK_RATE, self.seq) if self.kind == "mlm" else None

  @property
  def flops_per_step(self) -> float:
    """Model matmul FLOPs of one training step (forward + backward)."""
    per_token = flops_per_token(self.model, self.seq, True, self.mlm_predictions)
    return self.tokens_per_step * per_token


WORKLOADS = {
  "gpt": Workload("gpt", ModelConfig(**REFERENCE), "lm", 16, 256),
  "bert": Workload("bert", ModelConfig(**{**REFERENCE, "family": "encoder"}), "mlm", 16, 256),
  "seq2seq": Workload(
    "seq2seq", ModelConfig(**{**REFERENCE, "family": "seq2seq"}), "seq2seq", 16, 256
  ),
  "vit": Workload("vit", ModelConfig(**VIT_TI_4), "image", 64, 50),
}


def set_malloc_policy(policy: str) -> None:
  """'heap': glibc keeps freed memory (`process_settings.keep_freed_memory`), before JAX starts.

  With glibc's defaults each step's large temporaries (one 780 MB XLA buffer per GPT step)
  are mmap-ed and unmapped, and the kernel faults and zeroes them again every step.
  """
  if policy != "default" and not process_settings.keep_freed_memory():
    raise RuntimeError("mallopt failed (glibc needed for --malloc heap)")


add_xla_flags = process_settings.add_xla_flags  # appends to XLA_FLAGS


def with_model(w: Workload, **changes) -> Workload:
  return dataclasses.replace(w, model=w.model.replace(**changes))


def median_seconds(fn, repeats: int) -> float:
  """Median wall time of `fn()` over `repeats` calls (`fn` waits for its own result)."""
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def matmul_peak(dtype: str = "float32", sizes=(1024, 2048), repeats: int = 10) -> float:
  """Best achieved FLOP/s of n x n x n matmuls (2 n^3 FLOPs): the machine's practical peak."""
  best = 0.0
  for n in sizes:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    for _ in range(repeats):
      t = time.perf_counter()
      f(a).block_until_ready()
      best = max(best, 2 * n**3 / (time.perf_counter() - t))
  return best


def make_batch(w: Workload, rng: np.random.Generator) -> dict[str, np.ndarray]:
  """One batch in `transformer.data`'s format for the workload's kind (no padding)."""
  b, t, c = w.batch, w.seq, w.model
  ones = np.ones((b, t), np.int32)
  positions = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy()
  if w.kind == "image":
    image = rng.standard_normal((b, c.image_size, c.image_size, c.num_channels))
    return {
      "image": image.astype(np.float32),
      "label": rng.integers(0, c.num_classes, size=b).astype(np.int32),
    }
  if w.kind == "lm":
    tokens = rng.integers(1, c.vocab_size, size=(b, t + 1)).astype(np.int32)
    return {
      "inputs": tokens[:, :-1],
      "targets": tokens[:, 1:],
      "weights": np.ones((b, t), np.float32),
      "segment_ids": ones,
      "positions": positions,
    }
  tokens = rng.integers(2, c.vocab_size, size=(b, t)).astype(np.int32)
  if w.kind == "mlm":  # round(MASK_RATE * t) positions per row replaced by id 1 ([MASK]), scored
    scored = np.argsort(rng.random((b, t)), axis=-1)[:, : w.mlm_predictions]
    masked = np.zeros((b, t), bool)
    np.put_along_axis(masked, scored, True, axis=-1)
    return {
      "inputs": np.where(masked, 1, tokens).astype(np.int32),
      "targets": tokens,
      "weights": masked.astype(np.float32),
      "segment_ids": ones,
      "positions": positions,
    }
  source = rng.integers(2, c.vocab_size, size=(b, t)).astype(np.int32)
  return {
    "inputs": source,
    "targets": tokens,
    "weights": np.ones((b, t), np.float32),
    "inputs_segment_ids": ones,
    "targets_segment_ids": ones,
    "inputs_positions": positions,
    "targets_positions": positions,
  }


def optimizer() -> optax.GradientTransformation:
  return optax.chain(
    optax.clip_by_global_norm(CLIP),
    optax.adamw(LEARNING_RATE, b2=B2, eps=EPS, weight_decay=WEIGHT_DECAY),
  )


class OursStep:
  """Our compiled train step on one workload: `compile()` once, then `step()` per update."""

  def __init__(self, w: Workload, num_batches: int = 4, seed: int = 0):
    self.w = w
    model = build_model(w.model)
    tx = optimizer()
    step_cfg = StepConfig(
      model=model,
      tx=tx,
      task=w.task,
    )
    self.runner = StepRunner(step_cfg, "jit", make_mesh(jax.devices()[:1]), update=train_step)
    rng = np.random.default_rng(seed)
    self.batches = [make_batch(w, rng) for _ in range(num_batches)]
    init_batch = {k: v[:1] for k, v in self.batches[0].items()}
    args, kwargs = w.task.init_args(init_batch)
    params = jax.jit(lambda r: model.init(r, *args, **kwargs))(jax.random.PRNGKey(0))["params"]
    self.state = self.runner.place_state(create_train_state(params, tx, jax.random.PRNGKey(1)))
    self.placed = [self.runner.place_batch(b) for b in self.batches]
    self.compiled = None
    self.i = 0

  def compile(self) -> float:
    """Seconds to lower and compile the train step."""
    t = time.perf_counter()
    self.compiled = self.runner.train_step.lower(self.state, self.placed[0]).compile()
    return time.perf_counter() - t

  def step(self) -> float:
    """One update, waited for; returns its loss."""
    self.state, m = self.compiled(self.state, self.placed[self.i % len(self.placed)])
    self.i += 1
    return float(m["loss"])


def benchmark(w: Workload, steps: int, warmup: int = 3) -> dict:
  ours = OursStep(w)
  compile_s = ours.compile()
  for _ in range(warmup):
    ours.step()
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    loss = ours.step()
    times.append(time.perf_counter() - t)
  step_s = statistics.median(times)
  return {
    "compile_s": compile_s,
    "step_ms": 1e3 * step_s,
    "tokens_per_s": w.tokens_per_step / step_s,
    "model_flops_per_s": w.flops_per_step / step_s,
    "loss": loss,
  }


def main():
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--workload", default="gpt", choices=sorted(WORKLOADS))
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--batch", type=int, default=None, help="default: the workload's")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--attention_impl", default="xla")
  parser.add_argument("--malloc", default="heap", choices=["heap", "default"])
  parser.add_argument("--xla_flags", default="--xla_cpu_prefer_vector_width=512")
  args = parser.parse_args()
  set_malloc_policy(args.malloc)
  add_xla_flags(args.xla_flags)
  w = with_model(WORKLOADS[args.workload], dtype=args.dtype, attention_impl=args.attention_impl)
  if args.batch:
    w = dataclasses.replace(w, batch=args.batch)
  peak = matmul_peak(args.dtype)
  r = benchmark(w, args.steps)
  print(f"CPU: {cpu_isa()}")
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, dtype {args.dtype}")
  print(f"malloc={args.malloc}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
  print(f"workload: {w.name}, batch {w.batch} x {w.seq} tokens")
  print("| metric | value |\n|---|---|")
  print(f"| measured matmul peak | {peak / 1e9:.1f} GFLOP/s |")
  print(f"| compile time | {r['compile_s']:.2f} s |")
  print(f"| step time (median of {args.steps}) | {r['step_ms']:.1f} ms |")
  print(f"| tokens/s | {r['tokens_per_s']:,.0f} |")
  print(f"| model FLOP/s | {r['model_flops_per_s'] / 1e9:.1f} GFLOP/s |")
  print(f"| MFU (vs measured peak) | {100 * r['model_flops_per_s'] / peak:.1f}% |")


if __name__ == "__main__":
  main()
