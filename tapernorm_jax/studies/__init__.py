"""Studies: grids of sizes × variants × seeds, launched (`launch/`) and read (`analysis/`).

    spec       a study's cells as data: `Cell`, its name and JSON form, `SweepError` (no jax)
    manifest   DIR/sweep.json, the per-cell DIR/<cell>/cell.json records, where each cell stands (no jax)
    launch/    the sweep file → cells and their configs (`grid`), the in-process runner, Ray, one command line per
               cell for a scheduler, and `python -m tapernorm_jax.studies.launch.cell` (one cell, from an installed
               package)
    analysis/  reading a study's runs, with no jax: run rows, Table 2 over seeds, curves, figures, fits and their
               coverage, scaling laws, predict-then-check, a tuning study's choice, the throughput table, and the
               report (`report.write_report`, which `experiments.report` calls)

The decode throughput beside a report's losses is timed by `benchmarks/study_throughput.py` (jax); the report only
reads what it wrote.
"""
