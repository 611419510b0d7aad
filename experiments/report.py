"""Report a study: `python -m experiments.report --workdir=DIR [--out=OUT] [--throughput]`.

Reads every run directory under DIR (and DIR/sweep.json, to name missing cells) and writes
OUT/report.md (status, Table 2, logit/gradient norms, figures), OUT/results.csv (one row per run)
and OUT/figures/*.png. Works on partial studies: missing and failed cells are listed, not invented.
`--throughput` first times each method's inference form decoding on this host (DIR/throughput.json,
reported beside the losses; a study measured before keeps its file until this flag is given again).
"""

from absl import app, flags, logging

from tapernorm_jax import cli
from tapernorm_jax.storage import run_files
from tapernorm_jax.benchmarks import study_throughput
from tapernorm_jax.studies.analysis import report

_WORKDIR = flags.DEFINE_string("workdir", None, "Study directory (the sweep's --workdir, or any directory of runs).")
_OUT = flags.DEFINE_string("out", None, "Where to write report.md, results.csv and figures/ (default: --workdir).")
_THROUGHPUT = flags.DEFINE_boolean(
  "throughput",
  False,
  "First time each method's inference form decoding here (one run per size and variant), into DIR/throughput.json.",
)
flags.mark_flag_as_required("workdir")


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _THROUGHPUT.value:
    logging.set_verbosity(logging.WARNING)  # not Orbax's lines for every checkpoint it restores
    if run_files.is_url(_WORKDIR.value):
      raise ValueError(
        f"--throughput needs the study's checkpoints here: --workdir={_WORKDIR.value} is a URL; copy "
        f"the study to a local directory or drop --throughput"
      )
    study_throughput.measure(_WORKDIR.value, study_throughput.Settings())
  written = report.write_report(_WORKDIR.value, _OUT.value)  # bad input raises ValueError: one line via cli.run
  unlearned = f" ({written['no_context']} learned no context)" if written["no_context"] else ""
  print(
    f"{written['complete']} of {written['runs']} runs complete{unlearned}; wrote {written['report']}, "
    f"{written['csv']} and {len(written['figures'])} figures"
  )


if __name__ == "__main__":
  cli.run(main)
