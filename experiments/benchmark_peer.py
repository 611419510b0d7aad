"""Throughput against PyTorch: Hugging Face transformers' Llama and this project on the same weights (inference, and
a train step).

    pip install -e '.[peer]' -c constraints.txt     # torch and transformers: this script and its workers
    python -m experiments.benchmark_peer            # the paper's grid at 30M: forward and decode
    python -m experiments.benchmark_peer --quick    # a 1M-model smoke run
    python -m experiments.benchmark_peer --modes=forward --batches=1 --lengths=128,256 --nocompile
    python -m experiments.benchmark_peer --modes=train  # one optimiser step: 1M 16×512, 9M 4×512, 30M 1×512

The baseline form of decode.py's calibrated-looking internal_taper weights is written as a
Hugging Face `LlamaForCausalLM` checkpoint (tapernorm_jax/hf/llama.py, numpy only), loaded with
SDPA attention and checked first: its last-token logits must be within 1e-3 of this project's
in float32, or nothing is timed. Then, per cell and interleaved in this one process: HF eager
(`model(ids, logits_to_keep=1, use_cache=False)` under `torch.inference_mode`), HF under
`torch.compile` (reported `n/a` with the reason where it fails), and this project's jitted
baseline and folded forms; for decode, `generate` (compiled: with a static cache) against
`decode.generate`. PyTorch runs on the GPU when jax does and CUDA is there, else on the CPU with
every core. `train` times one optimiser step of this project's baseline and TaperNorm mid-taper against
LlamaForCausalLM + torch.optim.AdamW (eager with fused AdamW, and the whole step under torch.compile), every
contender in a worker process of its own (experiments/peer_train_worker.py), sampled in turn round by round, each
cell once with every process at malloc's defaults and once with the project's allocator settings; the peer starts
from the baseline's initial weights in the same dtypes, and must match its first loss and its parameters after one
step before anything is timed. What is timed and how: tapernorm_jax/benchmarks/pytorch/forward.py and training.py.
Writes results.json and table.md under --out.
"""

import dataclasses
import os
import sys
import tempfile
from typing import Any

from absl import flags

from tapernorm_jax import cli

try:
  import torch
  import transformers
except ImportError as e:
  cli.fail(
    f"experiments/benchmark_peer.py needs PyTorch and transformers ({e.name} is not installed); install the "
    "peer extra: pip install -e '.[peer]' -c constraints.txt"
  )

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tapernorm_jax.hf import llama  # noqa: E402
from tapernorm_jax.benchmarks import decode as decode_bench  # noqa: E402
from tapernorm_jax.benchmarks.pytorch import forward as bench  # noqa: E402
from tapernorm_jax.benchmarks.pytorch import training  # noqa: E402
from tapernorm_jax.benchmarks.pytorch.workers import reason  # noqa: E402
from tapernorm_jax.storage.run_files import write_report  # noqa: E402
from experiments.peer_train_hf import TORCH_DTYPES, load_llama, synchronize  # noqa: E402

_SETTINGS = cli.define_flags(
  bench.Settings,
  {
    **decode_bench.FLAG_HELP,
    "compile": "Also time Hugging Face under torch.compile (--nocompile skips it).",
    "threads": "PyTorch's intra-op threads (0: every core).",
    "modes": "forward, decode and/or train.",
    "train_cells": "Cells of the train mode, SIZE:BATCHxT (default: 1m:16x512,9m:4x512,30m:1x512).",
    "dtype": "Compute and weight dtype of forward and decode; the train mode's compute dtype, weights float32, the "
    "peer under autocast where they differ (default: float32 on CPU, else bfloat16).",
  },
)
_QUICK = flags.DEFINE_bool(
  "quick", False, "Smoke preset: 1m model, B=1, T=128, 3 repeats, 32 new tokens; train: 1m:2x64."
)
_OUT = flags.DEFINE_string("out", "runs/benchmark_peer", "Output directory for results.json and table.md.")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: where the train workers start


def first_call(fn: Any, compile: bool = True) -> Any:
  """`fn` if compiling is on (`--compile`) and one call of it (compiling) succeeds, else the reason it cannot run."""
  if not compile:
    return "skipped: --nocompile"
  try:
    fn()
  except Exception as e:  # noqa: BLE001 (torch.compile fails in many ways; the table reports the reason)
    print(f"torch.compile failed: {reason(e)}", flush=True)
    return reason(e)
  return fn


def torch_device() -> str:
  """cuda when jax runs on a GPU and PyTorch sees CUDA, else cpu."""
  return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


class HuggingFacePeer:
  """LlamaForCausalLM from a checkpoint directory: eager, and under torch.compile where that works."""

  def __init__(self, directory: str, s: bench.Settings):
    self.device = torch_device()
    self.model = load_llama(directory, self.device).eval()
    self.compile = s.compile
    self.compiled = None
    if s.compile:  # one graph per shape, like a jitted function; every cell's shape must fit the cache of graphs
      dynamo = torch._dynamo.config
      setattr(dynamo, "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit", 64)

  def logits(self, tokens_BxT: np.ndarray) -> np.ndarray:
    """Last-token logits B×V as float32 numpy."""
    with torch.inference_mode():
      logits_Bx1xV = self.model(self.ids(tokens_BxT), logits_to_keep=1, use_cache=False).logits
    return logits_Bx1xV[:, -1].float().cpu().numpy()

  def to(self, dtype: str) -> None:
    """Weights and compute in `dtype`."""
    self.model = self.model.to(TORCH_DTYPES[dtype])

  def ids(self, tokens: np.ndarray) -> torch.Tensor:
    """Token ids as an int64 tensor on the model's device."""
    return torch.from_numpy(np.asarray(tokens, np.int64)).to(self.device)

  def synced(self, fn: Any) -> Any:
    """`fn` under inference_mode, returning only when the device is done (CPU calls are synchronous anyway)."""

    def call() -> Any:
      with torch.inference_mode():
        out = fn()
      synchronize(self.device)
      return out

    return call

  def forward_calls(self, tokens_BxT: np.ndarray) -> bench.Calls:
    """Last-token logits: eager, and the torch.compile'd module (static shapes: one graph per cell)."""
    ids_BxT = self.ids(tokens_BxT)
    eager = self.synced(lambda: self.model(ids_BxT, logits_to_keep=1, use_cache=False).logits)
    if self.compile and self.compiled is None:
      self.compiled = torch.compile(self.model, dynamic=False)
    compiled = self.synced(lambda: self.compiled(ids_BxT, logits_to_keep=1, use_cache=False).logits)
    return {"hf_eager": eager, "hf_compiled": first_call(compiled, self.compile)}

  def decode_calls(self, prompt_BxP: np.ndarray, new_tokens: int) -> bench.Calls:
    """Greedy `generate` of exactly `new_tokens` tokens: eager with the default dynamic cache, and with a static
    cache and transformers' own torch.compile of the decoding step."""
    ids_BxP = self.ids(prompt_BxP)
    P = ids_BxP.shape[1]
    args = dict(
      attention_mask=torch.ones_like(ids_BxP),
      max_new_tokens=new_tokens,
      min_new_tokens=new_tokens,
      do_sample=False,
      pad_token_id=0,
    )
    generate = lambda **extra: self.model.generate(ids_BxP, **args, **extra)[:, P:].cpu()
    compile_config = transformers.CompileConfig(
      fullgraph=False, mode="reduce-overhead" if self.device == "cuda" else "default"
    )
    compile_config._compile_all_devices = self.device == "cpu"  # transformers compiles on GPUs only, unless told
    compiled = self.synced(lambda: generate(cache_implementation="static", compile_config=compile_config))
    return {"hf_eager": self.synced(generate), "hf_compiled": first_call(compiled, self.compile)}


def describe(device: str) -> dict[str, Any]:
  """Versions, device and threads of the peer."""
  name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
  return {
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "device": name,
    "threads": torch.get_num_threads(),
    "attention": "sdpa",
  }


def main(argv: list[str]) -> None:
  """Entry point."""
  s = cli.settings(argv, bench.Settings, _SETTINGS)
  if _QUICK.value:
    s = dataclasses.replace(s, **bench.QUICK)
  if "train" in s.modes:  # the train workers' jax share this process's accelerator: none takes most of its memory
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  torch.set_num_threads(s.threads or os.cpu_count())
  device = torch_device()
  peer, forms, checked = None, None, None
  if {"forward", "decode"} & set(s.modes):
    forms = bench.weights(s)
    variables, cfg = forms["baseline"]
    with tempfile.TemporaryDirectory(prefix="tapernorm-hf-llama-") as directory:
      llama.save_llama(variables, cfg, directory)
      peer = HuggingFacePeer(directory, s)
    tokens_BxT = np.random.default_rng(s.seed).integers(0, cfg.V, (2, min(128, cfg.T)), dtype=np.int32)
    checked = bench.parity(bench.last_logits(variables, cfg, tokens_BxT), peer.logits(tokens_BxT))
    print(
      f"{s.size} {s.variant} baseline form as LlamaForCausalLM: last-token logits match ours to "
      f"{checked['max_abs_diff']:.2e} (largest logit {checked['max_abs_logit']:.2f}, tolerance "
      f"{checked['tolerance']:g}); timing in {s.dtype} on torch {device} ({torch.get_num_threads()} thread(s)) "
      f"and jax {jax.default_backend()}",
      flush=True,
    )
    peer.to(s.dtype)
  spawn = training.process_spawner([sys.executable, "-m", "experiments.peer_train_worker"], cwd=ROOT)
  results = bench.run(s, describe(device), peer, forms, checked, spawn)
  table = bench.markdown(results)
  path = write_report(_OUT.value, results, table)
  print("\n" + table)
  print(f"wrote {path} and table.md ({results['wall_s']:.0f} s)")


if __name__ == "__main__":
  cli.run(main)
