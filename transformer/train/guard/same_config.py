"""The same config on every process of a multi-host run: each publishes its flattened
config and workdir in JAX's distributed key-value store and reads everyone's; a difference
is one line naming the field(s) and the values (`startup.maybe_initialize` ends every
process with it, before a collective could hang on mismatched shapes).
"""

from __future__ import annotations

import json
from typing import Any

from transformer.data.files import one_line

PER_HOST_FIELDS = ("compilation_cache_dir",)  # config fields that may differ by process


def flatten_config(config: Any, workdir: str | None = None) -> dict[str, str]:
  """'config.a.b' -> the value as JSON, plus '--workdir'; the fields compared across
  processes (`PER_HOST_FIELDS` left out)."""
  tree = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  flat: dict[str, str] = {}

  def walk(prefix: str, node: Any) -> None:
    if isinstance(node, dict):
      for key in sorted(node):
        walk(f"{prefix}.{key}", node[key])
    elif prefix[len("config.") :] not in PER_HOST_FIELDS:
      flat[prefix] = json.dumps(node, sort_keys=True, default=repr)

  walk("config", tree)
  if workdir is not None:
    from transformer.train.workdir import absolute

    flat["--workdir"] = json.dumps(absolute(workdir))
  return flat


def config_differences(configs: list[dict[str, str]]) -> list[str]:
  """'FIELD is A on process 0 and B on process K' for every field where a process differs
  from process 0."""
  out = []
  first = configs[0]
  for index, other in enumerate(configs[1:], start=1):
    for name in sorted(set(first) | set(other)):
      a, b = first.get(name, "(absent)"), other.get(name, "(absent)")
      if a != b:
        out.append(f"{name} is {a} on process 0 and {b} on process {index}")
  return out


def disagreement(
  client: Any, me: int, count: int, timeout: int, keys: str, config: Any, workdir: str | None
) -> str | None:
  """Publishes this process's config and workdir under `keys` in the key-value store of
  `client` and reads everyone's (waiting up to `timeout` seconds for each); the one-line
  problem when they differ or a process never published, else None."""
  client.key_value_set(f"{keys}/{me}", json.dumps(flatten_config(config, workdir)))
  configs = []
  for index in range(count):
    try:
      text = client.blocking_key_value_get(f"{keys}/{index}", timeout * 1000)
    except Exception as e:
      return (f"process {index} of {count} did not publish its config within {timeout}s "
              f"(config.distributed_timeout_s): {one_line(e)}")  # fmt: skip
    configs.append(json.loads(text))
  differences = config_differences(configs)
  if not differences:
    return None
  more = len(differences) - 5
  shown = "; ".join(differences[:5]) + (f"; and {more} more" if more > 0 else "")
  return (
    f"the {count} processes were started with different configs: {shown}; start every "
    "process with the same --config, overrides and --workdir"
  )
