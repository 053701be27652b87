"""Length extrapolation: sinusoidal vs learned vs RoPE vs ALiBi at twice the training context.

Each variant is the default run's character GPT (`configs/lm_shakespeare.py`: 4 layers,
d_model 128, context 64, 2,000 steps) with a different position encoding, trained on
windows of 64 characters and evaluated on validation windows of 64 and of 128. At 128
every window still starts from an empty context, so positions 0..63 see exactly what
training showed and positions 64..127 are new: absolute encodings (learned rows that were
never trained, sinusoidal phases never seen) have to generalise, relative ones (RoPE
rotates queries and keys, ALiBi biases by distance) see only distances, but distances
beyond 63 are new for them too. `max_len` is 128 for every variant, so the learned table
has 64 untouched rows (at their initial values) to look up.

  python -m transformer.research.extrapolation [--steps 2000] [--seed 0]

prints a Markdown table: validation loss at 64, at 128, and at 128 split into the first
and second half of the positions. Results: docs/RESEARCH.md.
"""

from __future__ import annotations

import dataclasses
import time

from transformer.nn.config import ModelConfig
from transformer.research import char_lm

POSITIONS = ("sinusoidal", "learned", "rope", "alibi")


@dataclasses.dataclass(frozen=True)
class Result:
  position: str
  seed: int
  loss_train_length: float  # windows of the training context
  loss_double: float  # windows of twice the training context, all positions
  loss_double_first: float  # ... positions 0 .. T-1 (seen in training)
  loss_double_second: float  # ... positions T .. 2T-1 (never seen)
  seconds: float


def model_config(position: str, vocab_size: int, context: int) -> ModelConfig:
  """The default run's GPT with `position`; max_len twice the training context."""
  return char_lm.gpt_config(vocab_size, max_len=2 * context, position=position)


def run(
  positions: list[str],
  seed: int = 0,
  steps: int = 2000,
  context: int = 64,
  eval_chars: int = 0,
  corpus: char_lm.Corpus | None = None,
) -> list[Result]:
  """Trains one model per position encoding and evaluates it at 1x and 2x context; prints
  each result as it comes."""
  corpus = corpus or char_lm.load_corpus()
  validation = corpus.validation_head(eval_chars)

  def measure(position: str, seed: int) -> Result:
    start = time.perf_counter()
    config = model_config(position, corpus.vocab_size, context)
    settings = char_lm.RunConfig(steps=steps, seq_len=context, seed=seed)
    params, _ = char_lm.train(config, settings, corpus)
    at_train = char_lm.evaluate(config, params, validation, context)  # [T]
    at_double = char_lm.evaluate(config, params, validation, 2 * context)  # [2T]
    return Result(
      position, seed, float(at_train.mean()), float(at_double.mean()),
      float(at_double[:context].mean()), float(at_double[context:].mean()),
      time.perf_counter() - start,
    )  # fmt: skip

  return char_lm.sweep(positions, POSITIONS, "position", [seed], measure)


def to_markdown(results: list[Result], context: int) -> str:
  lines = [
    f"| positions | loss at {context} | loss at {2 * context} | positions 0-{context - 1}"
    f" | positions {context}-{2 * context - 1} |",
    "| --- | --- | --- | --- | --- |",
  ]
  for r in results:
    lines.append(
      f"| {r.position} | {r.loss_train_length:.3f} | {r.loss_double:.3f}"
      f" | {r.loss_double_first:.3f} | {r.loss_double_second:.3f} |"
    )
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
  parser = char_lm.command_line(__doc__, steps=2000)
  parser.add_argument("--context", type=int, default=64, help="training context length")
  parser.add_argument("--seed", type=int, default=0, help="parameters and batches")
  parser.add_argument("--positions", nargs="+", default=list(POSITIONS), choices=POSITIONS)
  args = parser.parse_args(argv)
  print(
    f"extrapolation: {args.steps} steps of 12 x {args.context}, seed {args.seed}, evaluated"
    f" at {args.context} and {2 * args.context}",
    flush=True,
  )
  results = run(args.positions, args.seed, args.steps, args.context, args.eval_chars)
  print(to_markdown(results, args.context))
  return results


if __name__ == "__main__":
  main()
