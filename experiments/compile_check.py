"""Compile every program of a run for a TPU topology, on any machine, and say whether and how it fits.

    python -m experiments.compile_check --topology=v5e:4x4 [--slices=2] --config=configs/all_taper.py:size=30m \
        [--config.mesh.fsdp=16 --config.train.batch_size=256] [--suggest]
    python -m experiments.compile_check --render=docs/tpu_results/v5e-4x4-gpt2-xl-all_taper

Needs the TPU compiler (`pip install -e '.[tpu]'`); nothing runs and no TPU is needed. Prints a table (per-chip
memory, FLOPs beside the analytic count, collectives, kernels, compile time, a roofline estimate) and writes
results.json and report.md under --out. A run that does not fit is one line naming the need, the chip's HBM and
the settings that would fit. docs/tpu.md explains the numbers.
"""

import os
import shlex
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compiles only: never takes (or probes) this host's accelerator

from absl import app, flags  # noqa: E402

from tapernorm_jax import cli  # noqa: E402

_CONFIG = cli.define_config_file(
  "config",
  "configs/all_taper.py",
  "The run's config file (any variant, configs/gpt2.py too), with --config.x.y= overrides.",
  lock_config=True,
)
_TOPOLOGY = flags.DEFINE_string(
  "topology", "v5e:2x2", "TPU generation and shape: v4:2x2x1, v5e:4x4, v5p:2x2x2, v6e:2x4, ..."
)
_SLICES = flags.DEFINE_integer("slices", 1, "Slices of that topology joined over DCN (mesh.data crosses them).")
_DECODE_BATCH = flags.DEFINE_integer("decode_batch", 0, "Rows decoded at once (0: one per chip).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 0, "Prompt length of the prefill (0: half of model.T).")
_SERVE_TENSOR = flags.DEFINE_integer(
  "serve_tensor",
  0,
  "Chips that share one copy of the served model (serve_ programs, split Megatron-style); 0: whole on every chip "
  "where its bfloat16 weights take at most half a chip's memory, else the fewest that bring each share under that.",
)
_PROGRAMS = flags.DEFINE_list(
  "programs",
  [],
  "Only these programs (default: all of the run's: train_step, "
  "fixed_step, eval_step, diagnostics, fold, prefill, decode_step, serve_prefill, serve_decode_step).",
)
_SUGGEST = flags.DEFINE_bool(
  "suggest", False, "Also compile other meshes and microbatch counts and rank those that fit by estimated step time."
)
_SUGGEST_LIMIT = flags.DEFINE_integer(
  "suggest_limit",
  8,
  "At most this many extra compiles for --suggest and for the settings a run that does not fit is told to use.",
)
_RENDER = flags.DEFINE_string(
  "render", None, "Rewrite DIR/report.md from DIR/results.json, compiling nothing (after the report's format changed)."
)
_OUT = flags.DEFINE_string("out", None, "Output directory (default: runs/compile_check/<topology>-<variant>-<size>).")


def check_flags(T: int) -> None:
  """ValueError naming the first decoding or suggestion flag out of range, before anything compiles."""
  bad = [
    (_DECODE_BATCH.value >= 0, f"--decode_batch={_DECODE_BATCH.value}: must be >= 0 (0: one row per chip)"),
    (_PROMPT_LEN.value >= 0, f"--prompt_len={_PROMPT_LEN.value}: must be >= 0 (0: half of model.T)"),
    (
      _PROMPT_LEN.value < T,
      f"--prompt_len={_PROMPT_LEN.value}: the KV cache holds model.T = {T} positions and "
      f"the decode step needs one after the prompt; use at most {T - 1}, or raise "
      "--config.model.T",
    ),
    (
      _SERVE_TENSOR.value >= 0,
      f"--serve_tensor={_SERVE_TENSOR.value}: must be >= 0 (0: chosen from the chip's memory)",
    ),
    (_SUGGEST_LIMIT.value >= 0, f"--suggest_limit={_SUGGEST_LIMIT.value}: must be >= 0 (0: no extra compiles)"),
  ]
  for ok, message in bad:
    if not ok:
      raise ValueError(message)


def main(argv: list[str]) -> None:
  """Compiles, prints the table, writes the report; a run that does not fit ends in one line (exit 2)."""
  from tapernorm_jax.aot import check, report
  from tapernorm_jax.storage.run_files import write_report

  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _RENDER.value:
    print(f"wrote {report.render(_RENDER.value)}")
    return
  cfg = _CONFIG.value
  check_flags(cfg.model.T)
  target = check.Target(_TOPOLOGY.value, _SLICES.value)
  only = tuple(_PROGRAMS.value)
  inference_programs = {"fold", "prefill", "decode_step", "serve_prefill", "serve_decode_step"}
  inference = not only or bool(set(only) & inference_programs)
  decoding = (
    check.default_decoding(cfg, target, _DECODE_BATCH.value, _PROMPT_LEN.value, _SERVE_TENSOR.value)
    if inference
    else None
  )
  results = check.check(cfg, target, decoding, only=only)
  fails = check.verdict(results) is not None
  if _SUGGEST.value or (fails and _SUGGEST_LIMIT.value > 0):
    results["suggestions"] = check.suggestions(cfg, target, _SUGGEST_LIMIT.value, enough=3 if fails else None)
  command = "python -m experiments.compile_check " + shlex.join(sys.argv[1:])
  page = report.markdown(results, command)
  out = _OUT.value or os.path.join(
    "runs",
    "compile_check",
    f"{target.topology.replace(':', '-')}{f'x{target.slices}' if target.slices > 1 else ''}-{cfg.variant}-{cfg.size}",
  )
  print("\n" + page)
  write_report(out, {**results, "command": command}, page, name="report.md")
  print(f"\nresults: {out}/results.json, {out}/report.md")
  if fails:
    raise check.DoesNotFit(check.verdict(results))


if __name__ == "__main__":
  cli.run(main)
