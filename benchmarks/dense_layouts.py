"""The three GEMMs of one dense layer (forward, input gradient, weight gradient), timed alone
with token-major activations (ours: x [M, K]) and with feature-major ones (x^T [K, M]).

  python benchmarks/dense_layouts.py                  # the reference GPT's dense shapes
  python benchmarks/dense_layouts.py --m 3200 --shapes 192x768 768x192 192x192

Token-major, as the models run now: y = x w, dx = g w^T, dw = x^T g; the last contracts
over the rows of both operands, which XLA:CPU runs in Eigen well below its other GEMMs
(`benchmarks/matmul_ceiling.py`). Feature-major: y^T = w^T x^T (w^T materialised, a small
copy of the weight), dx^T = w g^T, dw = x^T (g^T)^T, so no GEMM contracts over leading
dimensions. Prints milliseconds per GEMM and the sum for each layout (medians).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import train_step as ts
from jax import lax

from transformer.train.machine import cpu_isa


def _median_ms(f, *args, repeats: int) -> float:
  f = jax.jit(f)
  f(*args).block_until_ready()
  return 1e3 * ts.median_seconds(lambda: f(*args).block_until_ready(), repeats)


def dense_gemms(m: int, k: int, n: int, repeats: int) -> dict[str, list[float]]:
  """ms of [forward, input gradient, weight gradient] in each layout."""
  rng = np.random.default_rng(0)

  def arr(*shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)

  x, w, g = arr(m, k), arr(k, n), arr(m, n)
  xt, gt = arr(k, m), arr(n, m)
  rows_of_both = (((0,), (0,)), ((), ()))
  last_of_both = (((1,), (1,)), ((), ()))
  return {
    "token-major": [
      _median_ms(lambda x, w: x @ w, x, w, repeats=repeats),
      _median_ms(lambda g, w: g @ w.T, g, w, repeats=repeats),
      _median_ms(lambda x, g: lax.dot_general(x, g, rows_of_both), x, g, repeats=repeats),
    ],
    "feature-major": [
      # The barrier keeps w^T a copy (else XLA folds it into the dot, contracting rows).
      _median_ms(lambda w, xt: lax.optimization_barrier(w.T) @ xt, w, xt, repeats=repeats),
      _median_ms(lambda w, gt: w @ gt, w, gt, repeats=repeats),
      _median_ms(lambda xt, gt: lax.dot_general(xt, gt, last_of_both), xt, gt, repeats=repeats),
    ],
  }


def main():
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--m", type=int, default=4096, help="tokens per step (batch x sequence)")
  parser.add_argument(
    "--shapes", nargs="+", default=["256x1024", "1024x256", "256x256"], help="KxN weights"
  )
  parser.add_argument("--repeats", type=int, default=30)
  parser.add_argument("--malloc", default="heap", choices=["heap", "default"])
  parser.add_argument("--xla_flags", default="--xla_cpu_prefer_vector_width=512")
  args = parser.parse_args()
  ts.set_malloc_policy(args.malloc)
  ts.add_xla_flags(args.xla_flags)
  print(f"CPU: {cpu_isa()}")
  print(f"M = {args.m} tokens; ms per GEMM (median of {args.repeats})")
  print("| weight K x N | layout | forward | input grad | weight grad | sum |")
  print("|---|---|---|---|---|---|")
  for shape in args.shapes:
    k, n = (int(v) for v in shape.split("x"))
    for layout, ms in dense_gemms(args.m, k, n, args.repeats).items():
      cells = " | ".join(f"{t:.2f}" for t in ms)
      print(f"| {k} x {n} | {layout} | {cells} | {sum(ms):.2f} |")


if __name__ == "__main__":
  main()
