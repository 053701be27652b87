"""Pre-LN vs post-LN at depth, without learning-rate warmup (Xiong et al. 2020).

Post-LN (Vaswani et al. 2017) normalises after each residual addition; at initialisation
the gradients of the last layers' parameters are large, and with Adam at a full learning
rate from step 0 the deep post-LN model falls into a bad region early and stays there.
Pre-LN (normalise the branch input, final norm at the end) trains without warmup. A third
variant, post-LN with warmup, checks that warmup is what post-LN was missing.

  python -m transformer.research.ln_depth [--depth 12] [--seeds 0 1 2] [--steps 1000]

trains each variant for each seed on tiny shakespeare (character GPT, `char_lm`) and
prints a Markdown table: final training loss (mean of the last 10% of steps), validation
loss on the first `--eval_chars` validation characters, and the unigram loss (a model
that learned only character frequencies) for scale. Results: docs/RESEARCH.md.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from transformer.nn.config import ModelConfig
from transformer.research import char_lm

# name -> (norm_position, warmup_steps or None for the run's --warmup)
VARIANTS = {
  "pre-LN": ("pre", 0),
  "post-LN": ("post", 0),
  "post-LN + warmup": ("post", None),
}


@dataclasses.dataclass(frozen=True)
class Result:
  variant: str
  seed: int
  train_loss: float  # mean over the last 10% of steps (NaN when the run diverged)
  validation_loss: float
  seconds: float


def model_config(norm_position: str, depth: int, d_model: int, vocab_size: int) -> ModelConfig:
  """The default run's GPT (`configs/lm_shakespeare.py`) at `depth` and `d_model`."""
  return char_lm.gpt_config(vocab_size, d_model, num_layers=depth, norm_position=norm_position)


def unigram_loss(corpus: char_lm.Corpus, ids: np.ndarray) -> float:
  """Cross-entropy (nats) of `ids` under the training text's character frequencies."""
  counts = np.bincount(corpus.train, minlength=corpus.vocab_size).astype(np.float64) + 1.0
  log_p = np.log(counts / counts.sum())
  return float(-log_p[ids].mean())


def run(
  variants: list[str],
  seeds: list[int],
  depth: int = 12,
  d_model: int = 128,
  steps: int = 1000,
  warmup: int = 200,
  eval_chars: int = 0,
  corpus: char_lm.Corpus | None = None,
  learning_rate: float = 1e-3,
) -> list[Result]:
  """Trains every (variant, seed) pair, printing each result as it comes; `eval_chars` 0 =
  the whole validation split."""
  corpus = corpus or char_lm.load_corpus()
  validation = corpus.validation_head(eval_chars)

  def measure(variant: str, seed: int) -> Result:
    start = time.perf_counter()
    norm, variant_warmup = VARIANTS[variant]
    config = model_config(norm, depth, d_model, corpus.vocab_size)
    settings = char_lm.RunConfig(
      steps=steps,
      warmup_steps=warmup if variant_warmup is None else variant_warmup,
      learning_rate=learning_rate,
      seed=seed,
    )
    params, step_losses = char_lm.train(config, settings, corpus)
    tail = step_losses[-max(1, steps // 10) :]
    train_loss = float(tail.mean()) if np.all(np.isfinite(tail)) else float("nan")
    validation_loss = float(char_lm.evaluate(config, params, validation, config.max_len).mean())
    return Result(variant, seed, train_loss, validation_loss, time.perf_counter() - start)

  return char_lm.sweep(variants, list(VARIANTS), "variant", seeds, measure)


def to_markdown(results: list[Result], unigram: float) -> str:
  """One row per variant: per-seed validation losses, their mean, and the train loss."""
  lines = [
    "| variant | validation loss per seed | mean | final train loss, mean |",
    "| --- | --- | --- | --- |",
  ]
  for variant in dict.fromkeys(r.variant for r in results):
    rows = [r for r in results if r.variant == variant]
    per_seed = ", ".join(f"{r.validation_loss:.3f}" for r in rows)
    mean_val = np.mean([r.validation_loss for r in rows])
    mean_train = np.mean([r.train_loss for r in rows])
    lines.append(f"| {variant} | {per_seed} | {mean_val:.3f} | {mean_train:.3f} |")
  lines.append(f"| unigram (character frequencies only) | | {unigram:.3f} | |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
  parser = char_lm.command_line(__doc__, steps=1000)
  parser.add_argument("--depth", type=int, default=12, help="layers")
  parser.add_argument("--d_model", type=int, default=128, help="width (d_ff = 4 * d_model)")
  parser.add_argument("--warmup", type=int, default=200, help="warmup of 'post-LN + warmup'")
  parser.add_argument("--learning_rate", type=float, default=1e-3, help="peak, cosine decay")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
  args = parser.parse_args(argv)
  corpus = char_lm.load_corpus()
  print(
    f"ln_depth: {args.depth} layers, d_model {args.d_model}, {args.steps} steps of 12 x 64,"
    f" lr {args.learning_rate:g} cosine, seeds {args.seeds}",
    flush=True,
  )
  results = run(
    args.variants, args.seeds, args.depth, args.d_model, args.steps, args.warmup,
    args.eval_chars, corpus, learning_rate=args.learning_rate,
  )  # fmt: skip
  validation = corpus.validation_head(args.eval_chars)
  print(to_markdown(results, unigram_loss(corpus, validation[1:])))
  return results


if __name__ == "__main__":
  main()
