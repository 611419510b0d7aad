"""Keep a study across checkouts: save its complete runs' records where git can hold them, or put them back.

    python -m experiments.archive --workdir=runs/budgets-tpp20-gain3 --save_to=docs/budgets/tpp20/runs
    python -m experiments.archive --workdir=runs/budgets-tpp20-gain3 --restore_from=docs/budgets/tpp20/runs

Saving copies the files a report reads: the study's sweep.json, predictions.json and throughput.json, and each
complete run's results, config and cell record with its history thinned to about 500 records (diagnostics kept; no
checkpoints). Restoring copies back each
archived run the study directory lacks; the sweep's same command then trains only the cells still missing, and
`experiments.report` reads either directory.
"""

from absl import app, flags

from tapernorm_jax import cli
from tapernorm_jax.studies.analysis import archive

_WORKDIR = flags.DEFINE_string("workdir", None, "The study directory (the sweep's --workdir).")
_SAVE_TO = flags.DEFINE_string("save_to", None, "Save the study's complete runs' records here.")
_RESTORE_FROM = flags.DEFINE_string("restore_from", None, "Copy the runs archived here into --workdir.")
flags.mark_flag_as_required("workdir")


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if (_SAVE_TO.value is None) == (_RESTORE_FROM.value is None):
    raise ValueError("give one of --save_to=DIR (save the study's records) or --restore_from=DIR (put them back)")
  if _SAVE_TO.value is not None:
    saved = archive.save(_WORKDIR.value, _SAVE_TO.value)
    print(f"saved {len(saved)} complete runs of {_WORKDIR.value} to {_SAVE_TO.value}")
    return
  restored, kept = archive.restore(_RESTORE_FROM.value, _WORKDIR.value)
  print(
    f"restored {len(restored)} runs into {_WORKDIR.value}"
    + (f"; kept {len(kept)} it already had ({', '.join(kept)})" if kept else "")
  )


if __name__ == "__main__":
  cli.run(main)
