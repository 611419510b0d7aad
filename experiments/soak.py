"""A soak: `python -m experiments.soak --config=configs/all_taper.py:size=1m --workdir=runs/soak-1m --out=docs/soak`.

Trains (or resumes) one run with the directory's files sampled while it trains, then writes soak.json (resident
memory and step time per window of steps after warm-up, the file counts) and soak.png to --out. Set the horizon and
the intervals with the config's own flags (--config.train.steps, --config.checkpoint.every, --config.train.diag_every).
"""

import os

from absl import app, flags, logging

from tapernorm_jax import cli
from tapernorm_jax.storage import run_files
from tapernorm_jax.runtime import hardware
from tapernorm_jax.benchmarks import soak

_CONFIG = cli.define_config_file("config", "configs/all_taper.py", "Variant config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/soak", "Run directory (resumed if it holds the run).")
_OUT = flags.DEFINE_string("out", "runs/soak", "Where soak.json and soak.png go.")


def main(argv: list[str]) -> None:
  """Runs the soak and writes its summary and figure."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save step at INFO; our own progress goes to the bar
  cfg = _CONFIG.value
  result = soak.run(cfg, _WORKDIR.value)
  os.makedirs(_OUT.value, exist_ok=True)
  run_files.write_json_atomically(os.path.join(_OUT.value, "soak.json"), result)
  first, last = result["windows"][0], result["windows"][-1]
  soak.figure(
    result,
    os.path.join(_OUT.value, "soak.png"),
    f"Soak: {cfg.variant} {cfg.size}, {result['steps']:,} steps on {hardware.one_line(result['host'])}",
  )
  print(
    f"{result['steps']:,} steps; after warm-up (steps {first['first_step']}–{last['last_step']}): resident memory "
    f"{first['rss_mb']:.1f} → {last['rss_mb']:.1f} MB, step time {first['step_ms']:.1f} → {last['step_ms']:.1f} ms "
    f"(× {result['step_time_ratio']:.2f}); files outside the checkpoints between saves "
    f"{result['settled_loose_first_half']} → {result['settled_loose_second_half']}. {_OUT.value}/soak.json, soak.png"
  )


if __name__ == "__main__":
  cli.run(main)
