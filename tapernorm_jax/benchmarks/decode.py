"""Inference throughput of the baseline, fixed, folded and identity forms of one set of weights (docs/method.md §9),
and of the same weights with point-wise norms (DyT, Derf: no fold, their tanh or erf run at every norm).

`forward` is the paper's last-token-logits forward over B×T tokens (no cache); `decode` is
KV-cache generation of N tokens after a P-token prompt, timed apart from the prefill and set
against the memory-bandwidth roofline: bytes of weights and cache read per step ÷ the read
bandwidth of a jitted sum over an array of that same size (so it streams from wherever the
weights stream from: DRAM, or a cache level they fit in), sampled between the decode runs.
A sum over 1 GiB gives the DRAM bandwidth as well.
"""

import dataclasses
import datetime
import time
from typing import Any

import jax
import jax.numpy as jnp

from tapernorm_jax.runtime import hardware
from tapernorm_jax.inference import decode
from tapernorm_jax.inference import forms as forms_lib
from tapernorm_jax.cpu_kernels import few_rows, matvec
from tapernorm_jax.model.seams import einsum
from tapernorm_jax.taper.variants import SIZES
from tapernorm_jax.train import run_config
from tapernorm_jax.benchmarks.timing import (
  bandwidth_probe,
  check_at_least,
  paired_ratio,
  read_bandwidth,
  summary,
  time_interleaved,
)
from tapernorm_jax.model import ModelConfig, init, param_count
from tapernorm_jax.model.norms import POINTWISE_MODES

PyTree = Any
# The paper's measurement (docs/method.md §9): thousands of tokens/s on an H100 in bf16 (PyTorch eager),
# as (baseline, fixed, folded), keyed by (B, T).
PAPER_TABLE = {
  (1, 128): (40.7, 45.9, 48.7),
  (1, 256): (79.3, 90.8, 96.8),
  (1, 512): (163.2, 181.7, 195.5),
  (4, 128): (149.3, 169.3, 180.4),
  (4, 256): (290.5, 323.6, 344.9),
  (4, 512): (546.3, 588.1, 615.9),
}
MODES = ("forward", "decode")
VARIANTS = ("internal_taper", "all_taper")


@dataclasses.dataclass
class Settings:
  """Everything that defines one benchmark run (defaults: the paper's grid at 30M)."""

  size: str = "30m"
  variant: str = "internal_taper"
  modes: tuple[str, ...] = MODES
  batches: tuple[int, ...] = (1, 4)
  lengths: tuple[int, ...] = (128, 256, 512)
  decode_batches: tuple[int, ...] = (1, 4)
  prompt: int = 128
  new_tokens: int = 128
  repeats: int = 7
  warmup: int = 2
  min_sample_s: float = 1.0
  dtype: str = ""  # "" = float32 on CPU, bfloat16 on accelerators
  seed: int = 0
  pointwise: tuple[str, ...] = POINTWISE_MODES

  def __post_init__(self):
    known = self.known_modes()
    unknown = set(self.modes) - set(known)
    if unknown:
      raise ValueError(f"modes={sorted(unknown)}: unknown; choose from {known}")
    if self.size not in SIZES:
      raise ValueError(f"size={self.size!r}: choose one of {sorted(SIZES)}")
    if set(self.pointwise) - set(POINTWISE_MODES):
      raise ValueError(f"pointwise={list(self.pointwise)}: choose among {POINTWISE_MODES} (or none: --pointwise=)")
    if self.variant not in VARIANTS:
      raise ValueError(f"variant={self.variant!r}: choose one of {VARIANTS} (a model with tapered norms)")
    check_at_least(self, 1, "batches", "lengths", "decode_batches", "prompt", "new_tokens", "repeats")
    check_at_least(self, 0, "warmup", "min_sample_s")
    if self.dtype not in ("", "float32", "bfloat16", "float16", "float64"):
      raise ValueError(f"dtype={self.dtype!r}: choose float32, bfloat16, float16 or float64 (or leave it empty)")
    self.dtype = self.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")

  @staticmethod
  def known_modes() -> tuple[str, ...]:
    """The modes this benchmark can time."""
    return MODES


FLAG_HELP = {  # one line per Settings field, for the entry points' flags
  "size": "Model size (the paper's 1m/3m/9m/30m, or cpu).",
  "variant": "internal_taper or all_taper.",
  "modes": "forward and/or decode.",
  "batches": "Batch sizes of the forward mode.",
  "lengths": "Sequence lengths T of the forward mode.",
  "decode_batches": "Batch sizes of the decode mode.",
  "prompt": "Prompt length P of the decode mode.",
  "new_tokens": "Tokens N generated per row in the decode mode.",
  "repeats": "Timed samples per contender and cell (median and spread reported).",
  "warmup": "Untimed calls per contender and cell after compiling.",
  "min_sample_s": "Each timed sample loops calls for at least this long.",
  "dtype": "Compute and weight dtype (default: float32 on CPU, else bfloat16).",
  "seed": "Weight seed.",
  "pointwise": "Point-wise norms (dyt, derf) also timed on the same weights; empty for none.",
}
QUICK = dict(
  size="1m",
  batches=(1,),
  lengths=(128,),
  decode_batches=(1,),
  prompt=32,
  new_tokens=32,
  repeats=3,
  warmup=1,
  min_sample_s=0.05,
)  # a smoke run in under a minute


def model_config(size: str, variant: str, dtype: str) -> ModelConfig:
  """The paper's model of `size` with `variant`'s norms, weights and activations in `dtype` (the defaults, not a tuned
  preset's initial values: the benchmarks compare one model across rounds and against its peer)."""
  cfg = ModelConfig.from_config(run_config.get_config(variant, f"size={size},tuned=0").model)
  return cfg.replace(dtype=dtype, param_dtype=dtype)


def forward_calls(forms: dict[str, tuple[PyTree, ModelConfig]], tokens_BxT: Any) -> dict[str, Any]:
  """Per form, a call of its jitted last-token-logits forward on `tokens_BxT`; and the baseline's once more with
  every block on every position (`FULL`: the work a forward that runs the last block on all positions does)."""
  tokens_BxT = jnp.asarray(tokens_BxT)
  calls = {name: (lambda f=forms_lib.last_token_logits(cfg), v=v: f(v, tokens_BxT)) for name, (v, cfg) in forms.items()}
  v, cfg = forms["baseline"]
  return {**calls, FULL: lambda f=forms_lib.last_token_logits(cfg, every_position=True): f(v, tokens_BxT)}


def bench_forward(forms: dict, s: Settings) -> list[dict]:
  """Tokens/s of the last-token-logits forward for every (B, T) cell and form."""
  rows = []
  for B in s.batches:
    for T in s.lengths:
      tokens_BxT = jax.random.randint(jax.random.key(T + B), (B, T), 0, next(iter(forms.values()))[1].V)
      samples = time_interleaved(forward_calls(forms, tokens_BxT), s.repeats, s.warmup, s.min_sample_s)
      row = {"B": B, "T": T, "forms": {name: summary(sec, B * T) for name, sec in samples.items()}}
      rows.append(row)
      log_row(f"forward B={B} T={T}", row, "tok/s")
  return rows


def bytes_per_decode_step(variables: PyTree, cfg: ModelConfig, B: int, cache: decode.Cache) -> dict[str, int]:
  """Bytes one decode step must read: every weight once (embedding tables: only B rows unless tied) and the cache."""
  params = variables["params"]
  total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  for table in ("embed", "pos_embed"):
    if table in params and not (table == "embed" and cfg.tie_embeddings):
      x = params[table]
      total -= x.size * x.dtype.itemsize - B * x.shape[1] * x.dtype.itemsize
  return {"weights": int(total), "cache": decode.cache_bytes(cache)}


PROJECTIONS = {
  few_rows.kernel_projection: "the matvec kernel",
  few_rows.rowwise_projection: "one product per row (kernel: {})",
  einsum: "the model's einsum",
}
FULL = "baseline_every_position"  # forward contender: the baseline with its last block on every position too
WITHOUT_KERNEL = "folded_xla"  # decode contender: the folded form with the model's own einsum (no CPU projection)
ROWWISE = "folded_rowwise"  # and, where the kernel runs, with one product per row (what runs without the kernel)


def projection_name(projection: Any) -> str:
  """Which projection decoding used, in words (with the reason the kernel was not used, where it was not)."""
  return PROJECTIONS[projection].format(matvec.reason())


def with_projections(forms: dict, rows: int, copies: dict[str, PyTree]) -> dict[str, tuple[PyTree, Any, ModelConfig]]:
  """Each form as (variables, projection, cfg) for decode steps of `rows` rows (`few_rows.projection_for`); the
  kernel's weight copies are made once per form, kept in `copies` for the next batch size."""
  out = {}
  for name, (v, cfg) in forms.items():
    projection = few_rows.projection_for(cfg, rows)
    if projection is few_rows.kernel_projection:
      if name not in copies:
        copies[name] = few_rows.with_matvec_weights(v, cfg)
      v = copies[name]
    out[name] = (v, projection, cfg)
  return out


def decode_calls(
  variables: PyTree, projection: Any, cfg: ModelConfig, prompt_BxP: jax.Array, new_tokens: int
) -> tuple[Any, Any, decode.Cache]:
  """One form's jitted prefill of `prompt_BxP` and its loop generating `new_tokens` after it (greedy from the
  prefill's logits), as argument-free calls, and the cache the prefill fills."""
  B, P = prompt_BxP.shape
  decode.check_lengths(cfg, P, new_tokens)
  lengths_B = jnp.full((B,), P, jnp.int32)
  prefill = jax.jit(lambda v, p, n, c: decode.prefill(v, cfg, p, n, c, projection=projection))
  empty = decode.init_cache(cfg, B, decode.cache_length(P, new_tokens))
  logits_BxV, cache = prefill(variables, prompt_BxP, lengths_B, empty)
  first_B = jnp.argmax(logits_BxV, -1).astype(jnp.int32)
  loop = jax.jit(
    lambda v, f, n, c: decode.decode_loop(v, cfg, f, n, c, jax.random.key(0), new_tokens, projection=projection)
  )
  return (
    lambda: prefill(variables, prompt_BxP, lengths_B, empty),
    lambda: loop(variables, first_B, lengths_B, cache),
    cache,
  )


def bench_decode(forms: dict, s: Settings) -> list[dict]:
  """KV-cache generation: prefill and per-token decode timed apart; decode set against the roofline."""
  rows, copies = [], {}
  for B in s.decode_batches:
    runs = with_projections(forms, B, copies)
    if runs["folded"][1] is not einsum:  # the CPU projection's gain, side by side: folded with the model's own
      runs[WITHOUT_KERNEL] = (forms["folded"][0], einsum, forms["folded"][1])
    if runs["folded"][1] is few_rows.kernel_projection:  # the kernel's own gain over the per-row products
      runs[ROWWISE] = (forms["folded"][0], few_rows.rowwise_projection, forms["folded"][1])
    P, N = s.prompt, s.new_tokens
    prompt_BxP = jax.random.randint(jax.random.key(B), (B, P), 0, next(iter(forms.values()))[1].V)
    prefills, loops, traffic = {}, {}, {}
    for name, (v, projection, cfg) in runs.items():
      prefills[name], loops[name], cache = decode_calls(v, projection, cfg, prompt_BxP, N)
      traffic[name] = bytes_per_decode_step(v, cfg, B, cache)
    step_bytes = traffic["folded"]["weights"] + traffic["folded"]["cache"]
    loops["read"] = bandwidth_probe(step_bytes)  # the roofline's bandwidth, sampled between the decode runs
    prefill_samples = time_interleaved(prefills, s.repeats, s.warmup, s.min_sample_s)
    loop_samples = time_interleaved(loops, s.repeats, s.warmup, s.min_sample_s)
    bandwidth = summary(loop_samples.pop("read"), step_bytes / 1e9)
    auto = few_rows.choose(*forms["folded"], B)  # what `generate` picks here for B rows (timed once, cached)
    row = {
      "B": B,
      "prompt": P,
      "new_tokens": N,
      "read_gb_s": bandwidth,
      "projection": projection_name(runs["folded"][1]),
      "auto_paths": auto.record(),
      "forms": {},
    }
    for name in runs:
      stats = summary(loop_samples[name], B * (N - 1))  # the first new token comes from the prefill
      form_bytes = traffic[name]["weights"] + traffic[name]["cache"]
      roofline_tokens_s = B * bandwidth["median"] * 1e9 / form_bytes
      stats.update(
        bytes_per_step=traffic[name],
        roofline_tokens_s=roofline_tokens_s,
        roofline_fraction=stats["median"] / roofline_tokens_s,
        prefill=summary(prefill_samples[name], B * P),
      )
      row["forms"][name] = stats
    rows.append(row)
    log_row(
      f"decode B={B} P={P} N={N} (read bandwidth {bandwidth['median']:.1f} GB/s over "
      f"{step_bytes / 1e6:.0f} MB; generate's path here: {auto.describe()})",
      row,
      "tok/s",
    )
  return rows


def speedup(forms: dict, name: str, reference: str) -> dict[str, float]:
  """How many times faster form `name` ran than `reference`, round by round (timing.paired_ratio)."""
  return paired_ratio(forms[name]["seconds"], forms[reference]["seconds"])


def log_row(title: str, row: dict, unit: str) -> None:
  """Prints one cell's medians and ratios to baseline."""
  cells = ", ".join(
    f"{name} {r['median']:,.0f} {unit} ({speedup(row['forms'], name, 'baseline')['median']:.3f}×, "
    f"±{50 * r['spread']:.1f}%)"
    for name, r in row["forms"].items()
  )
  print(f"{title}: {cells}", flush=True)


def run(s: Settings) -> dict[str, Any]:
  """Builds the four forms of one set of calibrated-looking weights (and its point-wise forms) and runs the selected
  modes."""
  cfg = model_config(s.size, s.variant, s.dtype)
  variables = forms_lib.perturbed(init(cfg, jax.random.key(s.seed)), jax.random.key(s.seed + 1), (0.05, 0.5), 0.1)
  forms = forms_lib.forms(variables, cfg)
  for mode in s.pointwise:
    forms[mode] = forms_lib.pointwise(variables, cfg, mode, jax.random.key(s.seed + 2))
  results: dict[str, Any] = {
    "date": datetime.date.today().isoformat(),
    "hardware": hardware.describe(),
    "settings": dataclasses.asdict(s),
    "model": cfg.to_dict(),
    "params": param_count(forms["baseline"][0]["params"]),
  }
  print(
    f"{s.size} {s.variant}: {results['params']:,} parameters, {s.dtype}, on {results['hardware']['device']}", flush=True
  )
  results["bandwidth"] = read_bandwidth()
  print(
    f"DRAM read bandwidth (sum over 1 GiB): {results['bandwidth']['median_gb_s']:.1f} GB/s "
    f"(best {results['bandwidth']['best_gb_s']:.1f})",
    flush=True,
  )
  t0 = time.time()
  if "forward" in s.modes:
    results["forward"] = bench_forward(forms, s)
  if "decode" in s.modes:
    results["decode"] = bench_decode(forms, s)
  results["wall_s"] = time.time() - t0
  return results
