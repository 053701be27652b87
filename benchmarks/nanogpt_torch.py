"""nanoGPT's `train.py` on the CPU shakespeare_char recipe, re-implemented in one PyTorch file.

  python benchmarks/nanogpt_torch.py                        # the recipe below, ~2-4 min
  python benchmarks/nanogpt_torch.py --max-iters 20 --eval-interval 10 --eval-iters 2
  python benchmarks/nanogpt_torch.py --out evals.jsonl --full-val

The run of Andrej Karpathy's nanoGPT (github.com/karpathy/nanoGPT) that its README gives for
a CPU, written out here because the machine has no network:

  python train.py config/train_shakespeare_char.py --device=cpu --compile=False \
    --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 \
    --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

What is reproduced, piece by piece (nanoGPT's names):
- Data (`data/shakespeare_char/prepare.py`): the shipped `data/tinyshakespeare.txt.gz`;
  vocabulary = the sorted set of the text's characters (65); the first int(0.9 n)
  characters are train, the rest (111,540) validation; written as uint16 `train.bin` /
  `val.bin` to a temporary folder, and `get_batch` opens them with `np.memmap` on every
  call, as nanoGPT does. This preparation runs inside the timed region (about 0.2 s).
- `get_batch`: ix = torch.randint(len(data) - block_size, (batch_size,)); x = data[i:i+64],
  y = data[i+1:i+65], int64. The first training batch is drawn before the loop and the next
  one right after each forward pass, as nanoGPT does (so the random stream is the same).
- Model (`model.py`, bias=False): token + learned position embeddings (wte, wpe), dropout
  0, n_layer pre-LN blocks (LayerNorm without bias, eps 1e-5), attention with one fused
  c_attn Linear(n_embd, 3 n_embd) and `F.scaled_dot_product_attention(is_causal=True)`,
  c_proj; MLP c_fc (4x), exact GELU, c_proj; ln_f; lm_head tied to wte. Init normal(0, 0.02)
  for Linear and Embedding weights, every c_proj.weight normal(0, 0.02 / sqrt(2 n_layer)).
- `configure_optimizers`: AdamW lr 1e-3, betas (0.9, 0.99), eps 1e-8, weight decay 0.1 on
  the tensors with dim >= 2 (all matmul weights and both embeddings), 0 on the rest (the
  LayerNorm weights); not fused (nanoGPT fuses on CUDA only), PyTorch's default for-loop
  implementation on the CPU. Gradient clipping at global norm 1.0, no accumulation.
- `get_lr`: linear warmup lr (it + 1) / (warmup_iters + 1) for 100 iterations, then cosine
  decay to min_lr 1e-4 at lr_decay_iters, min_lr after.
- The loop: set the lr; every eval_interval (250) iterations `estimate_loss()` (eval mode,
  eval_iters=20 random batches per split, mean loss) and a checkpoint (model + optimizer
  state, `torch.save`) whenever the validation loss improved after iteration 0
  (always_save_checkpoint=False in that config); forward, backward, clip, step,
  zero_grad(set_to_none=True); the loss printed every log_interval (1) iterations with
  nanoGPT's MFU estimate; stop once iter_num > max_iters. So 2,001 updates, evaluations at
  0, 250, ..., 2000.
- float32 throughout: on the CPU nanoGPT's autocast context is `nullcontext()` and its
  GradScaler disables itself (no CUDA), so both are left out. torch.manual_seed(1337), no
  torch.compile, `torch.backends` left at their defaults,
  torch.set_num_threads(os.cpu_count()).

Timing: `wall_s` of an evaluation record is seconds since this script's first statement (a
`time.perf_counter()` taken before any import), so the import of torch (1-3 s) and the data
preparation are included; the Python interpreter's own start-up (tens of ms) is not.
`OMP_WAIT_POLICY=PASSIVE` is set before torch is imported, as `torch_reference.py` does:
with OpenMP's default spin-waiting, PyTorch steps on this shared 2-core machine took about
twice as long whenever other processes ran.

Output: one line per evaluation, as nanoGPT prints it plus the wall time; `--out FILE`
writes the records {"iter", "train_loss", "val_loss", "wall_s"} as JSON lines (each flushed
when written) and a last line {"train_wall_s": end of the training loop[, "full_val_loss"]}.
`run(...)` returns the list of evaluation records.

`--full-val` (after training, outside the timed region): the loss over the whole
validation split of N = 111,540 characters, each predicted with the context since the
start of its 64-character window: for s = 0, 64, 128, ... < N - 1 the inputs are
val[s : s+64] and the targets val[s+1 : s+65] (the last window shorter), so every
character but the first is predicted once; the mean cross-entropy over those N - 1 =
111,539 predictions is `full_val_loss`. Our train.py evaluates its validation split the
same way (configs/lm_shakespeare.py, eval_batches = 0; its split starts at the next line
start, 2 characters later, so 111,538 characters and 111,537 predictions).
"""

import time

START = time.perf_counter()  # the clock of every wall_s (torch's import included)

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from transformer.train.machine import cpu_isa  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = os.path.join(REPO, "data", "tinyshakespeare.txt.gz")


# ----------------------------------------------------------------------------- data


def prepare(data_dir: str, path: str = TEXT) -> int:
  """nanoGPT's shakespeare_char/prepare.py: train.bin / val.bin in data_dir; the vocab size."""
  with gzip.open(path, "rt", encoding="utf-8") as f:
    data = f.read()
  chars = sorted(set(data))
  stoi = {ch: i for i, ch in enumerate(chars)}
  n = len(data)
  train_data, val_data = data[: int(n * 0.9)], data[int(n * 0.9) :]
  for name, text in (("train.bin", train_data), ("val.bin", val_data)):
    np.array([stoi[c] for c in text], dtype=np.uint16).tofile(os.path.join(data_dir, name))
  return len(chars)


def get_batch(data_dir: str, split: str, block_size: int, batch_size: int):
  """nanoGPT's get_batch: batch_size random windows of split ('train' or 'val')."""
  # nanoGPT recreates the memmap on every call (to avoid a memory leak); so does this.
  data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
  ix = torch.randint(len(data) - block_size, (batch_size,))
  x = torch.stack([torch.from_numpy((data[i : i + block_size]).astype(np.int64)) for i in ix])
  y = torch.stack(
    [torch.from_numpy((data[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix]
  )
  return x, y


# ----------------------------------------------------------------------------- model


@dataclass
class GPTConfig:
  block_size: int = 64
  vocab_size: int = 65
  n_layer: int = 4
  n_head: int = 4
  n_embd: int = 128
  dropout: float = 0.0
  bias: bool = False  # nanoGPT's default: no biases in Linears and LayerNorms


class LayerNorm(nn.Module):
  """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

  def __init__(self, ndim: int, bias: bool):
    super().__init__()
    self.weight = nn.Parameter(torch.ones(ndim))
    self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

  def forward(self, x):
    return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
  def __init__(self, config: GPTConfig):
    super().__init__()
    assert config.n_embd % config.n_head == 0
    self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # fused QKV
    self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
    self.attn_dropout = nn.Dropout(config.dropout)
    self.resid_dropout = nn.Dropout(config.dropout)
    self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

  def forward(self, x):
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # [B, nh, T, hs]
    q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
    v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
    y = F.scaled_dot_product_attention(
      q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
    )
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
  def __init__(self, config: GPTConfig):
    super().__init__()
    self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
    self.gelu = nn.GELU()  # exact (erf) GELU
    self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
    self.dropout = nn.Dropout(config.dropout)

  def forward(self, x):
    return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
  """Pre-LN: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

  def __init__(self, config: GPTConfig):
    super().__init__()
    self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
    self.attn = CausalSelfAttention(config)
    self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
    self.mlp = MLP(config)

  def forward(self, x):
    x = x + self.attn(self.ln_1(x))
    return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
  """nanoGPT's GPT, built and initialized in the same order (so the same random numbers)."""

  def __init__(self, config: GPTConfig):
    super().__init__()
    self.config = config
    self.transformer = nn.ModuleDict(
      dict(
        wte=nn.Embedding(config.vocab_size, config.n_embd),
        wpe=nn.Embedding(config.block_size, config.n_embd),
        drop=nn.Dropout(config.dropout),
        h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
        ln_f=LayerNorm(config.n_embd, bias=config.bias),
      )
    )
    self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
    self.transformer.wte.weight = self.lm_head.weight  # weight tying
    self.apply(self._init_weights)
    for pn, p in self.named_parameters():  # scaled init of the residual projections (GPT-2)
      if pn.endswith("c_proj.weight"):
        torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
    print(f"number of parameters: {self.get_num_params() / 1e6:.2f}M")

  def get_num_params(self, non_embedding: bool = True) -> int:
    """Parameters (the tied wte counted once); nanoGPT leaves out the position table."""
    n_params = sum(p.numel() for p in self.parameters())
    if non_embedding:
      n_params -= self.transformer.wpe.weight.numel()
    return n_params

  def _init_weights(self, module):
    if isinstance(module, nn.Linear):
      torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
      if module.bias is not None:
        torch.nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
      torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

  def forward(self, idx, targets=None):
    b, t = idx.size()
    assert t <= self.config.block_size, f"sequence of {t} > block size {self.config.block_size}"
    pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
    x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
    for block in self.transformer.h:
      x = block(x)
    x = self.transformer.ln_f(x)
    if targets is None:  # inference: the last position only
      return self.lm_head(x[:, [-1], :]), None
    logits = self.lm_head(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
    return logits, loss

  def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
    """AdamW, weight decay on the tensors with dim >= 2 only; fused on CUDA only."""
    param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
    decay_params = [p for p in param_dict.values() if p.dim() >= 2]
    nodecay_params = [p for p in param_dict.values() if p.dim() < 2]
    optim_groups = [
      {"params": decay_params, "weight_decay": weight_decay},
      {"params": nodecay_params, "weight_decay": 0.0},
    ]
    num_decay = sum(p.numel() for p in decay_params)
    num_nodecay = sum(p.numel() for p in nodecay_params)
    print(f"num decayed parameter tensors: {len(decay_params)}, with {num_decay:,} parameters")
    print(
      f"num non-decayed parameter tensors: {len(nodecay_params)}, with {num_nodecay:,} parameters"
    )
    use_fused = device_type == "cuda"  # nanoGPT: fused AdamW exists and the device is CUDA
    extra_args = dict(fused=True) if use_fused else dict()
    print(f"using fused AdamW: {use_fused}")
    return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)

  def estimate_mfu(self, fwdbwd_per_iter: int, dt: float) -> float:
    """nanoGPT's MFU estimate: PaLM's 6N + 12 L H Q T FLOPs per token over A100 bf16 peak."""
    N, cfg = self.get_num_params(), self.config
    L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
    flops_per_iter = (6 * N + 12 * L * H * Q * T) * T * fwdbwd_per_iter
    return flops_per_iter * (1.0 / dt) / 312e12


# ----------------------------------------------------------------------------- training


def get_lr(it, learning_rate=1e-3, warmup_iters=100, lr_decay_iters=2000, min_lr=1e-4):
  """nanoGPT's schedule: linear warmup, cosine decay to min_lr, then min_lr."""
  if it < warmup_iters:
    return learning_rate * (it + 1) / (warmup_iters + 1)
  if it > lr_decay_iters:
    return min_lr
  decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
  assert 0 <= decay_ratio <= 1
  coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # from 1 to 0
  return min_lr + coeff * (learning_rate - min_lr)


@torch.no_grad()
def full_split_loss(model: GPT, data_dir: str, split: str = "val", rows: int = 256) -> float:
  """Mean loss over every character of the split but the first, in windows of block_size
  starting at 0, block_size, 2 block_size, ... (each with the context since its start)."""
  data = np.fromfile(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16).astype(np.int64)
  T, n = model.config.block_size, len(data)
  starts = np.arange(0, n - 1, T)
  full, last = starts[starts + T + 1 <= n], starts[starts + T + 1 > n]
  model.eval()
  total, count = 0.0, 0
  for i in range(0, len(full), rows):
    s = full[i : i + rows, None] + np.arange(T)  # [rows, T]
    x, y = torch.from_numpy(data[s]), torch.from_numpy(data[s + 1])
    total += model(x, y)[1].item() * y.numel()
    count += y.numel()
  for s in last:  # the shorter last window
    y = torch.from_numpy(data[s + 1 :])[None]
    x = torch.from_numpy(data[s : s + y.shape[1]])[None]
    total += model(x, y)[1].item() * y.numel()
    count += y.numel()
  model.train()
  assert count == n - 1, (count, n)
  return total / count


def run(
  max_iters: int = 2000,
  eval_interval: int = 250,
  eval_iters: int = 20,
  log_interval: int = 1,
  batch_size: int = 12,
  block_size: int = 64,
  n_layer: int = 4,
  n_head: int = 4,
  n_embd: int = 128,
  dropout: float = 0.0,
  learning_rate: float = 1e-3,
  weight_decay: float = 1e-1,
  beta1: float = 0.9,
  beta2: float = 0.99,
  grad_clip: float = 1.0,
  warmup_iters: int = 100,
  lr_decay_iters: int | None = None,
  min_lr: float = 1e-4,
  seed: int = 1337,
  out: str | None = None,
  full_val: bool = False,
) -> list[dict]:
  """Trains as nanoGPT's train.py (lr_decay_iters None = max_iters, as the recipe sets it);
  returns the evaluation records {"iter", "train_loss", "val_loss", "wall_s"}."""
  lr_decay_iters = max_iters if lr_decay_iters is None else lr_decay_iters
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(seed)
  device_type = "cpu"
  records = []

  def write(record: dict) -> None:  # one JSON line, on disk at once (a racer may poll it)
    if out:
      with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")

  if out:
    open(out, "w").close()
  with tempfile.TemporaryDirectory(prefix="nanogpt_") as data_dir:  # .bin files, checkpoint
    vocab_size = prepare(data_dir)
    print(f"found vocab_size = {vocab_size} (inside {data_dir})")
    model_args = dict(
      n_layer=n_layer,
      n_head=n_head,
      n_embd=n_embd,
      block_size=block_size,
      bias=False,
      vocab_size=vocab_size,
      dropout=dropout,
    )
    model = GPT(GPTConfig(**model_args))
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)

    @torch.no_grad()
    def estimate_loss():
      out = {}
      model.eval()
      for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
          X, Y = get_batch(data_dir, split, block_size, batch_size)
          _, loss = model(X, Y)
          losses[k] = loss.item()
        out[split] = losses.mean()
      model.train()
      return out

    X, Y = get_batch(data_dir, "train", block_size, batch_size)  # the very first batch
    t0 = time.time()
    iter_num, local_iter_num, best_val_loss, running_mfu = 0, 0, 1e9, -1.0
    while True:
      lr = get_lr(iter_num, learning_rate, warmup_iters, lr_decay_iters, min_lr)
      for param_group in optimizer.param_groups:
        param_group["lr"] = lr
      if iter_num % eval_interval == 0:
        losses = estimate_loss()
        record = dict(
          iter=iter_num,
          train_loss=float(losses["train"]),
          val_loss=float(losses["val"]),
          wall_s=time.perf_counter() - START,
        )
        records.append(record)
        print(
          f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
          f" (wall {record['wall_s']:.1f} s)",
          flush=True,
        )
        write(record)
        if losses["val"] < best_val_loss:  # always_save_checkpoint = False in the config
          best_val_loss = losses["val"]
          if iter_num > 0:
            checkpoint = {
              "model": model.state_dict(),
              "optimizer": optimizer.state_dict(),
              "model_args": model_args,
              "iter_num": iter_num,
              "best_val_loss": best_val_loss,
            }
            print(f"saving checkpoint to {data_dir}")
            torch.save(checkpoint, os.path.join(data_dir, "ckpt.pt"))
      _, loss = model(X, Y)
      X, Y = get_batch(data_dir, "train", block_size, batch_size)  # next batch, as nanoGPT
      loss.backward()
      if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
      optimizer.step()
      optimizer.zero_grad(set_to_none=True)
      t1 = time.time()
      dt, t0 = t1 - t0, t1
      if iter_num % log_interval == 0:
        lossf = loss.item()
        if local_iter_num >= 5:  # let the training loop settle a bit
          mfu = model.estimate_mfu(batch_size, dt)
          running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, mfu {running_mfu:.2%}")
      iter_num += 1
      local_iter_num += 1
      if iter_num > max_iters:
        break
    summary = dict(train_wall_s=time.perf_counter() - START)
    print(f"training done: {iter_num} updates, wall {summary['train_wall_s']:.1f} s")
    if full_val:  # outside the timed region
      summary["full_val_loss"] = full_split_loss(model, data_dir)
      print(f"full validation split: loss {summary['full_val_loss']:.4f}")
  write(summary)
  return records


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--max-iters", type=int, default=2000)
  p.add_argument("--lr-decay-iters", type=int, default=None, help="default: --max-iters")
  p.add_argument("--warmup-iters", type=int, default=100)
  p.add_argument("--eval-interval", type=int, default=250)
  p.add_argument("--eval-iters", type=int, default=20, help="random batches per split")
  p.add_argument("--log-interval", type=int, default=1)
  p.add_argument("--batch-size", type=int, default=12)
  p.add_argument("--block-size", type=int, default=64)
  p.add_argument("--seed", type=int, default=1337)
  p.add_argument("--out", default=None, help="JSONL file of the evaluation records")
  p.add_argument("--full-val", action="store_true", help="then the whole-split validation loss")
  a = p.parse_args()
  print(f"CPU: {cpu_isa()}; torch {torch.__version__}, {os.cpu_count()} threads")
  print(f"flags: {json.dumps(vars(a))}")
  run(**vars(a))  # every flag is one of run's parameters, by the same name


if __name__ == "__main__":
  main()
