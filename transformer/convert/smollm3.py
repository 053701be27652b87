"""SmolLM3 (`SmolLM3ForCausalLM`): the Llama decoder with NoPE layers.

`no_rope_layers` (1 = RoPE, 0 = no position encoding; by default every
`no_rope_layer_interval`-th layer is NoPE) -> `ModelConfig.rope_pattern`, its shortest
period ('RRRN'). Its sliding-window variant (`use_sliding_window`) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama
from transformer.convert.base import NO_TOKEN_IDS, Converter, require, shortest_period, unsupported
from transformer.nn.config import ModelConfig

ARCHITECTURE = "SmolLM3ForCausalLM"


def rope_pattern(a: str, uses_rope: list[int], layers: int) -> str:
  """`ModelConfig.rope_pattern` of a per-layer 1 (RoPE) / 0 (NoPE) list: its shortest
  period, '' when every layer has RoPE."""
  if len(uses_rope) != layers or set(uses_rope) - {0, 1}:
    unsupported(a, "no_rope_layers", uses_rope, (f"{layers} of 0 and 1",))
  kinds = "".join("R" if r else "N" for r in uses_rope)
  return "" if kinds == "R" * layers else shortest_period(kinds)


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "use_sliding_window", (False,))
  layers, interval = hf["num_hidden_layers"], hf.get("no_rope_layer_interval", 4)
  uses_rope = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
  fields = llama.config_from_hf(hf, a) | {"rope_pattern": rope_pattern(a, uses_rope, layers)}
  return fields | {"tie_embeddings": hf.get("tie_word_embeddings", True)}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  pattern = c.rope_pattern or "R"
  uses_rope = [int(pattern[i % len(pattern)] == "R") for i in range(c.num_layers)]
  out = llama.config_to_hf(c) | {"model_type": "smollm3", "no_rope_layers": uses_rope}
  out |= NO_TOKEN_IDS  # the ids travel with the tokenizer files
  return out | {"use_sliding_window": False, "layer_types": ["full_attention"] * c.num_layers}


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "smollm3", config_from_hf, config_to_hf, llama.rules, llama.PREFIX
  ),
}
