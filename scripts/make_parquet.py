"""data/shakespeare_speeches/: the shipped tiny shakespeare as a Parquet dataset of speeches.

  python scripts/make_parquet.py            # rewrites data/shakespeare_speeches/
  python scripts/make_parquet.py OUT_DIR    # writes it elsewhere

Each record is one speech (`text`: the speaker's line and what they say, the blocks that
blank lines separate in data/tinyshakespeare.txt.gz) with its `speaker` and its `index` in
the play text. The first 90% of the speeches go to `train-00000-of-00001.parquet`, the rest
to `validation-00000-of-00001.parquet`: the file names Hugging Face gives splits, which
`data.source='hf'` reads (configs/lm_shakespeare_parquet.py). The files are written with
fixed settings (zstd, row groups of 1,000 speeches, no creation time), so the same
input gives the same bytes.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "data" / "tinyshakespeare.txt.gz"
OUT = REPO / "data" / "shakespeare_speeches"
VALIDATION_FRACTION = 0.1


def speeches(text: str) -> list[str]:
  """The blank-line-separated blocks of `text`, each ending with one newline."""
  return [block.strip("\n") + "\n" for block in text.split("\n\n") if block.strip()]


def table(records: list[str], start: int) -> pa.Table:
  return pa.table(
    {
      "text": pa.array(records, pa.string()),
      "speaker": pa.array([r.split(":", 1)[0] for r in records], pa.string()),
      "index": pa.array(range(start, start + len(records)), pa.int64()),
    }
  )


def write(out: Path = OUT) -> dict[str, int]:
  """Writes the two split files into `out`; returns the number of speeches per split."""
  with gzip.open(SOURCE, "rt", encoding="utf-8") as f:
    records = speeches(f.read())
  cut = int(len(records) * (1 - VALIDATION_FRACTION))
  out.mkdir(parents=True, exist_ok=True)
  counts = {}
  for split, part, start in (("train", records[:cut], 0), ("validation", records[cut:], cut)):
    pq.write_table(
      table(part, start),
      out / f"{split}-00000-of-00001.parquet",
      compression="zstd",
      row_group_size=1000,
      write_statistics=False,
    )
    counts[split] = len(part)
  return counts


if __name__ == "__main__":
  print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
