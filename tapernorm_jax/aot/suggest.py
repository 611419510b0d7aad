"""Meshes, microbatch counts and remat policies for a config on a topology, each compiled, ranked by estimated step
time.

A candidate keeps the global batch, the device count and what the step computes, and changes how it runs:
`mesh.fsdp` (a divisor of one slice's chips, so FSDP's gathers stay on ICI; `mesh.data` takes the rest, across
slices over DCN), `train.microbatches` (powers of two that leave each device whole rows) and `model.remat` (what a
block keeps for its backward pass; none first, since recomputing costs time). Only the train step is compiled for
each: it is the program that needs the most memory.
"""

import copy
import dataclasses
from collections.abc import Callable, Iterator

import ml_collections

from tapernorm_jax.aot import analysis, programs
from tapernorm_jax.aot.chips import Chip
from tapernorm_jax.model import sharding
from tapernorm_jax.train import run_config


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A way to split the run over the devices."""

  fsdp: int
  microbatches: int
  remat: str = "none"

  def overrides(self) -> dict[str, int | str]:
    """The config fields this candidate sets."""
    return {"mesh.data": -1, "mesh.fsdp": self.fsdp, "train.microbatches": self.microbatches, "model.remat": self.remat}

  def flags(self) -> str:
    """The command-line overrides that select it."""
    return (
      f"--config.mesh.fsdp={self.fsdp} --config.train.microbatches={self.microbatches} "
      f"--config.model.remat={self.remat}"
    )


REMAT_ORDER = ("none", "save_matmuls", "full")  # model.remat's policies (REMAT_POLICIES), least recomputation first


def candidates(cfg: ml_collections.ConfigDict, devices: int, slices: int) -> Iterator[Candidate]:
  """Every valid (fsdp, microbatches, remat): fewest microbatches first (they run fastest), then least
  recomputation, then most parameter sharding."""
  per_slice, B = devices // slices, cfg.train.batch_size
  splits = [f for f in range(per_slice, 0, -1) if per_slice % f == 0]
  microbatches = [k for k in (2**i for i in range(12)) if B % (devices * k) == 0]
  for k in microbatches:
    for remat in REMAT_ORDER:
      for fsdp in splits:
        yield Candidate(fsdp, k, remat)


def search(
  cfg: ml_collections.ConfigDict,
  devices: list,
  chip: Chip,
  limit: int,
  enough: int | None = None,
  skip: Candidate | None = None,
  progress: Callable[[str], None] = print,
) -> list[tuple[Candidate, analysis.Figures]]:
  """Compiles the train step of up to `limit` candidates (stopping once `enough` fit), `skip` left out; returns each
  with its figures, those that fit ranked by estimated step time first."""
  found: list[tuple[Candidate, analysis.Figures]] = []
  slices = len({getattr(d, "slice_index", 0) or 0 for d in devices})
  for candidate in candidates(cfg, len(devices), slices):
    if candidate == skip:
      continue
    if len(found) >= limit or (enough and sum(f.fits is not False for _, f in found) >= enough):
      break
    trial = run_config.override(copy.deepcopy(cfg), candidate.overrides())
    mesh = sharding.make_mesh(-1, candidate.fsdp, devices)
    step = programs.run_programs(trial, mesh, None)[0]
    figures = analysis.compile_program(step, chip, [getattr(d, "slice_index", 0) or 0 for d in mesh.devices.flat])
    found.append((candidate, figures))
    progress(f"  {candidate.flags()}: {describe(figures)}")
  fits = sorted((c for c in found if c[1].fits is not False), key=lambda c: c[1].estimate.step_s)
  return fits + [c for c in found if c[1].fits is False]


def describe(figures: analysis.Figures) -> str:
  """`9.1 GiB, est. 412 ms` or `does not fit (25.5 GiB)`."""
  need = f"{figures.need / 2**30:.2f} GiB"
  if figures.fits is False:
    return f"does not fit ({need})"
  return f"{need}, est. {figures.estimate.step_s * 1e3:,.1f} ms/step" if figures.estimate else need
