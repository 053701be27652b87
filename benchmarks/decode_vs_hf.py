"""Decoding speed against Hugging Face: `lm_decode` and `GPT2LMHeadModel.generate` on the
same GPT-2 weights, greedy and top-k sampling, on the CPU.

  python benchmarks/decode_vs_hf.py                    # defaults below, a few minutes
  python benchmarks/decode_vs_hf.py --batch-sizes 1 16 --new-tokens 64 --rounds 3
  python benchmarks/decode_vs_hf.py --cpu-devices 2        # ours on two CPU devices

The weights (nothing downloaded): a `transformers.GPT2LMHeadModel` of GPT2Config(V=4096,
n_positions=512, n_embd=256, n_layer=4, n_head=4; d_ff 4 x 256, tanh GELU, tied
embeddings, initializer_range 0.02), randomly initialised from `torch.manual_seed(--seed)`,
`save_pretrained` to a temporary directory; Hugging Face reloads it with `from_pretrained`
and we import it with `transformer.convert.load`. Both run float32.

Prompts: [B, --prompt-len] random ids (no padding, attention mask all ones), the same for
both; --new-tokens new tokens per row, no EOS stopping (Hugging Face: eos_token_id=None,
min_new_tokens = max_new_tokens; ours: eos_id -1).
- ours: `transformer.decode.lm_decode`, one jitted program (prefill, then while loops over
  a cache that grows as it fills); top-k through a `decode.Sampling` pytree.
  --cpu-devices N splits the CPU into N JAX devices (`jax_num_cpu_devices`) and shards
  each batch N divides over them, parameters replicated: each device decodes its rows,
  at the same time (XLA:CPU runs one device's batched attention products on one thread;
  docs/PERFORMANCE.md, "Decoding"). A batch N does not divide runs on the first device.
- HF: `model.generate(input_ids, attention_mask, max_new_tokens=...)` under
  `torch.inference_mode()` with its default (dynamic) KV cache and attention
  implementation; `torch.set_num_threads(os.cpu_count())`, and OMP_WAIT_POLICY=PASSIVE
  set before torch is imported (as `benchmarks/torch_reference.py`: with spin-waiting
  OpenMP threads, PyTorch slows down badly on a shared machine).
Modes: greedy (do_sample=False / sampling None) and top-k sampling (k=--top-k,
temperature --temperature, top_p 1).

Calls alternate ours / HF (`alternate` of benchmarks/decode.py: one warm-up call each,
reported as the first call, compilation included for ours; then --rounds rounds, one call
of each per round); tokens/s = B x new tokens / median seconds. Prints Markdown.

Checks: greedy tokens must be identical for every batch size (float32 logits agree to
about 1e-5, so only a near-tie could flip one); a difference is reported with its first
position and both models' logit gap between the two tokens there, and the script exits
with status 1. Sampled tokens cannot match (different random number generators): only
their shape and range are checked.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from decode import alternate  # noqa: E402  (benchmarks/ is on sys.path)
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from transformer import convert  # noqa: E402
from transformer import decode as dec  # noqa: E402
from transformer.data.tokenizers import NUM_SPECIAL, PAD_ID  # noqa: E402
from transformer.nn.models import build_model  # noqa: E402
from transformer.train.machine import cpu_isa  # noqa: E402

MODES = ("greedy", "top-k")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--vocab", type=int, default=4096)
  p.add_argument("--d-model", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--max-len", type=int, default=512)
  p.add_argument("--init-range", type=float, default=0.02, help="GPT2Config.initializer_range")
  p.add_argument("--prompt-len", type=int, default=16)
  p.add_argument("--new-tokens", type=int, default=256)
  p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
  p.add_argument("--top-k", type=int, default=50)
  p.add_argument("--temperature", type=float, default=1.0)
  p.add_argument("--rounds", type=int, default=3, help="timed calls per variant (median)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
    "--cpu-devices", type=int, default=1,
    help="split the CPU into this many JAX devices and shard each batch they divide",
  )  # fmt: skip
  a = p.parse_args(argv)
  if a.cpu_devices < 1:
    p.error(f"--cpu-devices must be >= 1, got {a.cpu_devices}")
  return a


def placement(cpu_devices: int):
  """`place(tree, b, batch_axis)`: a pytree of a batch of b rows put on the devices, split
  by row (batch_axis) or replicated over a 'data' mesh of all of them when they divide b,
  else on the first device. Call after `jax_num_cpu_devices` is set."""
  devices = jax.devices()[:cpu_devices]
  if len(devices) < cpu_devices:
    raise SystemExit(f"--cpu-devices={cpu_devices}, but JAX has {len(devices)} devices")
  mesh = Mesh(np.array(devices), ("data",))

  def place(tree, b: int, batch_axis: bool):
    if b % len(devices):
      return jax.device_put(tree, devices[0])
    return jax.device_put(tree, NamedSharding(mesh, P("data") if batch_axis else P()))

  return place


def gpt2_checkpoint(a, path: str):
  """A seeded random GPT2LMHeadModel saved to `path`; returns it reloaded from there."""
  transformers.utils.logging.disable_progress_bar()
  torch.manual_seed(a.seed)
  config = transformers.GPT2Config(
    vocab_size=a.vocab, n_positions=a.max_len, n_embd=a.d_model, n_layer=a.layers,
    n_head=a.heads, initializer_range=a.init_range, bos_token_id=None, eos_token_id=None,
  )  # fmt: skip
  transformers.GPT2LMHeadModel(config).save_pretrained(path)
  return transformers.GPT2LMHeadModel.from_pretrained(path).eval()


def hf_generate(hf, ids: torch.Tensor, new_tokens: int, mode: str, a):
  """The [B, new_tokens] continuation from `generate` (prompt dropped)."""
  sampling = dict(do_sample=True, top_k=a.top_k, temperature=a.temperature, top_p=1.0)
  with torch.inference_mode():
    out = hf.generate(
      input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
      min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=PAD_ID,
      **(sampling if mode == "top-k" else dict(do_sample=False)),
    )  # fmt: skip
  return out[:, ids.shape[1] :]


def first_difference(hf, model, params, prompts, ours, theirs) -> str:
  """Where greedy tokens first differ, with the logit gap of the two tokens there."""
  row, col = np.argwhere(ours != theirs)[0]
  prefix = np.concatenate([prompts[row], ours[row, :col]])[None]  # [1, P + col] shared
  with torch.inference_mode():
    hf_logits = hf(torch.from_numpy(prefix.astype(np.int64))).logits[0, -1].numpy()  # [V]
  positions = np.arange(prefix.shape[1], dtype=np.int32)[None]
  our_logits = np.asarray(model.apply(params, jnp.asarray(prefix), positions))[0, -1]  # [V]
  a, b = ours[row, col], theirs[row, col]
  return (
    f"row {row}, new token {col}: ours {a}, HF {b}; logit[{a}] - logit[{b}] is "
    f"{our_logits[a] - our_logits[b]:.3g} in ours, {hf_logits[a] - hf_logits[b]:.3g} in HF "
    f"(largest logit {np.abs(hf_logits).max():.3g}; max |ours - HF| over the vocabulary "
    f"{np.abs(our_logits - hf_logits).max():.2g})"
  )


def main(argv=None) -> int:
  a = parse_args(argv)
  if a.prompt_len + a.new_tokens > a.max_len:
    raise SystemExit(f"--prompt-len + --new-tokens must be <= --max-len={a.max_len}")
  torch.set_num_threads(os.cpu_count())
  jax.config.update("jax_num_cpu_devices", a.cpu_devices)  # before JAX starts
  place = placement(a.cpu_devices)
  with tempfile.TemporaryDirectory() as path:
    hf = gpt2_checkpoint(a, path)
    config, params = convert.load(path)
  model = build_model(config)
  n_params = sum(x.size for x in jax.tree.leaves(params))

  rng = np.random.default_rng(a.seed)
  key = jax.random.key(a.seed)
  sampling = dec.Sampling(key, a.temperature, a.top_k, 1.0)
  fns, outs, inputs, placed = {}, {}, {}, {}
  for mode in MODES:
    for b in a.batch_sizes:
      if b not in inputs:
        inputs[b] = rng.integers(NUM_SPECIAL, a.vocab, (b, a.prompt_len)).astype(np.int32)
        rows = place((inputs[b], np.full((b,), a.prompt_len, np.int32)), b, True)
        placed[b] = (place(params["params"], b, False), *rows, place(sampling, b, False))
      prompts, ours_args = inputs[b], placed[b]
      ids = torch.from_numpy(prompts.astype(np.int64))

      def ours(mode=mode, b=b, args=ours_args):
        weights, tokens, lengths, placed_sampling = args
        s = placed_sampling if mode == "top-k" else None
        out = dec.lm_decode(model, weights, tokens, lengths, length=a.new_tokens, sampling=s)
        outs[mode, b, "ours"] = out.tokens
        return out.tokens

      def theirs(mode=mode, b=b, ids=ids):
        outs[mode, b, "HF"] = hf_generate(hf, ids, a.new_tokens, mode, a)
        return outs[mode, b, "HF"]

      fns[mode, b, "ours"], fns[mode, b, "HF"] = ours, theirs
  results = alternate(fns, a.rounds)

  load = " ".join(f"{x:.2f}" for x in os.getloadavg())
  print(f"CPU: {cpu_isa()}; load average {load}")
  print(
    f"jax {jax.__version__} ({jax.devices()[0].platform} x{a.cpu_devices}), "
    f"torch {torch.__version__} "
    f"({torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}), "
    f"transformers {transformers.__version__} (attention {hf.config._attn_implementation!r})"
  )
  print(
    f"\nGPT-2 V={a.vocab} D={a.d_model} L={a.layers} N={a.heads} F={config.d_ff} "
    f"max_len={a.max_len} ({n_params / 1e6:.2f}M params, float32); prompts of "
    f"{a.prompt_len} tokens, {a.new_tokens} new tokens, no EOS; top-k: k={a.top_k}, "
    f"temperature {a.temperature}; median of {a.rounds} alternating calls\n"
  )
  columns = ["ours tokens/s", "HF tokens/s", "ours/HF", "ours first call s", "HF first call s"]
  print("| mode | batch | " + " | ".join(columns) + " |")
  print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
  for mode in MODES:
    for b in a.batch_sizes:
      (f_ours, t_ours), (f_hf, t_hf) = results[mode, b, "ours"], results[mode, b, "HF"]
      tps_ours, tps_hf = b * a.new_tokens / t_ours, b * a.new_tokens / t_hf
      print(
        f"| {mode} | {b} | {tps_ours:,.0f} | {tps_hf:,.0f} | {tps_ours / tps_hf:.2f} | "
        f"{f_ours:.2f} | {f_hf:.2f} |"
      )

  status, shape = 0, lambda b: (b, a.new_tokens)
  print()
  for b in a.batch_sizes:
    ours, theirs = np.asarray(outs["greedy", b, "ours"]), outs["greedy", b, "HF"].numpy()
    if ours.shape != shape(b) or theirs.shape != shape(b):
      print(f"greedy, batch {b}: shapes differ: ours {ours.shape}, HF {theirs.shape}")
      status = 1
    elif (ours != theirs).any():
      where = first_difference(hf, model, params, inputs[b], ours, theirs)
      rows = int((ours != theirs).any(-1).sum())
      print(f"greedy, batch {b}: tokens DIFFER in {rows} of {b} rows; first: {where}")
      status = 1
    else:
      print(f"greedy, batch {b}: ours and HF identical ({b} x {a.new_tokens} tokens)")
    for name, out in (("ours", outs["top-k", b, "ours"]), ("HF", outs["top-k", b, "HF"])):
      out = np.asarray(out)
      if out.shape != shape(b) or out.min() < 0 or out.max() >= a.vocab:
        print(f"top-k, batch {b}: {name} gave shape {out.shape}, ids {out.min()}..{out.max()}")
        status = 1
  if not status:
    print("top-k: shapes and token ids valid for every batch (tokens cannot match: RNGs differ)")
  return status


if __name__ == "__main__":
  sys.exit(main())
