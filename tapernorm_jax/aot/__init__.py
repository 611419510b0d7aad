"""Ahead-of-time compilation for a target: every program of a run compiled for a real TPU topology from any machine.

chips.py      the TPU chips and their data-sheet figures (one cited table)
topology.py   compile-only devices of a topology (`v5e:4x4`, several slices), from libtpu
programs.py   every program a run executes, ready to lower for a mesh
hlo_text.py   the optimised HLO's text parsed into computations of instructions, and shapes' sizes
hlo.py        FLOPs, traffic, collectives and kernels read from the optimised HLO, loop trip counts included
hlo_fusion.py what a fusion reads and writes, by what its fused computation touches (slices, in-place updates)
analysis.py   one program compiled: memory, figures and a roofline estimate
suggest.py    other meshes and microbatch counts, compiled and ranked
check.py      the whole check and its one-line verdict;  report.py  its markdown page
"""
