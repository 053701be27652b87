"""`make test-isa`: the numerics-sensitive tests as users' runs compile, on this CPU and
under each XLA:CPU instruction-set cap.

XLA:CPU emits other kernels for other instruction sets, so sums round differently on an
AVX2-only CPU than on an AVX-512 one, and a test that holds here can fail on a user's CPU.
`--xla_cpu_max_isa=AVX2` (or `SSE4_2`: no AVX, no FMA) makes this machine compile as such
a CPU would, and reproduces most of its numerics. This runs the tests whose assertions
depend on rounding (the ops against the library ops, parity with float64 NumPy, PyTorch and
Hugging Face, decoding against the full pass, the golden curves, bit-exact kill and resume)
once per instruction set (`native`: this CPU's own, uncapped; the test session keeps a cap
in every subprocess: tests/session_env.py), then prints one line per instruction set, and
exits non-zero if any run failed.

`make test` compiles quickly (tests/session_env.py: LLVM at -O0, XLA's older fusion
emitter), which rounds differently in the last bits; here every run has
`TESTS_XLA_CODEGEN=release`, XLA's own code generation, so these tests check the programs
users run.

  python scripts/test_isa.py [--isa native AVX2 SSE4_2] [pytest arguments ...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = [
  "tests/test_ops.py",
  "tests/test_torch_parity.py",
  "tests/test_attention.py",
  "tests/test_attention_impls.py",
  "tests/test_chunked_bias.py",
  "tests/test_layers.py",
  "tests/test_positional.py",
  "tests/test_qk_norm.py",
  "tests/test_models.py",
  "tests/test_moe.py",
  "tests/test_losses.py",
  "tests/test_decoding.py",
  "tests/test_decode_cache.py",
  "tests/test_convert_hf.py",
  "tests/test_convert_t5.py",
  "tests/test_convert_seq2seq_hf.py",
  "tests/test_seq2seq_options.py",
  "tests/test_convert_llama_family.py",
  "tests/test_convert_decoders.py",
  "tests/test_convert_rope_scaling.py",
  "tests/test_convert_roberta.py",
  "tests/test_convert_modernbert.py",
  "tests/test_convert_vision.py",
  "tests/test_golden_curves.py",
  "tests/test_faults_kill_resume.py",
  "tests/test_lm_eval.py",
  "tests/test_train.py",
  "tests/test_context.py",
  "tests/test_parallel.py",
]
SUMMARY = re.compile(r"\d+ (passed|failed|error)")


def run(isa: str, extra: list[str]) -> tuple[int, str]:
  """pytest under `--xla_cpu_max_isa=isa` (none for `native`) with XLA's own code
  generation, its output streamed: (exit code, summary line)."""
  cap = "" if isa == "native" else f"--xla_cpu_max_isa={isa}"
  flags = f"{os.environ.get('XLA_FLAGS', '')} {cap}".strip()
  cmd = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "worksteal", *TESTS, *extra]
  env = dict(os.environ, XLA_FLAGS=flags, TESTS_XLA_CODEGEN="release")
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
  summary = "no summary line"
  for line in proc.stdout:
    sys.stdout.write(line)
    if SUMMARY.search(line):
      summary = line.strip(" =\n")
  return proc.wait(), summary


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--isa", nargs="+", default=["native", "AVX2", "SSE4_2"])
  args, extra = parser.parse_known_args()
  lines, failed = [], False
  for isa in args.isa:
    print(f"== {isa}: --xla_cpu_max_isa={isa}" if isa != "native" else "== native", flush=True)
    start = time.monotonic()
    code, summary = run(isa, extra)
    failed |= code != 0
    lines.append(f"test-isa {isa}: {'ok' if code == 0 else 'FAILED'}, {summary} "
                 f"({time.monotonic() - start:.0f} s wall)")  # fmt: skip
  print("\n".join(lines))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
