"""The parameter overview printed when training starts (after CLU's `parameter_overview`).

One row per module (a parameter's path without its last name): the shapes of its
parameters, their count and bytes; then the totals. The total count equals
`transformer.nn.models.param_count` of the model's config (tests/test_console.py).

  | module                 | parameters                      |  count |   bytes |
  | decoder/layers_0/mlp/wi | kernel [128, 512], bias [512]  | 66,048 | 258.0 KiB |
  ...
  total: 801,728 parameters, 3.1 MiB in 31 modules
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from transformer.nn.tree import path_names


@dataclasses.dataclass(frozen=True)
class ModuleRow:
  """One module's parameters."""

  module: str  # path of the module, '/'-joined
  shapes: tuple[tuple[str, tuple[int, ...]], ...]  # (parameter name, shape), in tree order
  count: int  # parameters
  bytes: int  # bytes as stored


@dataclasses.dataclass(frozen=True)
class Overview:
  rows: tuple[ModuleRow, ...]
  total_count: int
  total_bytes: int

  def table(self) -> str:
    """The overview as a Markdown table and a totals line."""
    header = ("module", "parameters", "count", "bytes")
    body = [
      (
        r.module or "(root)",
        ", ".join(f"{n} {list(s)}" for n, s in r.shapes),
        f"{r.count:,}",
        _size(r.bytes),
      )
      for r in self.rows
    ]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(4)]

    def line(cells, right=(False, False, True, True)):
      cols = zip(cells, widths, right, strict=True)
      padded = [c.rjust(w) if r else c.ljust(w) for c, w, r in cols]
      return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    lines = [line(header, (False,) * 4), rule, *(line(row) for row in body)]
    lines.append(
      f"total: {self.total_count:,} parameters, {_size(self.total_bytes)} in "
      f"{len(self.rows)} modules"
    )
    return "\n".join(lines)


def parameter_overview(params: Any) -> Overview:
  """Rows per module of a parameter tree (arrays or `jax.ShapeDtypeStruct`s)."""
  rows: dict[str, list] = {}
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = path_names(keypath)
    module, name = "/".join(names[:-1]), names[-1]
    shape = tuple(int(d) for d in leaf.shape)
    count = int(np.prod(shape, dtype=np.int64))
    itemsize = np.dtype(leaf.dtype).itemsize
    entry = rows.setdefault(module, [[], 0, 0])
    entry[0].append((name, shape))
    entry[1] += count
    entry[2] += count * itemsize
  out = tuple(ModuleRow(m, tuple(s), c, b) for m, (s, c, b) in rows.items())
  return Overview(out, sum(r.count for r in out), sum(r.bytes for r in out))


def _size(n: int) -> str:
  for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
    if n >= factor:
      return f"{n / factor:.1f} {unit}"
  return f"{n} B"
