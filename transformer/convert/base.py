"""What a Hugging Face converter is: a config mapping and a list of tensor rules.

Letters: D model dim, N heads (query or key/value), H head dim, F feed-forward width.

A `Rule` ties one or more of our parameters (paths as `model.init` names them, without the
leading 'params/') to one or more tensors of a Hugging Face state dict, with the two
NumPy functions between them; `to_hf(*to_ours(x)) == x` bit for bit. A `Converter` holds
one architecture's config mapping and its rules; the directory IO that uses them is
`convert.hf`. PyTorch `nn.Linear` weights are [out, in]; our dense kernels are [in, out].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

import numpy as np

from transformer.nn.config import ModelConfig

Arrays = tuple[np.ndarray, ...]

# Hugging Face `hidden_act` / `activation_function` names -> ModelConfig.activation.
HF_ACTIVATIONS = {
  "gelu": "gelu",
  "gelu_new": "gelu_tanh",
  "gelu_pytorch_tanh": "gelu_tanh",
  "relu": "relu",
}
OUR_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


@dataclasses.dataclass(frozen=True)
class Rule:
  """Our parameters `ours` <-> Hugging Face tensors `hf`, through two NumPy functions."""

  ours: tuple[str, ...]  # e.g. ('decoder/layer_0/ffn/wi/kernel',)
  hf: tuple[str, ...]  # e.g. ('transformer.h.0.mlp.c_fc.weight',)
  to_ours: Callable[..., Arrays]  # HF arrays (in `hf` order) -> ours (in `ours` order)
  to_hf: Callable[..., Arrays]  # the inverse


@dataclasses.dataclass(frozen=True)
class Converter:
  """One Hugging Face architecture (a `config.json` `architectures` entry).

  config_from_hf: config.json dict -> ModelConfig fields (every architectural field; an
    option the architecture has and we lack raises `unsupported`).
  config_to_hf: ModelConfig -> config.json dict (without `architectures`).
  rules: the tensor rules of a config, covering every parameter of its model.
  base_prefix: the backbone's key prefix ('transformer.'), which checkpoints saved from
    the bare backbone (e.g. the original `gpt2`) leave out.
  init_inputs: example inputs of the model's `init` (shapes only; default tokens [1, 1]).
  swapped_pad: config.json -> the checkpoint's PAD id, whose embedding rows (and logits)
    import swaps with id 0's so that our PAD is 0, and which the directory's tokenizer
    swaps the same way (`convert.tokenizers`); 0 = nothing swapped.
  resamples_positions: `rules` resample the learned position table to the config's
    `image_size` (DINOv2), so the checkpoint loads at another image size.
  """

  architecture: str
  model_type: str
  config_from_hf: Callable[[Mapping[str, Any]], dict[str, Any]]
  config_to_hf: Callable[[ModelConfig], dict[str, Any]]
  rules: Callable[[ModelConfig], list[Rule]]
  base_prefix: str = ""
  init_inputs: Callable[[ModelConfig], tuple[np.ndarray, ...]] = lambda c: (
    np.zeros((1, 1), np.int32),  # tokens [B, T]
  )
  swapped_pad: Callable[[Mapping[str, Any]], int] = lambda hf: 0
  resamples_positions: bool = False


def unsupported(architecture: str, option: str, value: Any, supported: Iterable[Any]) -> NoReturn:
  """Raises the one-line `ValueError` for an option value we cannot convert."""
  listed = ", ".join(repr(s) for s in supported)
  raise ValueError(f"{architecture}: {option}={value!r} is not supported (supported: {listed})")


def require(hf: Mapping[str, Any], architecture: str, option: str, supported: tuple) -> Any:
  """hf[option] (a missing option counts as supported[0]) when it is one of `supported`."""
  value = hf.get(option, supported[0])
  if value not in supported:
    unsupported(architecture, option, value, supported)
  return value


def activation(hf: Mapping[str, Any], architecture: str, option: str) -> str:
  """The ModelConfig activation of hf[option] ('gelu_new' -> 'gelu_tanh')."""
  return HF_ACTIVATIONS[require(hf, architecture, option, tuple(HF_ACTIVATIONS))]


def labels(num_classes: int) -> dict[str, Any]:
  """The config.json label maps of a classifier with `num_classes` outputs."""
  names = [f"LABEL_{i}" for i in range(num_classes)]
  return {
    "id2label": {str(i): n for i, n in enumerate(names)},
    "label2id": {n: i for i, n in enumerate(names)},
  }


def num_labels(hf: Mapping[str, Any]) -> int:
  """Classes of a Hugging Face classifier config (id2label, else num_labels, else 2)."""
  if hf.get("id2label"):
    return len(hf["id2label"])
  return int(hf.get("num_labels", 2))


LAYER_KINDS = {"sliding_attention": "L", "full_attention": "G"}  # HF layer_types -> ours


def layer_pattern(architecture: str, types: list[str], layers: int) -> str:
  """`ModelConfig.local_global_pattern` of HF's `layer_types` (one kind per layer): the
  shortest period of the layers' kinds ('LLLLLG' for Gemma 3, 'GLL' for ModernBERT)."""
  if set(types) - set(LAYER_KINDS) or len(types) != layers:
    unsupported(architecture, "layer_types", types, (f"{layers} of {', '.join(LAYER_KINDS)}",))
  return shortest_period("".join(LAYER_KINDS[t] for t in types))


def shortest_period(kinds: str) -> str:
  """The shortest prefix of a per-layer string that repeats to it ('LLG' of 'LLGLLG')."""
  n = len(kinds)
  period = next(p for p in range(1, n + 1) if all(kinds[i] == kinds[i % p] for i in range(n)))
  return kinds[:period]


def layer_types(c: ModelConfig) -> list[str]:
  """HF's `layer_types` of a config (export): 'full_attention' or 'sliding_attention'."""
  return [
    "full_attention" if c.is_global_layer(i) else "sliding_attention" for i in range(c.num_layers)
  ]


# Rule builders. `ours` and `hf` are prefixes: 'decoder/layer_0/ffn/wi', 'h.0.mlp.c_fc'.


def same(ours: str, hf: str) -> Rule:
  """An identical tensor (embeddings, biases, norm scales)."""
  return Rule((ours,), (hf,), lambda x: (x,), lambda x: (x,))


def linear(ours: str, hf: str, bias: bool = True) -> list[Rule]:
  """nn.Linear weight [out, in] (+ bias) <-> Dense kernel [in, out] (+ bias)."""
  rules = [Rule((f"{ours}/kernel",), (f"{hf}.weight",), lambda w: (w.T,), lambda k: (k.T,))]
  return rules + ([same(f"{ours}/bias", f"{hf}.bias")] if bias else [])


def norm(ours: str, hf: str, bias: bool = True) -> list[Rule]:
  """LayerNorm weight, bias <-> scale, bias (RMSNorm: weight <-> scale only)."""
  rules = [same(f"{ours}/scale", f"{hf}.weight")]
  return rules + ([same(f"{ours}/bias", f"{hf}.bias")] if bias else [])


def experts(ours: str, hf: tuple[str, ...]) -> Rule:
  """One nn.Linear weight [out, in] per expert (`hf`, expert 0 first) <-> our expert kernel
  `ours`/kernel [E, in, out]."""

  def to_ours(*weights):
    return (np.stack([w.T for w in weights]),)  # [E, in, out]

  def to_hf(kernel):
    return tuple(kernel[e].T for e in range(len(hf)))

  return Rule((f"{ours}/kernel",), tuple(f"{name}.weight" for name in hf), to_ours, to_hf)


def heads_in(ours: str, hf: str, heads: int, head_dim: int, bias: bool = True) -> list[Rule]:
  """q/k/v nn.Linear [N*H, D] (+ [N*H]) <-> DenseGeneral kernel [D, N, H] (+ [N, H])."""

  def to_ours(w):
    return (w.T.reshape(w.shape[1], heads, head_dim),)  # [D, N, H]

  def to_hf(k):
    return (k.reshape(k.shape[0], heads * head_dim).T,)  # [N*H, D]

  rules = [Rule((f"{ours}/kernel",), (f"{hf}.weight",), to_ours, to_hf)]
  if bias:
    rules.append(
      Rule(
        (f"{ours}/bias",),
        (f"{hf}.bias",),
        lambda b: (b.reshape(heads, head_dim),),  # [N, H]
        lambda b: (b.reshape(heads * head_dim),),  # [N*H]
      )
    )
  return rules


def heads_out(ours: str, hf: str, heads: int, head_dim: int, bias: bool = True) -> list[Rule]:
  """Output nn.Linear [D, N*H] <-> DenseGeneral kernel [N, H, D]; the bias [D] as is."""

  def to_ours(w):
    return (w.T.reshape(heads, head_dim, w.shape[0]),)  # [N, H, D]

  def to_hf(k):
    return (k.reshape(heads * head_dim, k.shape[-1]).T,)  # [D, N*H]

  rules = [Rule((f"{ours}/kernel",), (f"{hf}.weight",), to_ours, to_hf)]
  return rules + ([same(f"{ours}/bias", f"{hf}.bias")] if bias else [])


def attention(
  ours: str,
  hf: tuple[str, str, str, str],
  heads: int,
  head_dim: int,
  kv_heads: int | None = None,
  *,
  qkv_bias: bool = True,
  out_bias: bool = True,
) -> list[Rule]:
  """Our attention `ours`' query, key, value and out <-> the four nn.Linear `hf` (q, k, v,
  output); key and value have `kv_heads` heads (default `heads`)."""
  kv = heads if kv_heads is None else kv_heads
  q, k, v, o = hf
  return [
    *heads_in(f"{ours}/query", q, heads, head_dim, qkv_bias),
    *heads_in(f"{ours}/key", k, kv, head_dim, qkv_bias),
    *heads_in(f"{ours}/value", v, kv, head_dim, qkv_bias),
    *heads_out(f"{ours}/out", o, heads, head_dim, out_bias),
  ]


# config.json token ids left unset on export, where the family's defaults (ids of its own
# vocabulary) could fall outside a smaller one: the ids travel with the tokenizer files.
NO_TOKEN_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}

# Fields every architecture here has at these values (options our ModelConfig adds).
PLAIN = {
  "sliding_window": None,
  "qkv_bias": None,
  "scale_embeddings": False,
  "attention_scale": None,
  "scale_logits": False,
  "attention_head_dim": None,
  "qk_norm": False,
  "moe_experts": 0,
  "moe_shared_d_ff": 0,
  "moe_router": "softmax",
  "moe_selection_bias": False,
  "moe_groups": 1,
  "moe_top_groups": 1,
  "moe_routed_scale": 1.0,
  "moe_shared_gate": False,
  "moe_d_ff": 0,
  "moe_first_dense": 0,
  "norm_scale_plus_one": False,
  "parallel_residual": False,
  "rope_fraction": 1.0,
  "local_global_pattern": "",
  "qk_norm_over": "head",
  "attention_scale_by_layer": False,
  "layer_scale_init": None,
  "vit_distillation_token": False,
  "rope_local_theta": None,
  "rope_pattern": "",
  "embedding_multiplier": 1.0,
  "residual_multiplier": 1.0,
  "logits_multiplier": 1.0,
  "attention_softcap": None,
  "logits_softcap": None,
  "norm_bias": True,
  "embed_norm": False,
  "first_layer_attention_norm": True,
  "head_bias": True,
  "mlm_output_bias": True,
  "pooler_activation": "tanh",
  "sinusoidal_layout": "interleaved",
  "final_logits_bias": False,
  "decoder_start_id": 0,
}


def hf_activation(config: ModelConfig, architecture: str) -> str:
  """The Hugging Face name of `config.activation`, or the one-line refusal."""
  if config.activation not in OUR_ACTIVATIONS:
    unsupported(architecture, "ModelConfig.activation", config.activation, OUR_ACTIVATIONS)
  return OUR_ACTIVATIONS[config.activation]


def rope_interleaved(rules: list[Rule], head_dim: int, rope_dim: int) -> list[Rule]:
  """`rules` with the query and key features of each head reordered for a checkpoint whose
  RoPE rotates adjacent pairs (x[2i], x[2i + 1]) of the first `rope_dim` features (GLM,
  ERNIE) where ours rotates (x[i], x[i + rope_dim / 2]): our feature i is its 2i, our
  i + rope_dim / 2 its 2i + 1. Scores q . k are unchanged by the same permutation of both."""
  order = np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)])
  order = np.concatenate([order, np.arange(rope_dim, head_dim)])  # ours[..., j] = hf[..., order[j]]
  back = np.argsort(order)

  def permuted(rule: Rule) -> Rule:
    if not rule.ours[0].endswith(("/query/kernel", "/query/bias", "/key/kernel", "/key/bias")):
      return rule
    return dataclasses.replace(
      rule,
      to_ours=lambda *x: tuple(y[..., order] for y in rule.to_ours(*x)),
      to_hf=lambda *x: rule.to_hf(*(y[..., back] for y in x)),
    )

  return [permuted(rule) for rule in rules]
