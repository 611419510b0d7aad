"""What a model costs in FLOPs, the devices' data-sheet peaks, and MFU: arithmetic only (no jax), so reading a
study's results needs none."""

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
  """Training FLOPs per token, 6·N + 12·L·D·T (PaLM's estimate, attention included): three forward passes' worth."""
  return 3.0 * forward_flops_per_token(params, L, D, T)


def forward_flops_per_token(params: int, L: int, D: int, context: int) -> float:
  """Forward FLOPs per token attending over `context` positions, 2·N + 4·L·D·context."""
  return 2.0 * params + 4.0 * L * D * context


def mfu(tokens_per_s: float | None, flops_per_token: float, peak: float | None) -> float | None:
  """Model FLOPs utilisation against `peak` FLOP/s (all devices together); None where the peak or the rate is not
  known."""
  return tokens_per_s * flops_per_token / peak if peak and tokens_per_s else None
