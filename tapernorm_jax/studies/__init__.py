"""Studies: grids of sizes × variants × seeds, their runners, and the report (table, figures) over their runs."""
