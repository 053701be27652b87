"""data/shakespeare_continuation/: a multiple-choice continuation task on held-out Shakespeare.

  python scripts/make_continuation.py            # rewrites data/shakespeare_continuation/
  python scripts/make_continuation.py OUT_DIR

The text is the last 10% of data/tinyshakespeare.txt.gz, the validation text of the
character-level recipes (configs/lm_shakespeare.py), which they never train on. Every
`SPACING` characters a question cuts it: `context` is the `CONTEXT` characters before the
cut, and the `choices` are the `CHOICE` characters after it and three spans of the same
length from random places elsewhere in the held-out text, in random order; `label` is the
index of the true one. A model that reads the context (a word to finish, a line to go on
with) picks the true span; one that scores spans alone is at chance, 25%. Context and
choice fit a 64-character window. The first 50 questions are `validation.jsonl` (few-shot
examples), the others `test.jsonl`. A fixed seed makes the files the same on every run. The
harness task that reads them is `shakespeare_continuation`
(transformer/evaluators/harness_lm.py).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "data" / "tinyshakespeare.txt.gz"
OUT = REPO / "data" / "shakespeare_continuation"
HELD_OUT = 0.1  # the validation share of configs/lm_shakespeare.py (nanoGPT's split)
CONTEXT, CHOICE, SPACING = 40, 16, 200  # characters
FEW_SHOT = 50  # questions in validation.jsonl; test.jsonl has the rest


def questions(text: str, seed: int = 0) -> list[dict]:
  rng = np.random.default_rng(seed)
  out = []
  for cut in range(CONTEXT, len(text) - CHOICE, SPACING):
    true = text[cut : cut + CHOICE]
    others: list[str] = []
    while len(others) < 3:
      start = int(rng.integers(0, len(text) - CHOICE))
      if abs(start - cut) >= CHOICE and text[start : start + CHOICE] not in (true, *others):
        others.append(text[start : start + CHOICE])
    order = rng.permutation(4)
    choices = [true, *others]
    out.append({
      "context": text[cut - CONTEXT : cut],
      "choices": [choices[k] for k in order],
      "label": int(np.flatnonzero(order == 0)[0]),
    })  # fmt: skip
  return out


def write(out: Path = OUT) -> dict[str, int]:
  with gzip.open(SOURCE, "rt", encoding="utf-8") as f:
    text = f.read()
  made = questions(text[int(len(text) * (1 - HELD_OUT)) :])
  out.mkdir(parents=True, exist_ok=True)
  splits = {"validation": made[:FEW_SHOT], "test": made[FEW_SHOT:]}
  for split, part in splits.items():
    with open(out / f"{split}.jsonl", "w", encoding="utf-8") as f:
      f.writelines(json.dumps(q, ensure_ascii=False) + "\n" for q in part)
  return {split: len(part) for split, part in splits.items()}


if __name__ == "__main__":
  print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
