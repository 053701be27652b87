"""Config blocks (ConfigDict) -> typed frozen dataclasses, with the field named on any
error: `convert(cls, values, prefix)` checks every value against its annotation (int,
float, str, bool, tuple and their `| None`), then lets the dataclass's own rules run.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from transformer.data.config import fail


def field_type(hint: Any) -> tuple[type, bool] | None:
  """(type, optional) for hints int / float / str / bool / tuple[...] and their `| None`."""
  args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
  optional = type(None) in args
  rest = [a for a in args if a is not type(None)]
  if len(rest) != 1:
    return None
  base = typing.get_origin(rest[0]) or rest[0]
  return (base, optional) if base in (int, float, str, bool, tuple) else None


def check_type(field: str, value: Any, expected: type, optional: bool = False) -> None:
  """`value` is an `expected` (int for float too, never bool for a number; None if optional)."""
  if value is None and optional:
    return
  if expected is float and isinstance(value, int) and not isinstance(value, bool):
    return
  if expected is tuple and isinstance(value, list):
    return
  if not isinstance(value, expected) or (expected in (int, float) and isinstance(value, bool)):
    fail(field, value, f"must be {expected.__name__}{' or None' if optional else ''}")
  if expected is float and math.isnan(value):
    fail(field, value, "must be a number, not NaN")


def convert(cls, values: Mapping[str, Any], prefix: str = "") -> Any:
  """`cls(**values)` with every field type-checked against its annotation.

  Unknown fields and wrong types raise `ValueError` naming `config.<prefix><field>`; the
  dataclass's own rules (its `__post_init__`) name the field too.
  """
  hints = typing.get_type_hints(cls)
  names = [f.name for f in dataclasses.fields(cls)]
  for name, value in values.items():
    if name not in names:
      fail(f"{prefix}{name}", value, f"unknown field; known: {', '.join(sorted(names))}")
    expected = field_type(hints[name])
    if expected is not None:
      check_type(f"{prefix}{name}", value, *expected)
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
  try:
    return cls(**fields)
  except (TypeError, ValueError) as e:
    message = str(e)
    if message.startswith("config."):
      raise ValueError(message) from None
    raise ValueError(f"config.{prefix.rstrip('.')}: {message}") from None


def as_dict(block: Any) -> dict[str, Any]:
  """A config block (ConfigDict or mapping) as a plain dict."""
  return block.to_dict() if hasattr(block, "to_dict") else dict(block)
