"""Names of pytree leaves: a JAX key path as a tuple of names or a '/'-joined string.

Dict keys, dataclass attributes and sequence indices all become plain strings, so the
parameter `params['encoder']['layers_0']['attention']['query']['kernel']` is named
`"encoder/layers_0/attention/query/kernel"` (the form partitioning rules match on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_NAME_ATTRS = ("key", "name", "idx")  # DictKey, GetAttrKey, SequenceKey / FlattenedIndexKey


def path_names(keypath: Sequence[Any], strict: bool = False) -> tuple[str, ...]:
  """The name of every entry of a JAX key path, root first.

  An entry without a key, name or index becomes `str(entry)`, or raises `ValueError`
  when `strict`.
  """
  names = []
  for entry in keypath:
    for attr in _NAME_ATTRS:
      if hasattr(entry, attr):
        names.append(str(getattr(entry, attr)))
        break
    else:
      if strict:
        raise ValueError(f"unsupported pytree key {entry!r}")
      names.append(str(entry))
  return tuple(names)


def path_str(keypath: Sequence[Any], strict: bool = False) -> str:
  """The '/'-joined names of a JAX key path: `"encoder/layers_0/attention/query/kernel"`."""
  return "/".join(path_names(keypath, strict))
