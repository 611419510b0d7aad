"""Reading a study, with no jax: run directories → rows (`run_rows`), Table 2 over seeds (`aggregate`), the report's
tables (`tables`), curves and figures (`curves`, `figures`, in the style of `plotting`), fits and their measured
coverage, scaling laws, predict-then-check (`predict`), a tuning study's choice (`tuning`), the throughput table
(`throughput`) and the report (`report`)."""
