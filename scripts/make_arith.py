"""data/arith/: sums and products of 1-3 digit numbers as chat conversations.

  python scripts/make_arith.py            # rewrites data/arith/
  python scripts/make_arith.py OUT_DIR    # writes it elsewhere

Each record is one conversation (`messages`): the user asks 'a+b=' or 'a*b=' and the
assistant answers with the result, e.g. [{'role': 'user', 'content': '12*305='},
{'role': 'assistant', 'content': '3660'}]. Each operand has 1, 2 or 3 digits (the digit
count drawn uniformly, then the number within it), the operation is drawn uniformly. The
`test` split's prompts are never in the `train` split: both are drawn without replacement
from one pool of distinct problems. The files are Parquet with fixed settings (zstd, no
statistics), named as Hugging Face names splits, so `data.source='hf'` reads them
(configs/sft_arith.py); the same seed gives the same bytes.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "data" / "arith"
SPLITS = {"train": 20_000, "test": 1_000}  # conversations per split
SEED = 0
OPS = {"+": lambda a, b: a + b, "*": lambda a, b: a * b}


def _operand(rng: random.Random) -> int:
  digits = rng.randint(1, 3)
  return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def problems(count: int, seed: int = SEED) -> list[tuple[int, str, int]]:
  """`count` distinct (a, op, b), in the order drawn."""
  rng, seen, out = random.Random(seed), set(), []
  while len(out) < count:
    problem = (_operand(rng), rng.choice(sorted(OPS)), _operand(rng))
    if problem not in seen:
      seen.add(problem)
      out.append(problem)
  return out


def conversation(a: int, op: str, b: int) -> list[dict[str, str]]:
  return [
    {"role": "user", "content": f"{a}{op}{b}="},
    {"role": "assistant", "content": str(OPS[op](a, b))},
  ]


def write(out: Path = OUT, splits: dict[str, int] = SPLITS, seed: int = SEED) -> dict[str, int]:
  """Writes one Parquet file per split into `out` (test drawn first); returns the counts."""
  drawn = problems(sum(splits.values()), seed)
  out.mkdir(parents=True, exist_ok=True)
  order = sorted(splits, key=lambda s: s != "test")  # the held-out split first
  start, counts = 0, {}
  message = pa.struct([("role", pa.string()), ("content", pa.string())])
  for split in order:
    part = drawn[start : start + splits[split]]
    start += splits[split]
    column = pa.array([conversation(*p) for p in part], pa.list_(message))
    pq.write_table(pa.table({"messages": column}), out / f"{split}-00000-of-00001.parquet",
                   compression="zstd", write_statistics=False)  # fmt: skip
    counts[split] = len(part)
  return counts


if __name__ == "__main__":
  target = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
  for split, n in write(target).items():
    print(f"{target}/{split}-00000-of-00001.parquet: {n} conversations")
