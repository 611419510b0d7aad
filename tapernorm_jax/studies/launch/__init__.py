"""Launching a study: the grid (`grid`: sweep file → cells and their run configs), the in-process runner (`runner`),
`--launch=ray` (`ray_launch`), one command line per cell (`commands`) and the one-cell entry point (`cell`)."""
