"""Compiling, caching and registering the C++ custom calls of this package (XLA FFI handlers, CPU only).

A source is compiled on first use with the system C++ compiler (`$CXX`, else `c++`) against jaxlib's
FFI headers, into `$TAPERNORM_CACHE` (default `~/.cache/tapernorm_jax`), keyed by the source, the flags,
jaxlib and the CPU (a `-march=native` build runs only where the CPU matches), built aside and renamed
into place so that a concurrent or interrupted build never leaves a torn library, with its SHA-256 beside it
(written last): a cached library that does not match is built again, never loaded. A kernel that cannot be
built or loaded is turned off with one warning that says why and what runs instead.
"""

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jaxlib

from tapernorm_jax.storage import run_files, integrity

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
MARCH = os.environ.get("TAPERNORM_KERNEL_MARCH", "native")  # e.g. haswell: AVX2 and FMA only, as XLA's max_isa=AVX2
FLAGS = ("-O3", f"-march={MARCH}", "-std=c++17", "-shared", "-fPIC")


def cache_dir() -> Path:
  """Where compiled kernels are kept."""
  return Path(run_files.cache_dir())


def cpu_id() -> str:
  """The CPU model and flags (a -march=native build runs only where they match)."""
  try:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
  except OSError:
    return platform.processor()
  return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))


def intact(built_library: Path) -> bool:
  """Whether `built_library` is the file its build recorded: `<library>.sha256`, written after it, matches."""
  record = built_library.with_name(built_library.name + ".sha256")
  try:
    return record.read_text().strip() == integrity.sha256(built_library)
  except OSError:
    return False


def library(source: Path, flags: tuple[str, ...] = FLAGS) -> Path:
  """Compiles `source` into the cache (once per source, flags, jaxlib and CPU); returns the library's path. A cached
  library that does not match the hash its build recorded (damaged, truncated, replaced) is built again."""
  compiler = shutil.which(os.environ.get("CXX", "c++"))
  if compiler is None:
    raise RuntimeError(f"no C++ compiler ({os.environ.get('CXX', 'c++')!r} is not on PATH; set CXX)")
  key = hashlib.sha256(
    "\n".join([source.read_text(), jaxlib.__version__, cpu_id(), compiler, *flags]).encode()
  ).hexdigest()[:16]
  built_library = cache_dir() / f"{source.stem}-{key}.so"
  if built_library.exists():
    if intact(built_library):
      return built_library
    log.warning(
      "%s does not match the hash its build recorded (damaged, incomplete, or from before hashes were "
      "recorded); building it again",
      built_library,
    )
  try:
    built_library.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise RuntimeError(
      f"the kernel cache {built_library.parent} cannot be used ({e}); set TAPERNORM_CACHE to a writable directory"
    ) from None
  log.info("compiling %s into %s (once for this jaxlib and CPU)", source.name, built_library.parent)
  with tempfile.TemporaryDirectory(dir=built_library.parent) as tmp:  # built aside, renamed into place
    built = Path(tmp) / built_library.name
    result = subprocess.run(
      [compiler, *flags, "-isystem", jax.ffi.include_dir(), str(source), "-o", str(built)],
      capture_output=True,
      text=True,
    )
    if result.returncode != 0:
      raise RuntimeError(f"{compiler} failed to build {source.name}: {result.stderr.strip()[-500:]}")
    record = Path(tmp) / (built_library.name + ".sha256")
    record.write_text(integrity.sha256(built) + "\n")
    os.replace(built, built_library)
    os.replace(record, built_library.with_name(record.name))  # last: a library without it is built again
  return built_library


def register(source: Path, targets: dict[str, str], flags: tuple[str, ...] = FLAGS, without: str = "") -> str:
  """Builds and loads `source` and registers each FFI target → handler symbol on CPU; '' when done, else why not,
  after one warning that says so and what runs `without` the kernel."""
  try:
    loaded = ctypes.cdll.LoadLibrary(str(library(source, flags)))
    for target, symbol in targets.items():
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(loaded, symbol)), platform="cpu")
  except (OSError, RuntimeError, AttributeError) as e:
    warnings.warn(f"the CPU kernel {source.name} is off ({e}); {without}", RuntimeWarning, stacklevel=2)
    return str(e)
  return ""
