"""DeiT (`DeiTForImageClassificationWithTeacher`): ViT with a distillation token.

The backbone is ViT's under 'deit.' (`convert.vit`), with `deit.embeddings.
distillation_token` after [CLS] (`vit_distillation_token=True`, position table [1, 2 + G*G,
D]) and two linear heads, `cls_classifier` on [CLS] and `distillation_classifier` on the
distillation token, whose logits HF's model averages as ours does. The pooler fields of
`DeiTConfig` (`pooler_output_size`, `pooler_act`) and `encoder_stride` belong to other
heads and are not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import vit
from transformer.convert.base import Converter, Rule, linear, same
from transformer.nn.config import ModelConfig

ARCHITECTURE = "DeiTForImageClassificationWithTeacher"
PREFIX = "deit."


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  fields = vit.fields_from_hf(hf, ARCHITECTURE)
  return {**fields, "max_len": fields["max_len"] + 1, "vit_distillation_token": True}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  return {"model_type": "deit", **vit.fields_to_hf(c, ARCHITECTURE)}


def rules(c: ModelConfig) -> list[Rule]:
  return [
    *vit.backbone(c, PREFIX),
    same("distillation_token", f"{PREFIX}embeddings.distillation_token"),
    *linear("head", "cls_classifier"),
    *linear("distillation_head", "distillation_classifier"),
  ]


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "deit", config_from_hf, config_to_hf, rules, PREFIX, vit.init_inputs
  ),
}
