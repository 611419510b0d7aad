"""Decode throughput of each method's inference form in a study, beside its losses: one trained run per size and
variant (its lowest complete seed), its norms folded where they fold (`forms.inference_form`: TaperNorm, FakeLN and
PRepBN fold; the baseline keeps its norms; DyT and Derf run their tanh or erf), KV-cache generation timed in rounds
alternated over the variants of a size. Written to DIR/throughput.json, which the study's report reads."""

import dataclasses
import os
from typing import Any

import jax

from tapernorm_jax.benchmarks.decode import decode_calls
from tapernorm_jax.benchmarks.timing import check_at_least, paired_ratio, summary, time_interleaved
from tapernorm_jax.cpu_kernels import few_rows
from tapernorm_jax.inference import forms, loading
from tapernorm_jax.model import ModelConfig
from tapernorm_jax.runtime import hardware
from tapernorm_jax.storage.run_files import write_json_atomically
from tapernorm_jax.studies.analysis.run_rows import FINISHED, Run, label, read_runs, size_order, variant_order
from tapernorm_jax.studies.analysis.throughput import FILE, REFERENCE


@dataclasses.dataclass
class Settings:
  """One throughput measurement: B rows decoding `new_tokens` after a `prompt`-token prompt."""

  batch: int = 1
  prompt: int = 32
  new_tokens: int = 64
  repeats: int = 5
  warmup: int = 1
  min_sample_s: float = 0.3

  def __post_init__(self):
    check_at_least(self, 1, "batch", "prompt", "repeats")
    check_at_least(self, 2, "new_tokens")  # the first new token comes from the prefill
    check_at_least(self, 0, "warmup", "min_sample_s")


def form_name(cfg: ModelConfig) -> str:
  """The inference form in words: folded, or the norms it runs."""
  if cfg.foldable:
    return "folded"
  return (
    f"{cfg.internal_norm} norms"
    if cfg.internal_norm == cfg.final_norm
    else f"{cfg.internal_norm}/{cfg.final_norm} norms"
  )


def inference_loop(run: Run, s: Settings) -> tuple[Any, str]:
  """`run`'s latest checkpoint in its inference form as an argument-free decode-loop call, and the form's name."""
  variables, run_cfg = loading.load_checkpoint(run.path)
  trained_cfg = ModelConfig.from_config(run_cfg["model"])
  variables, cfg = forms.inference_form(variables, trained_cfg)
  projection = few_rows.projection_for(cfg, s.batch)
  if projection is few_rows.kernel_projection:
    variables = few_rows.with_matvec_weights(variables, cfg)
  prompt_BxP = jax.random.randint(jax.random.key(0), (s.batch, s.prompt), 0, cfg.V)
  _, loop, _ = decode_calls(variables, projection, cfg, prompt_BxP, s.new_tokens)
  return loop, form_name(trained_cfg)


def measure(workdir: str, s: Settings) -> dict[str, Any]:
  """Times every size's variants against each other (lowest complete seed each); writes and returns throughput.json."""
  if not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir}: no such directory")
  chosen: dict[tuple[str, str, int], Run] = {}
  for run in sorted(read_runs(workdir), key=lambda r: r.seed):
    if run.status in FINISHED:  # a model that learned no context decodes at the same speed
      chosen.setdefault((run.size, *run.key), run)
  if not chosen:
    raise ValueError(f"--workdir={workdir}: no complete runs to time")
  rows = []
  for size in sorted({size for size, *_ in chosen}, key=size_order):
    keys = sorted((key for key in chosen if key[0] == size), key=lambda k: variant_order(k[1:]))
    loops, form_names = {}, {}
    for key in keys:
      print(f"throughput {size}: loading {chosen[key].cell}", flush=True)
      loops[key], form_names[key] = inference_loop(chosen[key], s)
    samples = time_interleaved(loops, s.repeats, s.warmup, s.min_sample_s)
    reference = (size, *REFERENCE) if (size, *REFERENCE) in samples else None
    for key in keys:
      run = chosen[key]
      row = {
        "size": size,
        "variant": run.variant,
        "aux": run.aux,
        "seed": run.seed,
        "params": run.params,
        "form": form_names[key],
        "tokens_s": summary(samples[key], s.batch * (s.new_tokens - 1)),
        "vs_baseline": paired_ratio(samples[key], samples[reference]) if reference else None,
      }
      rows.append(row)
      ratio = f" ({row['vs_baseline']['median']:.2f}× baseline)" if reference else ""
      print(
        f"throughput {size} {label(*run.key)} [{row['form']}]: {row['tokens_s']['median']:,.0f} tok/s{ratio}",
        flush=True,
      )
  result = {"hardware": hardware.describe(), "settings": dataclasses.asdict(s), "rows": rows}
  write_json_atomically(os.path.join(workdir, FILE), result)
  return result
