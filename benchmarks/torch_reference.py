"""The benchmark models written plainly in PyTorch, trained eager or under `torch.compile`.

  python benchmarks/torch_reference.py [--workload gpt bert seq2seq vit] [--steps 10]

Same sizes and recipe as our workloads (`train_step.WORKLOADS`): pre-LN blocks, exact
GELU, learned positions, dropout 0.1 on embeddings, residual branches, feed-forward hidden
units and attention weights, tied output embeddings, label smoothing 0.1 (`F.cross_entropy`),
AdamW (3e-4, betas 0.9/0.98, eps 1e-9, weight decay 1e-4), gradient clipping at global
norm 1.0. Attention is `F.scaled_dot_product_attention` with one fused QKV projection (the
nanoGPT layout). The batches are the same NumPy arrays our step gets (no padding, so no
masks beyond causality). `torch.set_num_threads` is the core count.

`TorchStep(workload, compiled)` builds the model and optimizer; `step()` runs one update.
Eager mode uses the fused CPU AdamW. Compiled mode wraps the model in `torch.compile`
(default mode, Inductor) and the optimizer step in its own `torch.compile` (PyTorch's
recipe for compiled optimizers), with `torch._inductor.config.fallback_random = True`:
Inductor's own CPU random-number code made the compiled GPT step 2x slower than eager
here (dropout masks drawn element by element), ATen's `bernoulli_` does not.

Settings that favour PyTorch on this shared 2-core machine, applied by `configure()`
before torch is imported: `OMP_WAIT_POLICY=PASSIVE` (with the default spin-waiting, a
2-thread eager GPT step took 5.5 s instead of 2.8 s whenever other processes ran).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def configure() -> None:
  """Process settings for PyTorch on a shared CPU; call before importing torch."""
  os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


configure()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from train_step import (  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
  B2,
  CLIP,
  EPS,
  LABEL_SMOOTHING,
  LEARNING_RATE,
  WEIGHT_DECAY,
  WORKLOADS,
  Workload,
  make_batch,
)

from transformer.train.machine import cpu_isa  # noqa: E402


class Attention(nn.Module):
  """Multi-head self- (fused QKV) or cross-attention (Q from x, fused KV from memory)."""

  def __init__(self, d: int, heads: int, dropout: float, cross: bool = False):
    super().__init__()
    self.heads, self.dropout, self.cross = heads, dropout, cross
    if cross:
      self.q, self.kv = nn.Linear(d, d), nn.Linear(d, 2 * d)
    else:
      self.qkv = nn.Linear(d, 3 * d)
    self.out = nn.Linear(d, d)

  def forward(self, x, memory=None, causal=False):
    b, t, d = x.shape
    if self.cross:
      q, (k, v) = self.q(x), self.kv(memory).chunk(2, dim=-1)
    else:
      q, k, v = self.qkv(x).chunk(3, dim=-1)
    q, k, v = (z.reshape(b, -1, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
    p = self.dropout if self.training else 0.0
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)  # [B, N, T, H]
    return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
  """Pre-LN: x + drop(attn(ln(x))) [+ drop(cross(ln(x), memory))] + drop(ffn(ln(x)))."""

  def __init__(self, d, heads, d_ff, dropout, eps, cross=False):
    super().__init__()
    self.ln1, self.attn = nn.LayerNorm(d, eps=eps), Attention(d, heads, dropout)
    self.cross = cross
    if cross:
      self.ln2, self.cross_attn = nn.LayerNorm(d, eps=eps), Attention(d, heads, dropout, True)
    self.ln3 = nn.LayerNorm(d, eps=eps)
    self.ffn = nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d))
    self.drop = nn.Dropout(dropout)

  def forward(self, x, memory=None, causal=False):
    x = x + self.drop(self.attn(self.ln1(x), causal=causal))
    if self.cross:
      x = x + self.drop(self.cross_attn(self.ln2(x), memory))
    return x + self.drop(self.ffn(self.ln3(x)))


class Stack(nn.Module):
  def __init__(self, c, layers, cross=False):
    super().__init__()
    args = (c.d_model, c.num_heads, c.d_ff, c.dropout_rate, c.norm_eps, cross)
    self.blocks = nn.ModuleList([Block(*args) for _ in range(layers)])
    self.ln = nn.LayerNorm(c.d_model, eps=c.norm_eps)

  def forward(self, x, memory=None, causal=False):
    for block in self.blocks:
      x = block(x, memory, causal)
    return self.ln(x)


class Embedding(nn.Module):
  """Token + learned position embeddings, then dropout. Tokens share `tokens` (tied)."""

  def __init__(self, c, tokens: nn.Embedding):
    super().__init__()
    self.tokens, self.positions = tokens, nn.Embedding(c.max_len, c.d_model)
    self.drop = nn.Dropout(c.dropout_rate)

  def forward(self, ids):
    pos = torch.arange(ids.shape[1], device=ids.device)
    return self.drop(self.tokens(ids) + self.positions(pos))


class GPT(nn.Module):
  def __init__(self, c):
    super().__init__()
    self.tokens = nn.Embedding(c.vocab_size, c.d_model)
    self.embed, self.body = Embedding(c, self.tokens), Stack(c, c.num_layers)

  def forward(self, inputs):
    return self.body(self.embed(inputs), causal=True) @ self.tokens.weight.T  # [B, T, V]


class BertMLM(nn.Module):
  """Bidirectional encoder; MLM head: dense, GELU, LayerNorm, tied logits + bias."""

  def __init__(self, c):
    super().__init__()
    self.tokens = nn.Embedding(c.vocab_size, c.d_model)
    self.embed, self.body = Embedding(c, self.tokens), Stack(c, c.num_layers)
    self.transform = nn.Linear(c.d_model, c.d_model)
    self.ln = nn.LayerNorm(c.d_model, eps=c.norm_eps)
    self.bias = nn.Parameter(torch.zeros(c.vocab_size))

  def forward(self, inputs, predict):
    x = self.body(self.embed(inputs))  # [B, T, D]
    x = torch.gather(x, 1, predict[..., None].expand(-1, -1, x.shape[-1]))  # [B, P, D]
    x = self.ln(F.gelu(self.transform(x)))
    return x @ self.tokens.weight.T + self.bias  # [B, P, V]


class Seq2Seq(nn.Module):
  """Encoder and decoder stacks sharing one token table (also the output layer)."""

  def __init__(self, c):
    super().__init__()
    self.tokens = nn.Embedding(c.vocab_size, c.d_model)
    self.src_embed, self.tgt_embed = Embedding(c, self.tokens), Embedding(c, self.tokens)
    self.encoder = Stack(c, c.num_layers)
    self.decoder = Stack(c, c.decoder_layers, cross=True)

  def forward(self, inputs, decoder_inputs):
    memory = self.encoder(self.src_embed(inputs))
    x = self.decoder(self.tgt_embed(decoder_inputs), memory, causal=True)
    return x @ self.tokens.weight.T  # [B, T, V]


class ViT(nn.Module):
  """Conv patch embedding, [CLS], learned positions, encoder, classifier on [CLS]."""

  def __init__(self, c):
    super().__init__()
    d = c.d_model
    self.patch = nn.Conv2d(c.num_channels, d, c.patch_size, stride=c.patch_size)
    self.cls = nn.Parameter(torch.zeros(1, 1, d))
    self.pos = nn.Parameter(0.02 * torch.randn(1, c.num_patches + 1, d))
    self.drop = nn.Dropout(c.dropout_rate)
    self.body = Stack(c, c.num_layers)
    self.head = nn.Linear(d, c.num_classes)

  def forward(self, images):  # [B, C, H, W]
    x = self.patch(images).flatten(2).transpose(1, 2)  # [B, P, D]
    x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
    return self.head(self.body(self.drop(x))[:, 0])  # [B, classes]


def build(w: Workload) -> nn.Module:
  return {"lm": GPT, "mlm": BertMLM, "seq2seq": Seq2Seq, "image": ViT}[w.kind](w.model)


def to_torch(w: Workload, batch: dict[str, np.ndarray]) -> tuple[tuple, torch.Tensor]:
  """Our batch -> (model inputs, targets) with ignored positions at -100."""
  if w.kind == "image":
    images = torch.from_numpy(batch["image"]).permute(0, 3, 1, 2).contiguous()  # NCHW
    return (images,), torch.from_numpy(batch["label"]).long()
  targets = torch.from_numpy(batch["targets"]).long()
  targets = torch.where(torch.from_numpy(batch["weights"]) > 0, targets, -100)
  if w.kind == "mlm":  # the head runs on the scored positions only, as ours
    predict = np.argsort(batch["weights"] <= 0, axis=-1, kind="stable")[:, : w.mlm_predictions]
    predict = torch.from_numpy(predict).long()
    inputs = torch.from_numpy(batch["inputs"]).long()
    return (inputs, predict), torch.gather(targets, 1, predict)
  if w.kind == "seq2seq":  # decoder inputs: targets shifted right, 0 first
    shifted = torch.from_numpy(np.pad(batch["targets"], ((0, 0), (1, 0)))[:, :-1]).long()
    return (torch.from_numpy(batch["inputs"]).long(), shifted), targets
  return (torch.from_numpy(batch["inputs"]).long(),), targets


def _to_device(example: tuple[tuple, torch.Tensor], device: str) -> tuple[tuple, torch.Tensor]:
  inputs, targets = example
  return tuple(x.to(device) for x in inputs), targets.to(device)


class TorchStep:
  """The PyTorch train step of a workload, eager (SDPA) or under torch.compile."""

  def __init__(
    self,
    w: Workload,
    compiled: bool,
    num_batches: int = 4,
    seed: int = 0,
    device: str = "cpu",
    autocast_dtype: torch.dtype | None = None,
  ):
    """device: 'cpu' or 'cuda'; autocast_dtype: e.g. torch.bfloat16 for mixed precision
    (float32 master weights, as ours)."""
    torch.manual_seed(seed)
    self.w, self.model = w, build(w).train().to(device)
    self.device, self.autocast_dtype = device, autocast_dtype
    self.opt = torch.optim.AdamW(
      self.model.parameters(),
      lr=LEARNING_RATE,
      betas=(0.9, B2),
      eps=EPS,
      weight_decay=WEIGHT_DECAY,
      **(dict(foreach=True) if compiled else dict(fused=True)),
    )
    rng = np.random.default_rng(seed)
    self.batches = [_to_device(to_torch(w, make_batch(w, rng)), device) for _ in range(num_batches)]
    self.forward, self.update = self.model, self._update
    if compiled:
      from torch._inductor import config as inductor_config

      inductor_config.fallback_random = True
      self.forward, self.update = torch.compile(self.model), torch.compile(self._update)
    self.i = 0

  def _update(self):
    torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP, foreach=True)
    self.opt.step()

  def step(self) -> float:
    inputs, targets = self.batches[self.i % len(self.batches)]
    self.i += 1
    with torch.autocast(
      self.device, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None
    ):
      logits = self.forward(*inputs)
    loss = F.cross_entropy(
      logits.float().reshape(-1, logits.shape[-1]),
      targets.reshape(-1),
      label_smoothing=LABEL_SMOOTHING,
    )
    self.opt.zero_grad(set_to_none=True)
    loss.backward()
    self.update()
    return loss.item()


def main():
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--workload", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=2)
  args = parser.parse_args()
  torch.set_num_threads(os.cpu_count())
  print(f"CPU: {cpu_isa()}")
  print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
  print("| workload | mode | first step (s) | step (ms) | tokens/s |\n|---|---|---|---|---|")
  for name in args.workload:
    w = WORKLOADS[name]
    for compiled in (False, True):
      s = TorchStep(w, compiled)
      t = time.perf_counter()
      s.step()
      first = time.perf_counter() - t
      for _ in range(args.warmup):
        s.step()
      times = []
      for _ in range(args.steps):
        t = time.perf_counter()
        s.step()
        times.append(time.perf_counter() - t)
      step = statistics.median(times)
      mode, tps = ("compile" if compiled else "eager"), w.tokens_per_step / step
      print(f"| {name} | {mode} | {first:.1f} | {1e3 * step:.0f} | {tps:,.0f} |")


if __name__ == "__main__":
  main()
