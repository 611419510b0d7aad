"""What numbers were measured on: backend, device, CPU model and caches, versions; and the peak FLOP/s MFU is
measured against."""

import functools
import importlib.metadata
import os
import platform
import time
from typing import Any

import jax
import jax.numpy as jnp

from tapernorm_jax.runtime.costs import peak_flops


def peak() -> dict[str, Any] | None:
  """The peak FLOP/s of this job's devices that MFU is measured against, and where it comes from: the data sheet's
  bf16 peak per accelerator × their count; on CPUs, the best rate of a large jitted float32 GEMM measured here
  (`measured_gemm_flops`) × the processes (fake CPU devices share one host's cores); None where neither is known."""
  device = jax.devices()[0]
  per_device = peak_flops(device.device_kind)
  if per_device:
    return {
      "flops": per_device * jax.device_count(),
      "source": f"{jax.device_count()} × the {device.device_kind}'s "
      f"dense bf16 peak (data sheet, {per_device / 1e12:,.0f} TFLOP/s each)",
    }
  if device.platform == "cpu":
    host = measured_gemm_flops()
    return {
      "flops": host * jax.process_count(),
      "source": f"this CPU's measured float32 GEMM rate (a jitted 2048³ "
      f"matmul, best of 5: {host / 1e9:,.0f} GFLOP/s per host)",
    }
  return None


@functools.lru_cache(maxsize=1)
def measured_gemm_flops(n: int = 2048, repeats: int = 5) -> float:
  """The best FLOP/s of a jitted float32 n × n × n matmul on the default device (once per process, ~1 s on CPUs)."""
  a = jnp.ones((n, n), jnp.float32)
  matmul = jax.jit(lambda a: a @ a)
  matmul(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    matmul(a).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n**3 / best


# The instruction sets a CPU result depends on, as /proc/cpuinfo's flags name them → as the docs write them.
ISA_FLAGS = (
  ("avx2", "AVX2"),
  ("fma", "FMA"),
  ("avx512f", "AVX-512"),
  ("avx512_bf16", "AVX512-BF16"),
  ("avx512_vnni", "AVX512-VNNI"),
  ("amx_tile", "AMX"),
  ("amx_bf16", "AMX-BF16"),
)


def cpu_identity(cpuinfo: str | None = None) -> dict[str, Any]:
  """The exact CPU: vendor, family, model and stepping, model name and the ISA extensions that matter here, from
  the first processor of /proc/cpuinfo (`cpuinfo`: its text, for tests); {} where there is none."""
  if cpuinfo is None:
    try:
      with open("/proc/cpuinfo") as f:
        cpuinfo = f.read()
    except OSError:
      return {}
  fields: dict[str, str] = {}
  for line in cpuinfo.split("\n\n", 1)[0].splitlines():
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())
  flags = set(fields.get("flags", "").split())
  as_int = lambda key: int(fields[key]) if fields.get(key, "").isdigit() else None
  return {
    "vendor": fields.get("vendor_id", ""),
    "family": as_int("cpu family"),
    "model": as_int("model"),
    "stepping": as_int("stepping"),
    "model_name": fields.get("model name", ""),
    "isa": [name for flag, name in ISA_FLAGS if flag in flags],
  }


def library_versions() -> dict[str, str]:
  """The versions a measurement depends on: python, jax, jaxlib, numpy, flax, optax where installed."""
  versions = {"python": platform.python_version()}
  for module in ("jax", "jaxlib", "numpy", "flax", "optax"):
    try:
      versions[module] = importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
      continue
  return versions


def usable_cores() -> int:
  """The cores this process may run on (its affinity mask where the OS has one)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def describe() -> dict[str, Any]:
  """Backend, device kind and count, the exact CPU (`cpu_identity`), usable cores and L3 size (from Linux's /proc and
  /sys), library versions."""
  device, ident = jax.devices()[0], cpu_identity()
  return {
    "backend": jax.default_backend(),
    "device": getattr(device, "device_kind", str(device)),
    "device_count": jax.device_count(),
    "process_count": jax.process_count(),
    "cpu": ident.get("model_name") or platform.machine(),
    "cpu_count": os.cpu_count(),
    "usable_cores": usable_cores(),
    "cpu_identity": ident,
    "l3_cache": _read_first("/sys/devices/system/cpu/cpu0/cache/index3/size"),
    "jax": jax.__version__,
    "python": platform.python_version(),
    "libraries": library_versions(),
    "isa_limit": isa_limit(),
  }


def isa_limit() -> str:
  """The instruction set XLA and the CPU kernels are held to (`--xla_cpu_max_isa`, `TAPERNORM_KERNEL_MARCH`), or ''."""
  limits = [
    flag.split("=", 1)[1] for flag in os.environ.get("XLA_FLAGS", "").split() if flag.startswith("--xla_cpu_max_isa=")
  ]
  march = os.environ.get("TAPERNORM_KERNEL_MARCH", "native")
  return ", ".join([*(f"XLA {x}" for x in limits), *([f"kernels -march={march}"] if march != "native" else [])])


def one_line(hw: dict[str, Any]) -> str:
  """`AMD EPYC (AuthenticAMD family 25 model 17 stepping 1; AVX2 FMA AVX-512), 2 cores, L3 32768 KB` on CPU (the
  exact identity where the record has it); `NVIDIA H100 × 8 (gpu)` elsewhere."""
  if hw["backend"] == "cpu":
    limit = f", limited to {hw['isa_limit']}" if hw.get("isa_limit") else ""
    ident = hw.get("cpu_identity") or {}
    exact = (
      (
        f" ({ident['vendor']} family {ident['family']} model {ident['model']} stepping {ident['stepping']}; "
        f"{' '.join(ident['isa']) or 'no AVX2'})"
      )
      if ident.get("vendor")
      else ""
    )
    return f"{hw['cpu']}{exact}, {hw['cpu_count']} cores, L3 {hw.get('l3_cache') or '?'}{limit}"
  return f"{hw['device']} × {hw['device_count']} ({hw['backend']})"


def _read_first(path: str, key: str | None = None) -> str | None:
  """The first line of a small system file (or the value of its first `key: value` line); None if absent."""
  try:
    with open(path) as f:
      for line in f:
        if key is None:
          return line.strip()
        if line.startswith(key):
          return line.split(":", 1)[1].strip()
  except OSError:
    return None
  return None


def resident_mb() -> float | None:
  """This process's resident memory now, in MB (from /proc/self/statm; None where there is none)."""
  pages = _read_first("/proc/self/statm")
  return int(pages.split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6 if pages else None
