"""Compile-only TPU devices for a topology such as `v5e:4x4` (several slices over DCN), from the real TPU compiler.

`libtpu` (the `tpu` extra) brings the compiler to any machine, a CPU laptop included; the devices it describes
run nothing, but `jit(...).lower(...).compile()` against a mesh over them gives the TPU program with its memory and
cost figures. GPUs have no such path in jax (a CUDA topology is "not implemented"): check a GPU host with
`python -m experiments.accelerator_check` on the host itself.
"""

import contextlib
import functools
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from tapernorm_jax.aot.chips import Chip, chip
from tapernorm_jax.errors import UserError

INSTALL = "pip install -e '.[tpu]' (in a checkout) or pip install 'jax[tpu]' (the TPU compiler, libtpu; any machine)"


class MissingCompiler(UserError, RuntimeError):
  """libtpu is not installed, so nothing can be compiled for a TPU."""


def check_installed() -> None:
  """Raises MissingCompiler, naming the install command, when libtpu is absent."""
  if importlib.util.find_spec("libtpu") is None:
    raise MissingCompiler(f"compiling for a TPU needs the TPU compiler (libtpu), which is not installed: {INSTALL}")


def parse(topology: str) -> tuple[Chip, tuple[int, ...]]:
  """(chip, chips along each axis) of `v5e:4x4` or `v5p:2x2x2`; ValueError naming the flag otherwise."""
  spec = chip(topology)
  shape = topology.split(":", 1)[1] if ":" in topology else ""
  if not re.fullmatch(r"\d+(x\d+){1,2}", shape):
    raise ValueError(
      f"--topology={topology!r}: give GENERATION:SHAPE with the chips along each axis, e.g. "
      f"{spec.name}:4x4" + (" or v5p:2x2x2" if spec.name in ("v4", "v5p") else "")
    )
  return spec, tuple(int(n) for n in shape.split("x"))


@functools.cache
def devices(topology: str, slices: int = 1) -> tuple[Any, ...]:
  """The compile-only devices of `slices` slices of `topology` (one device per chip), slice by slice."""
  spec, _ = parse(topology)
  if slices < 1:
    raise ValueError(f"--slices={slices}: must be >= 1 (the number of slices joined over DCN)")
  check_installed()
  # libtpu lets one process at a time load it (a lock file in /tmp) so that two cannot both take the chips; these
  # devices take none, so compile checks, test workers and a training process on the same host may share it
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies

  with captured_stderr() as said:  # libtpu warns on stderr that this host has no TPU, which it need not have
    try:
      described = topologies.get_topology_desc(
        platform="tpu", topology_name=topology, chip_config_name=spec.chip_config, num_slices=slices
      )
    except Exception as e:  # libtpu's message names what it cannot build
      raise ValueError(
        f"--topology={topology!r} --slices={slices}: the TPU compiler cannot describe it ({e}; "
        f"it said: {said()[-500:]})"
      ) from e
  return tuple(sorted(described.devices, key=lambda d: (getattr(d, "slice_index", 0) or 0, d.id)))


@contextlib.contextmanager
def captured_stderr() -> Iterator[Callable[[], str]]:
  """Everything written to file descriptor 2 inside the block (C++ libraries' logging too), readable by the
  function it yields instead of being shown."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as sink:
    os.dup2(sink.fileno(), 2)
    try:
      yield lambda: (sink.seek(0), sink.read().decode(errors="replace"))[1]
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
