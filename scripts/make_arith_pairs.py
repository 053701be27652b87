"""Preference pairs for configs/dpo_arith.py: an SFT run's own wrong answers to the
arithmetic prompts of data/arith, rejected against the right ones.

  python scripts/make_arith_pairs.py runs/sft_arith             # runs/sft_arith/pairs/
  python scripts/make_arith_pairs.py runs/sft_arith OUT --seed 1

The SFT run (configs/sft_arith.py) answers each of the first `--prompts` training prompts
`--samples` times, sampling at temperature 1 (`--seed` seeds the draws). A prompt gives
one pair: its reference answer chosen, the first sampled answer that differs rejected; a
prompt answered right every time gives none. The test split holds every held-out prompt
(data/arith's test conversations, never trained on) with its reference chosen and a wrong
answer rejected: a sampled one, else the reference with its last digit changed. Only the
evaluation loss reads those rejected answers; the `exact_match` evaluator scores the
greedy answers against the chosen ones. Written as JSONL (train.jsonl, test.jsonl) with
TRL's conversational columns: `prompt` (the user turn), `chosen` and `rejected` (one
assistant turn each).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import pyarrow.parquet as pq

from transformer.decode.sampling import Sampling
from transformer.eval.evaluate import restore
from transformer.evaluators.exact_match import greedy_answers
from transformer.tasks import sft

REPO = Path(__file__).resolve().parents[1]
ARITH = REPO / "data" / "arith"


def conversations(split: str) -> list[list[dict]]:
  """data/arith's conversations of `split` ('train', 'test')."""
  (path,) = sorted(ARITH.glob(f"{split}-*.parquet"))
  return pq.read_table(path).column("messages").to_pylist()


def sampled(s, params, prompts: list[list], samples: int, seed: int) -> list[list[str]]:
  """`samples` answers per prompt, drawn at temperature 1."""
  tok, out = s.info.tokenizer, [[] for _ in prompts]
  for i in range(samples):
    key = jax.random.fold_in(jax.random.PRNGKey(seed), i)
    answers = greedy_answers(s.model, params, tok, prompts, 16, Sampling(rng=key))
    for row, answer in zip(out, answers, strict=True):
      row.append(answer)
  return out


def wrong(answer: str) -> str:
  """A wrong answer: the last digit changed."""
  return answer[:-1] + str((int(answer[-1]) + 1) % 10)


def pair(prompt: list, chosen: str, rejected: str) -> dict:
  turn = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731
  return {"prompt": prompt, "chosen": turn(chosen), "rejected": turn(rejected)}


def write(workdir: str, out: Path, prompts: int, samples: int, seed: int) -> dict[str, int]:
  s, state, _ = restore(workdir)
  counts = {}
  for split, limit in (("train", prompts), ("test", 0)):
    cut = [sft.split_reply(c) for c in conversations(split)]
    cut = cut[:limit] if limit else cut
    drawn = sampled(s, state.params, [p for p, _ in cut], samples, seed)
    rows = []
    for (prompt, answer), answers in zip(cut, drawn, strict=True):
      bad = next((a for a in answers if a != answer), None)
      if bad is not None or split == "test":
        rows.append(pair(prompt, answer, bad if bad is not None else wrong(answer)))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts[split] = len(rows)
  return counts


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdir", help="the SFT run (configs/sft_arith.py)")
  parser.add_argument("out", nargs="?", help="the folder to write (default WORKDIR/pairs)")
  parser.add_argument("--prompts", type=int, default=20_000, help="training prompts asked")
  parser.add_argument("--samples", type=int, default=4, help="answers sampled per prompt")
  parser.add_argument("--seed", type=int, default=0, help="seed of the sampled answers")
  args = parser.parse_args()
  target = Path(args.out) if args.out else Path(args.workdir) / "pairs"
  for split, n in write(args.workdir, target, args.prompts, args.samples, args.seed).items():
    print(f"{target}/{split}.jsonl: {n} pairs")
