"""Attention analysis: per layer and head, how peaked and how far each head looks.

Letters: B batch, L layers, N heads, T query length, S key length.

For attention weights w [B, N, T, S] (rows sum to 1) and the valid queries of a batch,
each head gets three numbers, averaged over the valid (b, t):

  entropy     H_t = -sum_s w_ts log w_ts, in nats. 0 = all weight on one key; the
              uniform row over k keys has log k (a causal row t sees t + 1 keys).
  max_weight  max_s w_ts: 1 = one key, 1/k = uniform over k keys.
  distance    sum_s w_ts |t - s|: the expected distance, in key indices (positions of the
              flattened sequence: packed rows are not restarted; for ViT, patch indices
              in raster order with [CLS] at 0; for cross-attention, target index minus
              source index, so a monotone alignment near the diagonal gives a small value).

The weights come from the model itself: `record_attention` runs `model.apply` with a
flax method interceptor that calls every `MultiHeadAttention` with `return_weights=True`,
so each one sows its float32 weights into the 'intermediates' collection. The models'
code path is untouched (nothing is computed unless asked); weights are always computed by
the 'xla' implementation, whatever `config.attention_impl` says (see
`kernels.dot_product_attention`). Works for every family, scanned or unrolled layers,
self- and cross-attention.

`analyze(workdir)` does all this for a trained run (`python eval.py --workdir DIR --analyze`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from transformer.data.files import is_remote, write_atomic
from transformer.nn.attention import MultiHeadAttention

STAT_KEYS = ("entropy", "max_weight", "distance")
_LAYER = re.compile(r"layer_(\d+)")

# name of an attention module -> (query mask [B, T], key mask [B, S]); None = all valid.
MaskFn = Callable[[str], tuple[np.ndarray | None, np.ndarray | None]]


# ----------------------------------------------------------------------------------------
# Statistics.


def _rows(weights: np.ndarray) -> np.ndarray:
  weights = np.asarray(weights, np.float64)
  if weights.ndim != 4:
    raise ValueError(f"attention weights must be [B, N, T, S]; got shape {weights.shape}")
  return weights


def _mean_over_queries(per_query: np.ndarray, query_mask: np.ndarray | None) -> np.ndarray:
  """per_query [B, N, T] -> [N], the mean over valid (b, t)."""
  b, _, t = per_query.shape
  mask = np.ones((b, t), bool) if query_mask is None else np.asarray(query_mask, bool)
  if mask.shape != (b, t):
    raise ValueError(f"query_mask must be [B, T] = {(b, t)}; got {mask.shape}")
  count = mask.sum()
  if count == 0:
    raise ValueError("query_mask selects no query")
  return (per_query * mask[:, None, :]).sum(axis=(0, 2)) / count  # [N]


def entropy(weights: np.ndarray, query_mask: np.ndarray | None = None) -> np.ndarray:
  """Mean entropy in nats of each head's rows: weights [B, N, T, S] -> [N] (0 log 0 = 0)."""
  w = _rows(weights)
  logs = np.log(np.where(w > 0, w, 1.0))  # [B, N, T, S]
  return _mean_over_queries(-(w * logs).sum(-1), query_mask)


def max_weight(weights: np.ndarray, query_mask: np.ndarray | None = None) -> np.ndarray:
  """Mean largest weight of each head's rows: weights [B, N, T, S] -> [N]."""
  return _mean_over_queries(_rows(weights).max(-1), query_mask)


def mean_distance(
  weights: np.ndarray, query_mask: np.ndarray | None = None, q_offset: int = 0
) -> np.ndarray:
  """Mean of sum_s w_ts |q_offset + t - s| over valid queries: [B, N, T, S] -> [N]."""
  w = _rows(weights)
  t, s = w.shape[2:]
  dist = np.abs(q_offset + np.arange(t)[:, None] - np.arange(s)[None, :])  # [T, S]
  return _mean_over_queries((w * dist).sum(-1), query_mask)


def head_statistics(
  weights: np.ndarray, query_mask: np.ndarray | None = None
) -> dict[str, np.ndarray]:
  """{'entropy', 'max_weight', 'distance'} -> [N] each, for weights [B, N, T, S]."""
  return {
    "entropy": entropy(weights, query_mask),
    "max_weight": max_weight(weights, query_mask),
    "distance": mean_distance(weights, query_mask),
  }


# ----------------------------------------------------------------------------------------
# Recording the weights.


def _ask_for_weights(next_fun, args, kwargs, context):
  if isinstance(context.module, MultiHeadAttention) and context.method_name == "__call__":
    kwargs = {**kwargs, "return_weights": True}
  return next_fun(*args, **kwargs)


def record_attention(
  model: nn.Module, variables: Mapping[str, Any], *args: Any, **kwargs: Any
) -> tuple[Any, dict[str, np.ndarray]]:
  """`model.apply(variables, *args, **kwargs)` and every attention module's weights.

  Returns (the model's output, {name: float32 weights [B, N, T, S]}) with names such as
  'decoder/layer_0/self_attention', encoder before decoder, by layer number, self- before
  cross-attention (scanned layers are unstacked into the same names as unrolled ones).
  """
  variables = {k: v for k, v in variables.items() if k != "intermediates"}
  with nn.intercept_methods(_ask_for_weights):
    out, state = model.apply(variables, *args, mutable=["intermediates"], **kwargs)
  return out, attention_maps(model, state)


def attention_maps(model: nn.Module, state: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """The attention weights a call of `model` sowed into `state['intermediates']` (under
  `nn.intercept_methods(_ask_for_weights)`), named and ordered as `record_attention` says."""
  flat = traverse_util.flatten_dict(jax.device_get(state.get("intermediates", {})))
  maps: dict[str, np.ndarray] = {}
  for path, value in flat.items():
    if path[-1] != "attention_weights":
      continue
    value = np.asarray(value[0] if isinstance(value, tuple) else value, np.float32)
    path = path[:-1]
    scanned = [i for i in range(len(path) - 1) if path[i : i + 2] == ("layers", "block")]
    if not scanned:
      maps["/".join(path)] = value  # [B, N, T, S]
      continue
    i = scanned[0]
    for layer in range(value.shape[0]):  # [L, B, N, T, S]
      name = (*path[:i], f"layer_{layer}", *path[i + 2 :])
      maps["/".join(name)] = value[layer]
  if not maps:
    raise ValueError(f"{type(model).__name__} recorded no attention weights")
  return {name: maps[name] for name in sorted(maps, key=_module_order)}


def _module_order(name: str) -> tuple[int, int, int, str]:
  """Encoder before decoder, layers by number (layer_2 before layer_10), self before cross."""
  layer = _LAYER.search(name)
  return (
    0 if name.startswith("encoder") else 1,
    int(layer.group(1)) if layer else -1,
    int(name.endswith("cross_attention")),
    name,
  )


# ----------------------------------------------------------------------------------------
# Tables.


def statistics_table(maps: Mapping[str, np.ndarray], masks: MaskFn | None = None) -> list[dict]:
  """One row per (attention module, head): name, layer, head and the three statistics."""
  rows = []
  for name, weights in maps.items():
    query_mask = masks(name)[0] if masks is not None else None
    stats = head_statistics(weights, query_mask)
    layer = _LAYER.search(name)
    for head in range(weights.shape[1]):
      row: dict[str, Any] = {
        "attention": name,
        "layer": int(layer.group(1)) if layer else -1,
        "head": head,
      }
      row.update({key: float(stats[key][head]) for key in STAT_KEYS})
      rows.append(row)
  return rows


def to_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
  """The table as GitHub Markdown (floats with 4 significant digits)."""
  if not rows:
    return ""
  keys = list(rows[0])
  lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
  for row in rows:
    cells = [f"{row[k]:.4g}" if isinstance(row[k], float) else str(row[k]) for k in keys]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def write_heatmaps(
  maps: Mapping[str, np.ndarray],
  out_dir: str,
  masks: MaskFn | None = None,
  *,
  example: int = 0,
  max_len: int = 64,
  labels: Callable[[str], tuple[list[str] | None, list[str] | None]] | None = None,
) -> list[str]:
  """One PNG per attention module: every head of batch row `example`, cut to its valid
  queries and keys (leading `max_len` of each). `labels(name)` -> (query, key) token labels.
  """
  from transformer.research import plots

  if not is_remote(out_dir):  # object storage has no folders to create
    os.makedirs(out_dir, exist_ok=True)
  paths = []
  for name, weights in maps.items():
    q_mask, k_mask = masks(name) if masks is not None else (None, None)
    w = weights[example]  # [N, T, S]
    q_idx = np.arange(w.shape[1]) if q_mask is None else np.flatnonzero(q_mask[example])
    k_idx = np.arange(w.shape[2]) if k_mask is None else np.flatnonzero(k_mask[example])
    q_idx, k_idx = q_idx[:max_len], k_idx[:max_len]
    q_labels, k_labels = labels(name) if labels is not None else (None, None)
    path = os.path.join(out_dir, name.replace("/", ".") + ".png")
    plots.attention_heatmaps(
      w[:, q_idx][:, :, k_idx],  # [N, t, s]
      path,
      title=name,
      query_labels=None if q_labels is None else [q_labels[i] for i in q_idx],
      key_labels=None if k_labels is None else [k_labels[i] for i in k_idx],
    )
    paths.append(path)
  return paths


# ----------------------------------------------------------------------------------------
# A trained run.


def analyze(
  workdir: str, step: int | None = None, text: str | None = None, examples: int = 8
) -> dict[str, Any]:
  """Attention statistics and heatmaps of a trained run, written into the workdir.

  Input: `text` (LM / MLM / classification runs), else the first `examples` rows of the
  first evaluation batch. Writes DIR/attention_step_<N>.json and .md (one row per layer
  and head) and DIR/attention_step_<N>/<module>.png (heatmaps of the first row).
  Returns {'step', 'rows', 'markdown', 'json', 'heatmaps'}.
  """
  from transformer.eval.evaluate import restore  # the training stack: only needed here
  from transformer.train.workdir import absolute

  workdir = absolute(workdir)
  setup, state, step = restore(workdir, step)
  task = setup.exp.task
  tokenizer = getattr(setup.info, "tokenizer", None)
  if text is not None:
    batch = task.text_batch(tokenizer, text, setup.model_cfg.max_len)
  else:
    batch = next(iter(setup.eval_factory()), None)
    if batch is None:
      raise ValueError("the evaluation split produced no batches")
    batch = {k: np.asarray(v)[:examples] for k, v in batch.items()}
  # The task's forward pass, the model's attention weights sown into 'intermediates'.
  run = nn.apply(
    lambda bound, b: task.forward(bound, b, True), setup.model, mutable=["intermediates"]
  )
  with nn.intercept_methods(_ask_for_weights):
    _, sown = run({"params": state.params}, batch)
  maps = attention_maps(setup.model, sown)
  masks = task.attention_masks(batch)
  rows = statistics_table(maps, masks)
  markdown = to_markdown(rows)

  labels = task.attention_labels(batch, tokenizer) if tokenizer is not None else None
  stem = os.path.join(workdir, f"attention_step_{step}")
  heatmaps = write_heatmaps(maps, stem, masks, labels=labels)
  source = "text" if text is not None else f"eval batch ({len(batch[next(iter(batch))])} rows)"
  write_atomic(stem + ".json", json.dumps({"step": step, "input": source, "rows": rows}, indent=2))
  write_atomic(stem + ".md", f"# Attention at step {step} ({source})\n\n{markdown}\n")
  return {
    "step": step,
    "rows": rows,
    "markdown": markdown,
    "json": stem + ".json",
    "heatmaps": heatmaps,
  }
