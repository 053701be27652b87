"""Gemma (`GemmaForCausalLM`, Gemma 1): the Llama tensor layout with three differences.

- Every RMSNorm multiplies by (1 + weight), the weight starting at 0
  (`ModelConfig.norm_scale_plus_one`; the checkpoint's weight is our scale as it is).
- Token embeddings are multiplied by sqrt(D) (`scale_embeddings`), in the compute dtype as
  Hugging Face does (its bf16 models round sqrt(D) to bf16 first; so does ours).
- The feed-forward is GeGLU with tanh GELU (`geglu_tanh`). Hugging Face reads the legacy
  `hidden_act='gelu'` of the original Gemma configs as the tanh form, and so do we.

Heads are usually wider than D / N (`head_dim` 256: `attention_head_dim`) and the output
is tied to the embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer.convert import llama
from transformer.convert.base import Converter, require
from transformer.nn.config import ModelConfig

ARCHITECTURE = "GemmaForCausalLM"
GELU_TANH = {"gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh", "gelu": "geglu_tanh"}


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
  a = ARCHITECTURE
  require(hf, a, "attention_bias", (False,))
  require(hf, a, "use_bidirectional_attention", (None, False))
  fields = llama.common(hf, a, False, GELU_TANH)
  fields |= {"norm_scale_plus_one": True, "scale_embeddings": True}
  return fields | {"tie_embeddings": hf.get("tie_word_embeddings", True)}


def config_to_hf(c: ModelConfig) -> dict[str, Any]:
  out = llama.config_to_hf(c) | {"model_type": "gemma", "hidden_act": "gelu_pytorch_tanh"}
  del out["mlp_bias"]
  return out


CONVERTERS = {
  ARCHITECTURE: Converter(
    ARCHITECTURE, "gemma", config_from_hf, config_to_hf, llama.rules, llama.PREFIX
  ),
}
