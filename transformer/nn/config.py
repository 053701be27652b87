"""The model configuration: one frozen dataclass, validated on construction.

`ModelConfig` is passed whole to every module; variants are derived with
`config.replace(...)`. Named sizes from the papers live in `sizes.NAMED_SIZES`, and
`models.param_count` / `models.flops_per_token` give analytic counts used for MFU.

This module imports only `config_rules` from the package: construction checks each field's
own rules (the option groups' in `config_rules`).
What a family, a position encoding, the ops or a fused kernel adds lives with it and is
checked by `models.check(config)` (called by `build_model` and where a run reads its
config).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformer.nn import config_rules as rules
from transformer.nn.config_rules import fail, is_number

NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post", "sandwich", "sublayer_post")
QK_NORM_OVER = ("head", "projection", "each_head")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh")
GATED_ACTIVATIONS = ("swiglu", "geglu", "geglu_tanh")
ATTENTION_IMPLS = ("xla", "jax", "chunked", "auto", "cudnn", "splash")
CONTEXT_ATTENTION = ("all_gather", "ring")  # context parallelism's attention (nn/context.py)
SPLASH_LANES = 128  # splash block sizes are multiples of the TPU lane count
DTYPES = ("float32", "bfloat16", "float16")
POOLINGS = ("cls", "mean", "cls_mean")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")

# ModelConfig fields that change how a model computes, not what it is: a run may resume or
# be evaluated with other values, and a config may set them over an `hf:` checkpoint's.
# Any other difference is a different model.
RUNTIME_FIELDS = (
  "dropout_rate",
  "attention_dropout_rate",
  "attention_impl",
  "attention_chunk_size",
  "context_attention",
  "dtype",
  "remat_policy",
)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every architectural choice of a model. Invalid combinations raise `ValueError`.

  Sizes: D = d_model, N = num_heads, K = num_kv_heads, H = head_dim (D // N unless set),
  F = d_ff (the hidden width actually used, gated or not; see `sizes.gated_hidden_size`).
  """

  family: str = "decoder"  # encoder | decoder | seq2seq | vit
  vocab_size: int = 256  # token vocabulary (shared by source and target in seq2seq)
  d_model: int = 128  # residual stream width D
  num_heads: int = 4  # query heads N
  num_kv_heads: int | None = None  # key/value heads K (None = N: MHA; 1: MQA; else GQA)
  attention_head_dim: int | None = None  # H when not D // N (T5 v1.1 small: D 512, N 6, H 64)
  num_layers: int = 2  # encoder layers, or decoder layers for decoder-only / ViT
  num_decoder_layers: int | None = None  # seq2seq decoder layers (None = num_layers)
  d_ff: int = 512  # feed-forward hidden width F
  max_len: int = 256  # longest sequence (learned positions, caches, validation)
  position: str = (
    "learned"  # sinusoidal | learned | rope | alibi | relative_t5 | relative_shaw | none
  )
  rope_theta: float = 10_000.0  # RoPE base wavelength
  rope_fraction: float = 1.0  # RoPE on the first int(H * this) features of each head, the
  # rest unrotated (GPT-NeoX / Pythia `rotary_pct` 0.25, Phi-4-mini 0.75)
  # RoPE frequencies stretched for a longer context than pretraining's (`positions/rope.py`):
  rope_scaling: str = "none"  # none | linear (positions / factor) | llama3 (Llama 3.1+) | yarn
  rope_scaling_factor: float = 1.0  # linear, llama3, yarn: how many times longer the context is
  rope_low_freq_factor: float = 1.0  # llama3: wavelengths over L / this are divided by factor
  rope_high_freq_factor: float = 4.0  # llama3: wavelengths under L / this are kept
  rope_original_max_len: int = 8192  # llama3, yarn: L, the pretraining context
  rope_beta_fast: float = 32.0  # yarn: dims turning more than this often in L are kept
  rope_beta_slow: float = 1.0  # yarn: dims turning less than this often in L are interpolated
  rope_truncate: bool = True  # yarn: the ramp's ends rounded to whole dims (gpt-oss: False)
  rope_attention_factor: float | None = None  # yarn: q, k scaled by it; None = 0.1 ln(s) + 1
  relative_num_buckets: int = 32  # T5 relative-position buckets
  relative_max_distance: int = 128  # T5: distances beyond this share the last bucket
  shaw_max_distance: int = 16  # Shaw et al.: relative distances clipped to [-k, k]
  norm: str = "layernorm"  # layernorm | rmsnorm
  norm_position: str = "pre"  # pre (pre-LN, final norm) | post (post-LN, Vaswani et al.) |
  # sandwich (x + norm2(f(norm1(x))), final norm: Gemma 2 / 3) | sublayer_post (x + norm(f(x)),
  # final norm: OLMo 2, Swin v2's res-post-norm)
  norm_eps: float = 1e-5  # epsilon inside the norm
  parallel_residual: bool = False  # pre-LN x + attn(norm1(x)) + ffn(norm2(x)) (GPT-NeoX, GPT-J)
  parallel_shared_norm: bool = False  # parallel_residual with one norm: x + attn(n(x)) + ffn(n(x))
  # (Cohere, StableLM)
  norm_scale_plus_one: bool = False  # RMSNorm multiplies by (1 + scale), scale init 0 (Gemma)
  norm_bias: bool = True  # LayerNorm with a bias (False: scale only, ModernBERT's norm_bias)
  embed_norm: bool = False  # encoder: a norm after the embeddings also when not post-LN
  # (ModernBERT; post-LN encoders always have one); seq2seq: a norm after each stack's token +
  # position embeddings (BART's layernorm_embedding)
  first_layer_attention_norm: bool = True  # False: layer 0's attention reads its input un-normed
  # (pre-LN; ModernBERT, whose embeddings are normed already)
  activation: str = "gelu"  # relu | gelu | gelu_tanh (GPT-2) | silu (Marian) | swiglu | geglu |
  # geglu_tanh (T5)
  use_bias: bool = True  # biases in attention and feed-forward projections
  qkv_bias: bool | None = None  # biases on query/key/value only (Qwen2: True); None = use_bias
  qk_norm: bool = False  # RMSNorm of each query / key head over H (scale [H]), before RoPE
  qk_norm_over: str = "head"  # head (over H, Qwen3) | projection (over all N*H, OLMo 2) |
  # each_head (a LayerNorm without bias over H, each head its own scale: StableLM 2)
  dropout_rate: float = 0.0  # dropout on embeddings and residual branches
  attention_dropout_rate: float = 0.0  # dropout on attention weights
  tie_embeddings: bool = True  # logits through the input embedding (`Embed.attend`)
  scale_logits: bool = False  # LM output hidden state * D**-0.5 before the logits (T5 v1.0)
  scale_embeddings: bool = False  # multiply token embeddings by sqrt(D) (Vaswani et al.)
  embedding_multiplier: float = 1.0  # token embeddings times this (Granite)
  residual_multiplier: float = 1.0  # each residual branch times this before the add (Granite)
  logits_multiplier: float = 1.0  # LM logits times this (Granite: 1 / logits_scaling)
  sinusoidal_layout: str = "interleaved"  # sinusoidal: sin, cos features interleaved
  # (Vaswani et al.) | split (sines in the first half, cosines in the second: Marian)
  final_logits_bias: bool = False  # seq2seq: a learned [V] bias added to the logits (BART)
  decoder_start_id: int = 0  # seq2seq: the decoder's first input (T5, Marian: PAD 0; BART: EOS)
  type_vocab_size: int = 0  # encoder segment (token type) embeddings; 0 = none
  num_classes: int = 0  # classifier classes (encoder classification, ViT)
  image_size: int = 224  # ViT input height = width in pixels
  patch_size: int = 16  # ViT square patch side in pixels
  num_channels: int = 3  # ViT input channels
  pooling: str = "cls"  # ViT / classifier pooling: cls token, mean over positions, or
  # cls_mean (ViT only: concat([CLS], mean of the patch tokens), DINOv2's head)
  head_bias: bool = True  # encoder heads: a bias on the MLM transform / pooler dense layer
  mlm_output_bias: bool = True  # MLM logits + a learned [V] bias (ModernBERT: decoder_bias)
  pooler_activation: str = "tanh"  # after the pooler's dense: tanh (BERT) | gelu_norm (GELU,
  # then a norm 'pooler_norm': ModernBERT's classifier head)
  vit_distillation_token: bool = False  # DeiT: a second learned token after [CLS] with its
  # own head; the logits are the mean of the two heads' (Touvron et al. 2021)
  layer_scale_init: float | None = None  # each residual branch times a learned [D] vector
  # initialised to this, before the add (CaiT, DINOv2 `layerscale_value`); None = off
  attention_impl: str = "auto"  # auto (backend's best) | xla | jax | chunked | cudnn | splash
  attention_chunk_size: int = 512  # query/key block size of the chunked implementation
  context_attention: str = "all_gather"  # under a mesh with context > 1 (nn/context.py):
  # all_gather (each device gathers the whole K/V) | ring (K/V passed around, zig-zag causal)
  splash_block_q: int = 512  # splash attention query block (TPU; a multiple of 128)
  splash_block_kv: int = 512  # splash attention key/value block (TPU; a multiple of 128)
  attention_scale: float | None = None  # score multiplier; None = H**-0.5 (T5: 1.0, unscaled)
  attention_scale_by_layer: bool = False  # layer i's scores also / (i + 1) (GPT-2's
  # scale_attn_by_inverse_layer_idx)
  sliding_window: int | None = None  # local attention: a query sees keys within this distance
  local_global_pattern: str = ""  # per layer, cyclically: L = local (sliding_window), G =
  # global (full) attention; "" = every layer local if sliding_window is set (Gemma 2: "LG")
  rope_local_theta: float | None = None  # RoPE base of the local layers, unscaled (Gemma 3)
  rope_pattern: str = ""  # per layer, cyclically: R = the model's RoPE, N = no position
  # encoding (NoPE; SmolLM3: "RRRN"); "" = every layer R
  attention_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2: 50)
  logits_softcap: float | None = None  # decoder logits -> cap * tanh(logits / cap) (Gemma 2: 30)
  dtype: str = "float32"  # compute dtype; parameters stay float32
  scan_layers: bool = False  # nn.scan over layers (compile time flat in depth)
  remat_policy: str = "none"  # none | full | dots | dots_no_batch (nn.remat per layer)
  ops: str = "fast"  # fast (transformer.ops kernels for XLA:CPU) | plain (flax / lax ops)
  # Multi-head latent attention (`mla.py`, DeepSeek-V2/V3): keys and values from a shared
  # low-rank latent; head_dim is the unrotated part of each query and key head.
  mla_kv_rank: int = 0  # rank C of the key-value latent; 0 = ordinary attention (`attention.py`)
  mla_q_rank: int = 0  # rank of the queries' low-rank projection; 0 = one full projection
  mla_rope_dim: int = 64  # features R of each query head and of the one shared key that rotate
  mla_v_dim: int = 0  # value head dim; 0 = head_dim
  # Mixture of experts (`moe.py`): the FFN of every moe_every-th layer becomes E experts.
  moe_experts: int = 0  # experts E per MoE layer; 0 = dense feed-forward everywhere
  moe_top_k: int = 2  # experts per token: 1 = Switch, 2 = GShard / Mixtral
  moe_norm_topk: bool | None = None  # gates: the top-k probabilities renormalised to sum to 1
  # (True, Mixtral), as they are (False, Qwen3-MoE's norm_topk_prob=False); None = top_k > 1
  moe_router: str = "softmax"  # softmax over the experts | sigmoid of each (DeepSeek-V3)
  moe_selection_bias: bool = False  # a [E] bias on the scores for the choice only, no gradient
  # (DeepSeek-V3's e_score_correction_bias; its update rule is not implemented)
  moe_groups: int = 1  # experts in G equal groups; a token chooses within the top groups
  moe_top_groups: int = 1  # of moe_groups, ranked by their two best scores (DeepSeek-V3)
  moe_routed_scale: float = 1.0  # the routed experts' gates times this (routed_scaling_factor)
  moe_shared_d_ff: int = 0  # hidden width of a shared expert every token also goes through
  # (Qwen2-MoE, DeepSeek); 0 = none
  moe_shared_gate: bool = False  # the shared expert's output times sigmoid(x w), w [D] (Qwen2-MoE)
  moe_d_ff: int = 0  # each routed expert's hidden width; 0 = d_ff (DeepSeek-V3's experts are
  # narrower than its dense layers: moe_intermediate_size)
  moe_first_dense: int = 0  # the first layers of each stack keep the dense FFN, d_ff wide
  # (DeepSeek-V3's first_k_dense_replace)
  moe_every: int = 1  # layers moe_every-1, 2*moe_every-1, ... of each stack are MoE
  moe_capacity_factor: float | None = None  # slots ceil(f*K*T/E) per expert and row, tokens
  # beyond dropped (GShard order); None = dropless (jax.lax.ragged_dot)
  moe_balance_loss: float = 0.01  # weight of E * sum_i f_i P_i per MoE layer (Switch)
  moe_router_z_loss: float = 0.001  # weight of mean(logsumexp(logits)^2) per layer (ST-MoE)
  # LoRA (`lora.py`, Hu et al. 2021): y = W x + alpha/r B A x on the matching projections.
  lora_rank: int = 0  # adapter rank r; 0 = no adapters
  lora_alpha: float = 16.0  # the adapter's output is scaled by alpha / r
  lora_targets: tuple[str, ...] = ("query", "value")  # regexes on projection paths (re.search)
  lora_trainable: tuple[str, ...] = ("^(pooler|classifier|head|distillation_head)/",)  # regexes
  # trained fully beside the adapters (new heads); every other base weight is frozen

  def __post_init__(self):
    for field in ("lora_targets", "lora_trainable"):  # JSON gives lists
      if isinstance(getattr(self, field), list):
        object.__setattr__(self, field, tuple(getattr(self, field)))
    _validate(self)

  def replace(self, **changes: Any) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @property
  def head_dim(self) -> int:
    return self.attention_head_dim or self.d_model // self.num_heads

  @property
  def rope_dim(self) -> int:
    """Features of each query / key head that RoPE rotates (the first ones)."""
    return int(self.head_dim * self.rope_fraction)

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  @property
  def qkv_biases(self) -> bool:
    """Whether the query, key and value projections have biases."""
    return self.use_bias if self.qkv_bias is None else self.qkv_bias

  @property
  def gated(self) -> bool:
    return self.activation in GATED_ACTIVATIONS

  def is_global_layer(self, index: int) -> bool:
    """Whether layer `index` (0-based, within its stack) attends globally, without the
    window, as `local_global_pattern` says (no pattern: local iff sliding_window is set)."""
    pattern = self.local_global_pattern
    if not pattern:
      return self.sliding_window is None
    return pattern[index % len(pattern)] == "G"

  def layer_config(self, index: int) -> ModelConfig:
    """The config layer `index` computes with: a global layer has no window, a local one
    the local RoPE base (unscaled) when `rope_local_theta` is set; its score scale divided
    by index + 1 with `attention_scale_by_layer`; a NoPE layer of `rope_pattern` no
    position encoding."""
    c = self
    if c.rope_pattern:
      nope = c.rope_pattern[index % len(c.rope_pattern)] == "N"
      none = dict(position="none", rope_scaling="none", rope_local_theta=None)
      c = c.replace(rope_pattern="", **(none if nope else {}))
    if c.attention_scale_by_layer:  # GPT-2: layer i's scores scaled by 1 / (i + 1) more
      base = c.head_dim**-0.5 if c.attention_scale is None else c.attention_scale
      c = c.replace(attention_scale=base / (index + 1), attention_scale_by_layer=False)
    if not c.local_global_pattern:
      return c
    if c.is_global_layer(index):
      return c.replace(sliding_window=None, local_global_pattern="", rope_local_theta=None)
    if c.rope_local_theta is None:
      return c.replace(local_global_pattern="")
    local_rope = dict(rope_theta=c.rope_local_theta, rope_scaling="none")
    return c.replace(local_global_pattern="", rope_local_theta=None, **local_rope)

  @property
  def mla_value_dim(self) -> int:
    """The value head dim of latent attention."""
    return self.mla_v_dim or self.head_dim

  @property
  def expert_d_ff(self) -> int:
    """The hidden width of each routed expert."""
    return self.moe_d_ff or self.d_ff

  def is_moe_layer(self, index: int) -> bool:
    """Whether layer `index` (0-based, within its stack) has a mixture-of-experts FFN: past
    the first `moe_first_dense`, every `moe_every`-th."""
    sparse = index >= self.moe_first_dense and (index + 1) % self.moe_every == 0
    return self.moe_experts > 0 and sparse


def _validate(c: ModelConfig) -> None:
  for field, options in (
    ("norm", NORMS),
    ("norm_position", NORM_POSITIONS),
    ("activation", ACTIVATIONS),
    ("attention_impl", ATTENTION_IMPLS),
    ("context_attention", CONTEXT_ATTENTION),
    ("dtype", DTYPES),
    ("pooling", POOLINGS),
    ("remat_policy", REMAT_POLICIES),
    ("qk_norm_over", QK_NORM_OVER),
  ):
    value = getattr(c, field)
    if not isinstance(value, str) or value not in options:
      fail(field, value, f"must be one of {', '.join(options)}")
  for field in ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_len"):
    value = getattr(c, field)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      fail(field, value, "must be a positive integer")
  for field in ("num_kv_heads", "num_decoder_layers", "sliding_window", "attention_head_dim"):
    value = getattr(c, field)
    if value is not None and (not isinstance(value, int) or value <= 0):
      fail(field, value, "must be a positive integer or None")
  for field in ("type_vocab_size", "num_classes"):
    if getattr(c, field) < 0:
      fail(field, getattr(c, field), "must be >= 0")
  for field in ("dropout_rate", "attention_dropout_rate"):
    value = getattr(c, field)
    if not 0.0 <= value < 1.0:
      fail(field, value, "must be in [0, 1)")
  if c.qkv_bias is not None and not isinstance(c.qkv_bias, bool):
    fail("qkv_bias", c.qkv_bias, "must be True, False or None (= use_bias)")
  for field in ("qk_norm", "norm_scale_plus_one", "parallel_residual", "parallel_shared_norm"):
    if not isinstance(getattr(c, field), bool):
      fail(field, getattr(c, field), "must be True or False")
  if c.parallel_residual and c.norm_position != "pre":
    fail("parallel_residual", True, f"needs norm_position='pre', got {c.norm_position!r}")
  if c.parallel_shared_norm and not c.parallel_residual:
    fail("parallel_shared_norm", True, "needs parallel_residual=True")
  if c.norm_scale_plus_one and c.norm != "rmsnorm":
    fail("norm_scale_plus_one", True, f"needs norm='rmsnorm', got {c.norm!r}")
  if c.norm_eps <= 0:
    fail("norm_eps", c.norm_eps, "must be > 0")
  if c.attention_head_dim is None and c.d_model % c.num_heads:
    fail("d_model", c.d_model, f"must be divisible by num_heads={c.num_heads}")
  if c.num_heads % c.kv_heads:
    fail("num_kv_heads", c.num_kv_heads, f"must divide num_heads={c.num_heads}")
  if c.rope_theta <= 0:
    fail("rope_theta", c.rope_theta, "must be > 0")
  if not (is_number(c.rope_fraction) and 0 < c.rope_fraction <= 1):
    fail("rope_fraction", c.rope_fraction, "must be in (0, 1]")
  rules.validate_rope_scaling(c)
  if c.attention_chunk_size <= 0:
    fail("attention_chunk_size", c.attention_chunk_size, "must be > 0")
  for field in ("splash_block_q", "splash_block_kv"):
    value = getattr(c, field)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % SPLASH_LANES:
      fail(field, value, f"must be a positive multiple of {SPLASH_LANES}")
  if c.attention_scale is not None and not c.attention_scale > 0:
    fail("attention_scale", c.attention_scale, "must be > 0 or None (H**-0.5)")
  rules.validate_layer_pattern(c)
  rules.validate_moe(c)
  rules.validate_mla(c)
  rules.validate_lora(c)
  rules.validate_vision(c)
  rules.validate_seq2seq(c)
  rules.validate_norms_and_heads(c)
