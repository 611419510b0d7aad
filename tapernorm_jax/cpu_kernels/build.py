"""Compiling, caching and registering the C++ custom calls of this package (XLA FFI handlers, CPU only).

A source is compiled on first use with the system C++ compiler (`$CXX`, else `c++`) against jaxlib's
FFI headers, into `$TAPERNORM_CACHE` (default `~/.cache/tapernorm_jax`), keyed by the source, the flags,
jaxlib and the CPU (a `-march=native` build runs only where the CPU matches), built aside and renamed
into place so that a concurrent or interrupted build never leaves a torn library.
"""

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import jaxlib

from tapernorm_jax import files

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")


def cache_dir() -> Path:
  """Where compiled kernels are kept."""
  return Path(files.cache_dir())


def _cpu_id() -> str:
  """The CPU model and flags (a -march=native build runs only where they match)."""
  try:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
  except OSError:
    return platform.processor()
  return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))


def library(source: Path, flags: tuple[str, ...] = FLAGS) -> Path:
  """Compiles `source` into the cache (once per source, flags, jaxlib and CPU); returns the library's path."""
  compiler = shutil.which(os.environ.get("CXX", "c++"))
  if compiler is None:
    raise RuntimeError(f"no C++ compiler ({os.environ.get('CXX', 'c++')!r} is not on PATH; set CXX)")
  key = hashlib.sha256("\n".join([source.read_text(), jaxlib.__version__, _cpu_id(), compiler, *flags])
                       .encode()).hexdigest()[:16]
  built_library = cache_dir() / f"{source.stem}-{key}.so"
  if built_library.exists():
    return built_library
  built_library.parent.mkdir(parents=True, exist_ok=True)
  log.info("compiling %s into %s (once for this jaxlib and CPU)", source.name, built_library.parent)
  with tempfile.TemporaryDirectory(dir=built_library.parent) as tmp:  # built aside, renamed into place
    built = Path(tmp) / built_library.name
    result = subprocess.run([compiler, *flags, "-isystem", jax.ffi.include_dir(), str(source), "-o", str(built)],
                            capture_output=True, text=True)
    if result.returncode != 0:
      raise RuntimeError(f"{compiler} failed to build {source.name}: {result.stderr.strip()[-500:]}")
    os.replace(built, built_library)
  return built_library


def register(source: Path, targets: dict[str, str], flags: tuple[str, ...] = FLAGS) -> str:
  """Builds and loads `source` and registers each FFI target → handler symbol on CPU; '' when done, else why not."""
  try:
    loaded = ctypes.cdll.LoadLibrary(str(library(source, flags)))
    for target, symbol in targets.items():
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(loaded, symbol)), platform="cpu")
  except (OSError, RuntimeError, AttributeError) as e:
    return str(e)
  return ""
