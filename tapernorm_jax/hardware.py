"""What numbers were measured on: backend, device, CPU model and caches, versions; and known peak FLOP/s."""

import os
import platform
from typing import Any

import jax

# Dense peak FLOP/s per device in bfloat16, from the vendors' data sheets, for MFU. Keys are
# substrings of `jax.Device.device_kind`; the first match wins, so longer names come first.
PEAK_BF16_FLOPS = (
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L4", 121e12),
    ("T4", 65e12),
    ("TPU v6", 918e12),
    ("TPU v5p", 459e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5e", 197e12),
    ("TPU v4", 275e12),
)


def peak_flops(device_kind: str) -> float | None:
  """The bf16 dense peak FLOP/s of one device of this kind, or None where it is not known (CPUs)."""
  return next((flops for name, flops in PEAK_BF16_FLOPS if name.lower() in device_kind.lower()), None)


def train_flops_per_token(params: int, L: int, D: int, T: int) -> float:
  """Training FLOPs per token, 6·N + 12·L·D·T (PaLM's estimate, attention included)."""
  return 6.0 * params + 12.0 * L * D * T


def mfu(tokens_per_s: float, flops_per_token: float, device_kind: str, device_count: int = 1) -> float | None:
  """Model FLOPs utilisation against the bf16 peak of `device_count` devices; None where the peak is not known."""
  peak = peak_flops(device_kind)
  return tokens_per_s * flops_per_token / (peak * device_count) if peak else None


def describe() -> dict[str, Any]:
  """Backend, device kind and count, CPU model, cores and L3 size (from Linux's /proc and /sys), versions."""
  device = jax.devices()[0]
  return {"backend": jax.default_backend(), "device": getattr(device, "device_kind", str(device)),
          "device_count": jax.device_count(), "process_count": jax.process_count(),
          "cpu": _read_first("/proc/cpuinfo", "model name") or platform.machine(), "cpu_count": os.cpu_count(),
          "l3_cache": _read_first("/sys/devices/system/cpu/cpu0/cache/index3/size"), "jax": jax.__version__,
          "python": platform.python_version()}


def one_line(hw: dict[str, Any]) -> str:
  """`Intel Xeon, 2 cores, L3 256M` on CPU; `NVIDIA H100 × 8 (gpu)` elsewhere."""
  if hw["backend"] == "cpu":
    return f"{hw['cpu']}, {hw['cpu_count']} cores, L3 {hw.get('l3_cache') or '?'}"
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
