"""`ModelConfig`'s rules for its option groups (RoPE scaling, layer patterns, MoE, LoRA,
vision, norms and encoder heads), and `fail`, the one-line error every rule raises.

`config.ModelConfig.__post_init__` calls them; each family's, position's and kernel's own
rules live with that module (`models.check`). This module imports nothing from the
package, so `config` imports it one way.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn


def fail(field: str, value: Any, rule: str) -> NoReturn:
  """Raises the one-line `ValueError` of an invalid field: 'ModelConfig.field=value: rule'."""
  raise ValueError(f"ModelConfig.{field}={value!r}: {rule}")


def is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


ROPE_SCALINGS = ("none", "linear", "llama3", "yarn")


def validate_rope_scaling(c: Any) -> None:
  if c.rope_scaling not in ROPE_SCALINGS:
    fail("rope_scaling", c.rope_scaling, f"must be one of {ROPE_SCALINGS}")
  if c.rope_scaling == "none":
    return
  if c.position != "rope":
    fail("rope_scaling", c.rope_scaling, f"needs position='rope', got {c.position!r}")
  if not (is_number(c.rope_scaling_factor) and c.rope_scaling_factor > 0):
    fail("rope_scaling_factor", c.rope_scaling_factor, "must be > 0")
  if c.rope_scaling == "linear":
    return
  if not (is_int(c.rope_original_max_len) and c.rope_original_max_len > 0):
    fail("rope_original_max_len", c.rope_original_max_len, "must be an int > 0")
  if c.rope_scaling == "yarn":
    fast, slow = c.rope_beta_fast, c.rope_beta_slow
    if not (is_number(fast) and is_number(slow) and fast > slow > 0):
      fail("rope_beta_fast", fast, f"must be > rope_beta_slow={slow!r} > 0")
    if not isinstance(c.rope_truncate, bool):
      fail("rope_truncate", c.rope_truncate, "must be True or False")
    factor = c.rope_attention_factor
    if factor is not None and not (is_number(factor) and factor > 0):
      fail("rope_attention_factor", factor, "must be a number > 0, or None")
    return
  low, high = c.rope_low_freq_factor, c.rope_high_freq_factor
  if not (is_number(low) and is_number(high) and 0 < low < high):
    fail("rope_high_freq_factor", high, f"must be > rope_low_freq_factor={low!r} > 0")


def validate_layer_pattern(c: Any) -> None:
  for field in ("rope_local_theta", "attention_softcap", "logits_softcap"):
    value = getattr(c, field)
    if value is not None and not (is_number(value) and value > 0):
      fail(field, value, "must be a number > 0, or None")
  pattern = c.local_global_pattern
  if not isinstance(pattern, str) or set(pattern) - {"L", "G"}:
    fail("local_global_pattern", pattern, "must be a string of L (local) and G (global)")
  if "L" in pattern and c.sliding_window is None:
    fail("local_global_pattern", pattern, "L (local) layers need a sliding_window")
  if not isinstance(c.attention_scale_by_layer, bool):
    fail("attention_scale_by_layer", c.attention_scale_by_layer, "must be True or False")
  if c.attention_scale_by_layer and c.scan_layers:
    fail("attention_scale_by_layer", True, "needs scan_layers=False (scanned layers are alike)")
  if len(set(pattern)) > 1 and c.scan_layers:
    fail("local_global_pattern", pattern, "must be uniform with scan_layers=True")
  if c.rope_local_theta is not None and (c.position != "rope" or "L" not in pattern):
    fail("rope_local_theta", c.rope_local_theta, "needs position='rope' and L layers")
  rope = c.rope_pattern
  if not isinstance(rope, str) or set(rope) - {"R", "N"}:
    fail("rope_pattern", rope, "must be a string of R (RoPE) and N (no position encoding)")
  if rope and c.position != "rope":
    fail("rope_pattern", rope, f"needs position='rope', got {c.position!r}")
  if len(set(rope)) > 1 and c.scan_layers:
    fail("rope_pattern", rope, "must be uniform with scan_layers=True")
  for field in ("embedding_multiplier", "residual_multiplier", "logits_multiplier"):
    if not (is_number(getattr(c, field)) and getattr(c, field) > 0):
      fail(field, getattr(c, field), "must be a number > 0")


def validate_moe(c: Any) -> None:
  if not is_int(c.moe_experts) or c.moe_experts < 0:
    fail("moe_experts", c.moe_experts, "must be an integer >= 0 (0 = dense feed-forward)")
  for field in ("moe_balance_loss", "moe_router_z_loss"):
    value = getattr(c, field)
    if not is_number(value) or value < 0:
      fail(field, value, "must be a number >= 0")
  if c.moe_norm_topk is not None and not isinstance(c.moe_norm_topk, bool):
    fail("moe_norm_topk", c.moe_norm_topk, "must be True, False or None (= moe_top_k > 1)")
  if not is_int(c.moe_shared_d_ff) or c.moe_shared_d_ff < 0:
    fail("moe_shared_d_ff", c.moe_shared_d_ff, "must be an integer >= 0 (0 = no shared expert)")
  if not isinstance(c.moe_shared_gate, bool):
    fail("moe_shared_gate", c.moe_shared_gate, "must be True or False")
  if c.moe_shared_gate and not c.moe_shared_d_ff:
    fail("moe_shared_gate", True, "needs a shared expert (moe_shared_d_ff > 0)")
  if not is_int(c.moe_d_ff) or c.moe_d_ff < 0:
    fail("moe_d_ff", c.moe_d_ff, "must be an integer >= 0 (0 = d_ff)")
  for field in ("moe_shared_d_ff", "moe_d_ff", "moe_first_dense"):
    if getattr(c, field) and not c.moe_experts:
      fail(field, getattr(c, field), "needs moe_experts > 0")
  if c.moe_router not in ("softmax", "sigmoid"):
    fail("moe_router", c.moe_router, "must be one of softmax, sigmoid")
  if not isinstance(c.moe_selection_bias, bool):
    fail("moe_selection_bias", c.moe_selection_bias, "must be True or False")
  if not (is_number(c.moe_routed_scale) and c.moe_routed_scale > 0):
    fail("moe_routed_scale", c.moe_routed_scale, "must be a number > 0")
  if not c.moe_experts:
    return
  if not is_int(c.moe_top_k) or not 1 <= c.moe_top_k <= c.moe_experts:
    fail("moe_top_k", c.moe_top_k, f"must be an integer in [1, moe_experts={c.moe_experts}]")
  if not is_int(c.moe_every) or not 1 <= c.moe_every <= c.num_layers:
    fail("moe_every", c.moe_every, f"must be an integer in [1, num_layers={c.num_layers}]")
  if c.scan_layers and c.moe_every != 1:
    fail("moe_every", c.moe_every, "must be 1 with scan_layers=True (scanned layers are alike)")
  dense = c.moe_first_dense
  if not is_int(dense) or not 0 <= dense < c.num_layers:
    fail("moe_first_dense", dense, f"must be an integer in [0, num_layers={c.num_layers})")
  if c.scan_layers and dense:
    fail("moe_first_dense", dense, "must be 0 with scan_layers=True (scanned layers are alike)")
  f = c.moe_capacity_factor
  if f is not None and (not is_number(f) or not f > 0):
    fail("moe_capacity_factor", f, "must be a number > 0, or None (dropless)")
  _validate_groups(c)


def _validate_groups(c: Any) -> None:
  """Group-limited routing (DeepSeek-V3): moe_groups equal groups of 2 or more experts."""
  g = c.moe_groups
  if not is_int(g) or g < 1 or c.moe_experts % g or (g > 1 and c.moe_experts // g < 2):
    fail("moe_groups", g, f"must divide moe_experts={c.moe_experts} into groups of 2 or more")
  if not is_int(c.moe_top_groups) or not 1 <= c.moe_top_groups <= g:
    fail("moe_top_groups", c.moe_top_groups, f"must be an integer in [1, moe_groups={g}]")
  if c.moe_top_k > c.moe_top_groups * c.moe_experts // g:
    fail("moe_top_k", c.moe_top_k, "exceeds the experts of the moe_top_groups groups")


def validate_mla(c: Any) -> None:
  """Latent attention (`mla.py`): decoder self-attention with RoPE on its own features."""
  for field in ("mla_kv_rank", "mla_q_rank", "mla_v_dim"):
    if not is_int(getattr(c, field)) or getattr(c, field) < 0:
      fail(field, getattr(c, field), "must be an integer >= 0")
  if not c.mla_kv_rank:
    for field in ("mla_q_rank", "mla_v_dim"):
      if getattr(c, field):
        fail(field, getattr(c, field), "needs mla_kv_rank > 0 (latent attention)")
    return
  r = c.mla_rope_dim
  if not is_int(r) or r <= 0 or r % 2:
    fail("mla_rope_dim", r, "must be an even integer > 0")
  needs = (
    ("family", c.family == "decoder", "decoder"),
    ("position", c.position == "rope", "rope"),
    ("rope_fraction", c.rope_fraction == 1.0, 1.0),
    ("rope_pattern", not c.rope_pattern, ""),
    ("qk_norm", not c.qk_norm, False),
    ("qkv_bias", c.qkv_bias is None, None),
    ("num_kv_heads", c.kv_heads == c.num_heads, c.num_heads),
  )
  for field, ok, want in needs:
    if not ok:
      fail(field, getattr(c, field), f"must be {want!r} with latent attention (mla_kv_rank > 0)")
  frozen = [t for t in c.lora_targets if re.search(t, "self_attention/key_up")]
  frozen += [t for t in c.lora_targets if re.search(t, "self_attention/value_up")]
  if c.lora_rank and frozen:
    fail("lora_targets", frozen[0], "latent attention's key_up / value_up take no LoRA adapters")


def validate_lora(c: Any) -> None:
  if not is_int(c.lora_rank) or c.lora_rank < 0:
    fail("lora_rank", c.lora_rank, "must be an integer >= 0 (0 = no adapters)")
  if not is_number(c.lora_alpha) or not c.lora_alpha > 0:
    fail("lora_alpha", c.lora_alpha, "must be a number > 0")
  for field in ("lora_targets", "lora_trainable"):
    patterns = getattr(c, field)
    if not isinstance(patterns, tuple) or not all(isinstance(p, str) for p in patterns):
      fail(field, patterns, "must be a tuple of regular expressions (strings)")
    for pattern in patterns:
      try:
        re.compile(pattern)
      except re.error as e:
        fail(field, patterns, f"pattern {pattern!r} is not a regular expression ({e})")
  if c.lora_rank and not c.lora_targets:
    fail("lora_targets", c.lora_targets, "must name at least one projection when lora_rank > 0")


def validate_vision(c: Any) -> None:
  """The distillation token, the layer scale and cls_mean pooling (the ViT rules they add
  are `models.vit.validate`'s)."""
  if not isinstance(c.vit_distillation_token, bool):
    fail("vit_distillation_token", c.vit_distillation_token, "must be True or False")
  if c.vit_distillation_token and c.family != "vit":
    fail("vit_distillation_token", True, f"is a ViT (DeiT) token, got family={c.family!r}")
  scale = c.layer_scale_init
  if scale is not None and not (is_number(scale) and abs(scale) < float("inf")):
    fail("layer_scale_init", scale, "must be a finite number, or None (no layer scale)")


POOLER_ACTIVATIONS = ("tanh", "gelu_norm")
ENCODER_HEAD_DEFAULTS = {"head_bias": True, "mlm_output_bias": True, "pooler_activation": "tanh"}
BOOL_HEAD_FIELDS = ("head_bias", "mlm_output_bias")


def validate_norms_and_heads(c: Any) -> None:
  """The norm options (LayerNorm bias, the encoder's embedding norm, layer 0's attention
  norm) and the encoder heads' options (ModernBERT's)."""
  for field in ("norm_bias", "embed_norm", "first_layer_attention_norm", *BOOL_HEAD_FIELDS):
    if not isinstance(getattr(c, field), bool):
      fail(field, getattr(c, field), "must be True or False")
  if c.pooler_activation not in POOLER_ACTIVATIONS:
    fail(
      "pooler_activation", c.pooler_activation, f"must be one of {', '.join(POOLER_ACTIVATIONS)}"
    )
  if not c.norm_bias and c.norm != "layernorm":
    fail("norm_bias", False, f"needs norm='layernorm' (RMSNorm has no bias), got {c.norm!r}")
  if not c.first_layer_attention_norm and (
    c.norm_position != "pre" or c.parallel_residual or c.scan_layers
  ):
    fail(
      "first_layer_attention_norm",
      False,
      "needs norm_position='pre', parallel_residual=False and scan_layers=False",
    )
  if c.embed_norm and c.family not in ("encoder", "seq2seq"):
    fail("embed_norm", True, f"is an encoder or seq2seq option, got family={c.family!r}")
  if c.embed_norm and c.family == "encoder" and c.norm_position == "post":
    fail("embed_norm", True, "is implied by norm_position='post' (post-LN always has one)")
  for field, default in ENCODER_HEAD_DEFAULTS.items():
    if getattr(c, field) != default and c.family != "encoder":
      fail(field, getattr(c, field), f"is an encoder head option, got family={c.family!r}")


SINUSOIDAL_LAYOUTS = ("interleaved", "split")


def validate_seq2seq(c: Any) -> None:
  """The encoder-decoder options: the logits bias, the decoder's start id, and the layout of
  sinusoidal positions (any family)."""
  if c.sinusoidal_layout not in SINUSOIDAL_LAYOUTS:
    fail(
      "sinusoidal_layout", c.sinusoidal_layout, f"must be one of {', '.join(SINUSOIDAL_LAYOUTS)}"
    )
  if c.sinusoidal_layout == "split" and (c.position != "sinusoidal" or c.family == "vit"):
    fail("sinusoidal_layout", "split", "needs position='sinusoidal' (1-D: not a ViT's 2-D table)")
  if not isinstance(c.final_logits_bias, bool):
    fail("final_logits_bias", c.final_logits_bias, "must be True or False")
  if c.final_logits_bias and c.family != "seq2seq":
    fail("final_logits_bias", True, f"is a seq2seq option, got family={c.family!r}")
  start = c.decoder_start_id
  if not is_int(start) or not 0 <= start < c.vocab_size:
    fail("decoder_start_id", start, f"must be a token id in [0, vocab_size={c.vocab_size})")
  if start and c.family != "seq2seq":
    fail("decoder_start_id", start, f"is a seq2seq option, got family={c.family!r}")
