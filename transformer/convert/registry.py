"""Hugging Face `architectures` names -> converters, from each family module's `CONVERTERS`.

A new architecture is a module with a `CONVERTERS` dict and one entry in `MODULES`.
"""

from __future__ import annotations

from transformer.convert import (
  bart,
  bert,
  cohere2,
  deepseek_v3,
  deit,
  dinov2,
  ernie,
  exaone4,
  gemma,
  glm4,
  glm4_moe,
  gpt2,
  gpt_neox,
  granite,
  llama,
  marian,
  mixtral,
  modernbert,
  olmo2,
  phi3,
  qwen2_moe,
  qwen3,
  roberta,
  smollm3,
  stablelm,
  starcoder2,
  t5,
  vit,
)
from transformer.convert.base import Converter

MODULES = (
  gpt2,
  bert,
  roberta,
  modernbert,
  vit,
  deit,
  dinov2,
  llama,
  qwen3,
  mixtral,
  qwen2_moe,
  glm4_moe,
  deepseek_v3,
  olmo2,
  gemma,
  phi3,
  gpt_neox,
  granite,
  smollm3,
  glm4,
  ernie,
  starcoder2,
  cohere2,
  exaone4,
  stablelm,
  t5,
  bart,
  marian,
)

ARCHITECTURES: dict[str, Converter] = {
  name: converter for module in MODULES for name, converter in module.CONVERTERS.items()
}


def get(architecture: str, where: str = "architecture") -> Converter:
  """The converter of `architecture`, or the one-line `ValueError` listing what is supported."""
  if architecture not in ARCHITECTURES:
    raise ValueError(
      f"{where}={architecture!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
    )
  return ARCHITECTURES[architecture]
