"""Studies: grids of sizes × variants × seeds, their runners, and the report (table, figures) over their runs.

    grid       the sweep file → cells (variants × sizes × seeds × overrides), `Cell`, their names and configs
    manifest   DIR/sweep.json, the per-cell DIR/<cell>/cell.json records, where each cell stands
    runner     the in-process runner: cells packed onto devices, output routing, progress, failures, resume
    ray_launch `--launch=ray`: each cell a Ray task on a cluster, retried from its checkpoint when its node is lost
    commands   one command line per cell for a cluster scheduler, each running `cell`
    cell       `python -m tapernorm_jax.studies.cell --study=DIR --cell=NAME`: one cell, from an installed package
    run_rows   run directories → one row per run
    aggregate  Table 2 over seeds, the paper's numbers
    curves     per-step metrics of the complete runs, grouped for the figures
    figures    Figures 2-4 and the training loss with the gate
    report     report.md, results.csv and `write_report`, which `experiments.report` calls
    tuning     a tuning study's report (tagged grids): each method's setting chosen on the tune split
"""
