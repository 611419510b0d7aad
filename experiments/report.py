"""Report a study: `python -m experiments.report --workdir=DIR [--out=OUT]`.

Reads every run directory under DIR (and DIR/sweep.json, to name missing cells) and writes
OUT/report.md (status, Table 2, logit/gradient norms, figures), OUT/results.csv (one row per run)
and OUT/figures/*.png. Works on partial studies: missing and failed cells are listed, not invented.
"""

from absl import app, flags

from tapernorm_jax import cli
from tapernorm_jax.studies import report

_WORKDIR = flags.DEFINE_string("workdir", None, "Study directory (the sweep's --workdir, or any directory of runs).")
_OUT = flags.DEFINE_string("out", None, "Where to write report.md, results.csv and figures/ (default: --workdir).")
flags.mark_flag_as_required("workdir")


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  written = report.write_report(_WORKDIR.value, _OUT.value)  # bad input raises ValueError: one line via cli.run
  print(f"{written['complete']} of {written['runs']} runs complete; wrote {written['report']}, {written['csv']} and "
        f"{len(written['figures'])} figures")


if __name__ == "__main__":
  cli.run(main)
