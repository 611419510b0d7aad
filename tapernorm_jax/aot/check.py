"""The compile check: every program of a run compiled for a TPU topology from any machine, nothing run.

    results = check(cfg, Target("v5e:4x4", slices=2), Decoding(batch=32, prompt_len=256))

For each program (`programs.py`): per-chip memory against the chip's HBM, the compiler's FLOPs beside the
analytic count, the collectives, the kernels, the compile time, and a roofline estimate (`analysis.py`).
A program that does not fit stops the check, and `DoesNotFit` names the need, the capacity and the settings
that would fit (`suggest.py`).
"""

import dataclasses
import datetime
import importlib.metadata
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from tapernorm_jax.aot import analysis, chips, programs, suggest, topology
from tapernorm_jax.aot.programs import Decoding
from tapernorm_jax.errors import UserError
from tapernorm_jax.model import ModelConfig, abstract_variables, param_count, sharding

RESULTS_SCHEMA = 1
GIB = 2**30


class DoesNotFit(UserError, RuntimeError):
  """A program of the run needs more memory per chip than the chip has."""


@dataclasses.dataclass(frozen=True)
class Target:
  """A TPU topology (`v5e:4x4`) and how many slices of it are joined over DCN."""

  topology: str
  slices: int = 1


def slice_indices(mesh: Any) -> list[int]:
  """The slice of each device in the mesh's order (the order of the compiled program's device ids)."""
  return [getattr(d, "slice_index", 0) or 0 for d in mesh.devices.flat]


def check(
  cfg: ml_collections.ConfigDict,
  target: Target,
  decoding: Decoding | None,
  progress: Callable[[str], None] = print,
  only: tuple[str, ...] = (),
) -> dict[str, Any]:
  """Compiles every program of `cfg`'s run for `target` (the inference programs unless `decoding` is None; only
  those named in `only` when it is given) and returns the figures; stops at the first that does not fit."""
  chip = chips.chip(target.topology)
  devices = list(topology.devices(target.topology, target.slices))
  mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, devices)
  progress(
    f"{cfg.variant} {cfg.size} on {target.slices} × {target.topology} ({len(devices)} {chip.device_kind} "
    f"chips), mesh data={mesh.shape['data']} × fsdp={mesh.shape['fsdp']}, batch {cfg.train.batch_size} × "
    f"{cfg.model.T} in {cfg.train.microbatches} microbatch(es)"
  )
  figures = []
  run = programs.run_programs(cfg, mesh, decoding)
  unknown = sorted(set(only) - {p.name for p in run})
  if unknown:
    raise ValueError(
      f"--programs={','.join(only)}: this run has no {', '.join(unknown)}; its programs are "
      f"{', '.join(p.name for p in run)}"
    )
  for program in (p for p in run if not only or p.name in only):
    progress(f"compiling {program.name} ...")
    figures.append(analysis.compile_program(program, chip, slice_indices(mesh)))
    progress(f"  {program.name}: {suggest.describe(figures[-1])}, compiled in {figures[-1].compile_s:.1f} s")
    if figures[-1].fits is False:
      break
  return {
    "schema": RESULTS_SCHEMA,
    "date": datetime.date.today().isoformat(),
    "topology": target.topology,
    "slices": target.slices,
    "chips": len(devices),
    "chip": dataclasses.asdict(chip),
    "mesh": {"data": mesh.shape["data"], "fsdp": mesh.shape["fsdp"]},
    "run": {
      "variant": cfg.variant,
      "size": cfg.size,
      "method": cfg.method,
      "model": cfg.model.to_dict(),
      "batch_size": cfg.train.batch_size,
      "microbatches": cfg.train.microbatches,
    },
    "decoding": dataclasses.asdict(decoding) if decoding else None,
    "versions": versions(),
    "programs": [dataclasses.asdict(f) for f in figures],
  }


def default_decoding(
  cfg: ml_collections.ConfigDict, target: Target, batch: int = 0, prompt_len: int = 0, tensor: int = 0
) -> Decoding:
  """Decoding `batch` rows (default: one per chip) of `prompt_len`-token prompts (default: half of model.T), the
  served model split over `tensor` chips (default: `serving_split`)."""
  chips_count = len(topology.devices(target.topology, target.slices))
  model_cfg = ModelConfig.from_config(cfg.model)
  return Decoding(
    batch=batch or chips_count,
    prompt_len=prompt_len or max(1, cfg.model.T // 2),
    tensor=tensor or serving_split(model_cfg, chips.chip(target.topology), chips_count),
  )


def serving_split(model_cfg: ModelConfig, chip: chips.Chip, chips_count: int) -> int:
  """Chips per copy of the served model: 1 where its bfloat16 weights take at most half a chip's HBM (the rest for
  the KV cache and activations), else the fewest over which its heads split evenly that bring each chip's share
  under that (the most that split, if none does)."""
  weight_bytes = 2 * param_count(abstract_variables(model_cfg))
  splits = [t for t in range(1, chips_count + 1) if chips_count % t == 0 and model_cfg.H % t == 0]
  return next((t for t in splits if weight_bytes / t <= chip.hbm_bytes / 2), splits[-1])


def suggestions(
  cfg: ml_collections.ConfigDict,
  target: Target,
  limit: int,
  enough: int | None = None,
  progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
  """The candidate splits of `cfg` over `target` (`suggest.search`), as records: the flags, whether the train step
  fits, its need and estimated step time."""
  chip, devices = chips.chip(target.topology), list(topology.devices(target.topology, target.slices))
  current = suggest.Candidate(
    sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, devices).shape["fsdp"], cfg.train.microbatches, cfg.model.remat
  )
  progress(f"trying other splits of the batch and the parameters, and remat policies (at most {limit} compiles) ...")
  found = suggest.search(cfg, devices, chip, limit, enough, skip=current if enough else None, progress=progress)
  return [
    {
      "flags": c.flags(),
      "fsdp": c.fsdp,
      "microbatches": c.microbatches,
      "remat": c.remat,
      "fits": f.fits,
      "need_bytes": f.need,
      "step_s": f.estimate.step_s if f.estimate else None,
      "bound": f.estimate.bound if f.estimate else None,
      "mfu": f.estimate.mfu if f.estimate else None,
    }
    for c, f in found
  ]


def verdict(results: dict[str, Any]) -> str | None:
  """The one line for a run that does not fit (None when every program fits)."""
  failed = next((p for p in results["programs"] if p["fits"] is False), None)
  if failed is None:
    return None
  capacity = failed["memory"].get("capacity", results["chip"]["hbm_bytes"])
  tried = results.get("suggestions")
  fixes = [s["flags"] for s in tried or [] if s["fits"]][:3]
  if failed["program"] in ("prefill", "decode_step"):
    fix = "a smaller --decode_batch or --prompt_len"
  elif fixes:
    fix = "it fits with " + " or ".join(fixes)
  elif tried is None:
    fix = "--suggest_limit=N compiles N other splits of the batch and parameters, or remat policies, until one fits"
  else:
    fix = (
      f"none of the {len(tried)} other splits tried fits: a larger topology, a smaller train.batch_size or "
      "model.remat=full"
    )
  return (
    f"{failed['program']} does not fit: it needs {failed['memory']['total'] / GIB:.2f} GiB per chip, a "
    f"{results['chip']['name']} chip has {capacity / GIB:.2f} GiB; {fix}"
  )


def versions() -> dict[str, str]:
  """jax's and libtpu's versions (libtpu's is the compiler's)."""
  try:
    libtpu = importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    libtpu = ""
  return {"jax": jax.__version__, "libtpu": libtpu}
