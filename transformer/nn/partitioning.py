"""Logical axis names for every parameter, and rules mapping them onto a device mesh.

The mesh has five named axes (sizes from config.mesh):

  data    pure data parallelism: the batch is split, parameters are replicated
  fsdp    the batch is split AND parameters / optimizer state are sharded over 'embed'
          (ZeRO-3 / FSDP: XLA all-gathers weights where they are used)
  tensor  Megatron-style tensor parallelism over heads, the FFN hidden dim and the vocab
  expert  expert parallelism: mixture-of-experts weights are split by expert, and the
          batch is split too (outside the experts it is one more data axis)
  context context parallelism: activations are split along the sequence ('length');
          self- and cross-attention exchange keys and values (`nn/context.py`)

Each parameter gets logical axis names from its path (`LOGICAL_AXES`, first match wins;
a parameter no pattern matches is an error, so a new layer cannot silently go
unsharded). `RULES` maps logical names to mesh axes; config.mesh_rules overrides them. A
dimension whose size the mesh axis does not divide is replicated instead. Parameters
stacked by nn.scan carry a leading 'layers' axis (replicated).
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from transformer.nn.tree import path_str

MESH_AXES = ("data", "fsdp", "tensor", "expert", "context")

# (pattern on the '/'-joined parameter path, logical axes of the parameter's dimensions).
LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
  (r"moe/router/kernel$", ("embed", None)),  # mixture of experts (nn/moe.py), [D, E]
  (r"moe/shared_gate/kernel$", ("embed", None)),  # the shared expert's gate [D, 1]
  (r"moe/router/bias$", (None,)),  # DeepSeek-V3's choice bias [E]
  (r"moe/(wi|wi_0|wi_1)/kernel$", ("expert", "embed", "mlp")),
  (r"moe/(wi|wi_0|wi_1)/bias$", ("expert", "mlp")),
  (r"moe/wo/kernel$", ("expert", "mlp", "embed")),
  (r"moe/wo/bias$", ("expert", None)),
  (r"lora_(a|b)$", (None, None)),  # LoRA adapters (nn/lora.py): small, replicated
  (r"(query)/kernel$", ("embed", "heads", "head_dim")),
  (r"(query_down|kv_down)/kernel$", ("embed", None)),  # latent attention (nn/mla.py)
  (r"(query_down|kv_down)/bias$", (None,)),
  (r"(query_down_norm|kv_down_norm)/scale$", (None,)),
  (r"(query_up|key_up|value_up)/kernel$", (None, "heads", "head_dim")),
  (r"(key|value)/kernel$", ("embed", "kv_heads", "head_dim")),
  (r"(query)/bias$", ("heads", "head_dim")),
  (r"(key|value)/bias$", ("kv_heads", "head_dim")),
  (r"out/kernel$", ("heads", "head_dim", "embed")),
  (r"(wi|wi_0|wi_1)/kernel$", ("embed", "mlp")),
  (r"(wi|wi_0|wi_1)/bias$", ("mlp",)),
  (r"wo/kernel$", ("mlp", "embed")),
  (r"(token_embed|shared_embed)/embedding$", ("vocab", "embed")),
  (r"(lm_head|mlm_head)/kernel$", ("embed", "vocab")),
  (r"(mlm_bias|final_logits_bias)$", ("vocab",)),  # [V] logit biases
  (r"(token_type_embed|positions)/embedding$", (None, "embed")),
  (r"pos_embedding$", (None, None, "embed")),
  (r"cls$", (None, None, "embed")),
  (r"distillation_token$", (None, None, "embed")),  # DeiT's second token, as [CLS]
  (r"(self_attention|cross_attention|ffn)_scale$", ("embed",)),  # layer scale [D]
  (r"patch_embed/kernel$", (None, None, None, "embed")),
  (r"(mlm_transform|pooler)/kernel$", ("embed", None)),
  (r"(classifier|head)/kernel$", ("embed", None)),
  (r"(rel_embedding|rel_key_embedding)$", (None, None)),
  (r"(query_norm|key_norm)/scale$", ("head_dim",)),  # QK-norm: one scale per head dim
  (r"query_head_norm/scale$", ("heads", "head_dim")),  # QK-norm, a scale per head
  (r"key_head_norm/scale$", ("kv_heads", "head_dim")),
  (r"(norm[^/]*)/(scale|bias)$", ("embed",)),
  (r"(out|wo|patch_embed|mlm_transform|pooler|classifier|head)/bias$", (None,)),
)

# Logical axis -> mesh axis (or axes, or None = replicated).
RULES: dict[str, str | tuple[str, ...] | None] = {
  "batch": ("data", "fsdp", "expert"),
  "expert": "expert",  # mixture-of-experts weights and the expert dim of routed tokens
  "expert_batch": ("data", "fsdp"),  # the rows of the tokens routed to the experts
  "embed": "fsdp",
  "heads": "tensor",
  "kv_heads": "tensor",
  "mlp": "tensor",
  "vocab": "tensor",
  "length": "context",  # the sequence of activations (context parallelism)
  "head_dim": None,
  "layers": None,
}


def logical_axes(params: Any) -> Any:
  """The tree of logical-axis tuples (one name or None per dimension) of `params`."""

  def axes_of(keypath, leaf):
    path = path_str(keypath)
    for pattern, axes in LOGICAL_AXES:
      if re.search(pattern, path):
        extra = len(leaf.shape) - len(axes)
        if extra == 1 and ("/layers/" in f"/{path}/"):  # nn.scan-stacked parameter
          return ("layers", *axes)
        if extra != 0:
          raise ValueError(f"parameter {path} has shape {leaf.shape}, rule gives axes {axes}")
        return axes
    raise ValueError(f"parameter {path} matches no rule in partitioning.LOGICAL_AXES")

  return jax.tree_util.tree_map_with_path(axes_of, params)


def make_mesh(
  shape: Mapping[str, int], devices: Sequence | None = None, dcn: Mapping[str, int] | None = None
) -> Mesh:
  """A (data, fsdp, tensor, expert, context) mesh; one size may be -1 (all remaining
  devices).

  Without `dcn` (or with every DCN size 1) it is built by `jax.make_mesh`, which orders
  the devices by the physical topology (TPU slices, GPUs of several hosts) so that
  neighbouring mesh positions are well-connected devices. With `dcn` (ways per axis
  across slices, e.g. {'data': 2}) it is a hybrid mesh: `shape` is the layout inside one
  slice and each axis is `shape x dcn` long in all, the slices joined along the DCN axes
  (`mesh_utils.create_hybrid_device_mesh`). Slices are the devices' `slice_index` (TPU
  multi-slice) or, where every device has the same one (CPU, GPU), the processes.
  The axes are `AxisType.Auto`: shardings follow the partitioning rules and XLA's
  propagation, as for a plain `Mesh`."""
  devices = list(jax.devices() if devices is None else devices)
  unknown = sorted(set(shape) - set(MESH_AXES)) + sorted(set(dcn or {}) - set(MESH_AXES))
  if unknown:
    raise ValueError(f"config.mesh: unknown axes {unknown}; expected {MESH_AXES}")
  dcn_sizes = [int((dcn or {}).get(a, 1)) for a in MESH_AXES]
  slices, granule = _slices(devices), "slice_index"
  if len(slices) == 1:
    slices, granule = _slices(devices, "process_index"), "process_index"
  ways = int(np.prod(dcn_sizes))
  if ways != 1 and ways != len(slices):
    across = " x ".join(f"dcn_{a}={n}" for a, n in zip(MESH_AXES, dcn_sizes, strict=True) if n != 1)
    unit = "slices" if granule == "slice_index" else "processes (one per slice)"
    raise ValueError(
      f"config.mesh: {across} = {ways} slices, but the devices form {len(slices)} {unit}"
    )
  per_slice = len(devices) // ways
  sizes = _sizes(shape, per_slice, "devices per slice" if ways > 1 else "devices")
  if ways == 1:
    return jax.make_mesh(
      tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
    )
  grid = mesh_utils.create_hybrid_device_mesh(
    sizes, dcn_sizes, devices, process_is_granule=granule == "process_index"
  )
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def describe(mesh: Mesh) -> str:
  """One line: the axes longer than 1, and which processes lie along each that spans
  several (a data axis across hosts or slices)."""
  parts = []
  for i, name in enumerate(mesh.axis_names):
    if mesh.shape[name] == 1:
      continue
    along = np.moveaxis(mesh.devices, i, 0).reshape(mesh.shape[name], -1)[:, 0]
    hosts = [d.process_index for d in along]
    spans = f" (processes {hosts})" if len(set(hosts)) > 1 else ""
    parts.append(f"{name} {mesh.shape[name]}{spans}")
  return ", ".join(parts) or "one device"


def _slices(devices: Sequence, attr: str = "slice_index") -> dict[int, list]:
  """The devices grouped by `attr` (one group where the devices lack it)."""
  groups: dict[int, list] = {}
  for d in devices:
    groups.setdefault(getattr(d, attr, 0) or 0, []).append(d)
  return groups


def _sizes(shape: Mapping[str, int], count: int, what: str) -> list[int]:
  """The axis sizes of `shape` in MESH_AXES order, a -1 resolved against `count` devices."""
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"config.mesh={dict(shape)}: sizes must be >= 1, with at most one -1")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if count % known:
      raise ValueError(f"config.mesh={dict(shape)}: {count} {what} not divisible by {known}")
    sizes[sizes.index(-1)] = count // known
  if int(np.prod(sizes)) != count:
    raise ValueError(
      f"config.mesh={dict(zip(MESH_AXES, sizes, strict=True))} needs {int(np.prod(sizes))} "
      f"{what}, have {count}"
    )
  return sizes


def spec_for(
  axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh, rules: Mapping | None = None
) -> PartitionSpec:
  """PartitionSpec of one array: rules applied, mesh axes used once, indivisible dims replicated."""
  rules = RULES if rules is None else {**RULES, **rules}
  used: set[str] = set()
  spec = []
  for name, size in zip(axes, shape, strict=True):
    target = rules.get(name) if name is not None else None
    names = (target,) if isinstance(target, str) else tuple(target or ())
    names = tuple(n for n in names if n not in used and mesh.shape.get(n, 1) > 1)
    total = int(np.prod([mesh.shape[n] for n in names])) if names else 1
    if not names or size % total:
      spec.append(None)
      continue
    used.update(names)
    spec.append(names[0] if len(names) == 1 else names)
  return PartitionSpec(*spec)


def param_shardings(params: Any, mesh: Mesh, rules: Mapping | None = None) -> Any:
  """NamedSharding for every parameter, from its logical axes and the rules."""
  axes = logical_axes(params)
  return jax.tree.map(
    lambda a, p: NamedSharding(mesh, spec_for(a, tuple(p.shape), mesh, rules)),
    axes,
    params,
    is_leaf=lambda x: isinstance(x, tuple),
  )


def state_shardings(state: Any, params: Any, mesh: Mesh, rules: Mapping | None = None) -> Any:
  """Shardings for a train state: parameter-shaped subtrees (Adam moments) follow the
  parameters by path suffix; everything else (step, counts, rng) is replicated."""
  by_path = {}
  for keypath, sharding in jax.tree_util.tree_leaves_with_path(
    param_shardings(params, mesh, rules)
  ):
    by_path[path_str(keypath)] = sharding
  shapes = {path_str(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(params)}
  replicated = NamedSharding(mesh, PartitionSpec())

  def pick(keypath, leaf):
    path = path_str(keypath)
    for suffix, sharding in by_path.items():
      matches = path == suffix or path.endswith("/" + suffix)
      if matches and tuple(leaf.shape) == shapes[suffix]:
        return sharding
    return replicated

  return jax.tree_util.tree_map_with_path(pick, state)


def batch_sharding(mesh: Mesh, rules: Mapping | None = None) -> NamedSharding:
  """The batch's first dimension split over the 'batch' rule's axes (data and fsdp)."""
  rules = RULES if rules is None else {**RULES, **rules}
  target = rules["batch"]
  names = (target,) if isinstance(target, str) else tuple(target or ())
  return NamedSharding(mesh, PartitionSpec(names if names else None))


# ----------------------------------------------------------------------------------------
# Activations: sharding constraints by logical axes, active while a step is traced.

_LAYOUT: contextvars.ContextVar = contextvars.ContextVar("activation_layout", default=None)


@contextlib.contextmanager
def activation_layout(mesh: Mesh, rules: Mapping | None = None):
  """Within this context, `constrain` pins activations to the mesh by their logical axes."""
  token = _LAYOUT.set((mesh, rules))
  try:
    yield
  finally:
    _LAYOUT.reset(token)


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
  """x laid out by logical `axes` (e.g. ('batch', 'length', 'embed')); outside a
  `activation_layout` context (single device, tests, decoding) it returns x unchanged."""
  layout = _LAYOUT.get()
  if layout is None:
    return x
  mesh, rules = layout
  spec = spec_for(axes, tuple(x.shape), mesh, rules)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


# ----------------------------------------------------------------------------------------
# Kernels that must see their shard: shard_map over the active layout's mesh.


def active_layout() -> tuple[Mesh, Mapping | None] | None:
  """The (mesh, rules) of the enclosing `activation_layout`, or None outside one."""
  return _LAYOUT.get()


def context_size() -> int:
  """Ways the sequence of activations is split (the mesh's 'context' axis) in the
  enclosing `activation_layout`; 1 outside one."""
  layout = _LAYOUT.get()
  return 1 if layout is None else int(layout[0].shape.get("context", 1))


def map_shards(
  fn: Callable[..., jax.Array],
  args: Sequence[jax.Array | None],
  in_axes: Sequence[tuple[str | None, ...] | None],
  out_axes: tuple[str | None, ...],
) -> jax.Array:
  """fn(*args) computed shard by shard (`jax.shard_map`) on the active layout's mesh.

  Each array is split by its logical axes (`spec_for`: the rules, indivisible dimensions
  replicated); the one output has the shape of args[0] and is laid out by `out_axes`.
  None arguments reach fn as None. fn sees the shard's shapes, so a kernel that is built
  for its shapes (splash attention) is built per shard. Outside an `activation_layout`
  (single device, tests, decoding) it is fn(*args).
  """
  layout = _LAYOUT.get()
  if layout is None:
    return fn(*args)
  mesh, rules = layout
  present = [i for i, a in enumerate(args) if a is not None]
  specs = tuple(spec_for(in_axes[i], tuple(args[i].shape), mesh, rules) for i in present)
  out_spec = spec_for(out_axes, tuple(args[0].shape), mesh, rules)

  def body(*arrays):
    full = list(args)
    for i, a in zip(present, arrays, strict=True):
      full[i] = a
    return fn(*full)

  mapped = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out_spec, check_vma=False)
  return mapped(*(args[i] for i in present))
