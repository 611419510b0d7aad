"""How often the scaling fits' 90% intervals hold the truth: `python -m experiments.fit_coverage [--studies=N]`.

Draws studies from known laws (4 sizes spanning 8×, `--seeds` seeds per cell, `--noise` relative seed noise), fits
each as a report does and counts how often each interval holds the true value; prints the table and writes
`--out` (default tapernorm_jax/studies/analysis/coverage.json, the measurement reports and predictions.json quote).
"""

from absl import app, flags

from tapernorm_jax import cli
from tapernorm_jax.storage import run_files
from tapernorm_jax.studies.analysis import coverage

_STUDIES = flags.DEFINE_integer(
  "studies", 1000, "Studies drawn per check (the rates' standard error is about √(0.09/N): 1 point at 1,000)."
)
_RESAMPLES = flags.DEFINE_integer("resamples", 300, "Bootstrap draws per fit (a report's: 300).")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds per cell.")
_NOISE = flags.DEFINE_float("noise", 0.003, "Each seed's loss spread, relative to its cell's mean.")
_OUT = flags.DEFINE_string("out", coverage.COVERAGE_FILE, "Where to write the measurement (JSON).")


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for name, value, least in (
    ("studies", _STUDIES.value, 1),
    ("resamples", _RESAMPLES.value, 20),
    ("seeds", _SEEDS.value, 2),
  ):
    if value < least:
      raise app.UsageError(f"--{name}={value}: must be >= {least}")
  if not 0 < _NOISE.value < 1:
    raise app.UsageError(f"--noise={_NOISE.value}: must lie in (0, 1) (a share of the cell's mean)")
  setting = coverage.Setting(seeds=_SEEDS.value, noise=_NOISE.value, studies=_STUDIES.value, resamples=_RESAMPLES.value)
  result = coverage.measure(setting, echo=print)
  print(coverage.markdown(result))
  run_files.write_json_atomically(_OUT.value, result)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  cli.run(main)
