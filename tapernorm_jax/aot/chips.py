"""The TPU chips a run can be compiled for, with the figures the roofline estimate uses (one table, cited).

Every figure is Google's, from the Cloud TPU system-architecture page in `source` (read 2026-12-03): peak dense
bf16 FLOP/s, HBM capacity and bandwidth, the bidirectional inter-chip interconnect (ICI) bandwidth per chip, and
the data-centre network (DCN) bandwidth per chip (v5e: two 100 Gbps NICs per host of 8 chips; v5p: 50 Gbps per
chip). Where a page gives no figure the field is None, and the estimate leaves that term out and says so.
"""

import dataclasses

GB = 1e9
GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation: its topology prefix (`v5e` in `v5e:4x4`), jax's device kind and its data-sheet figures."""

  name: str
  device_kind: str
  peak_bf16_flops: float
  hbm_bytes: float
  hbm_bandwidth: float  # bytes/s
  ici_bandwidth: float | None  # bytes/s per chip, both directions of all its links
  dcn_bandwidth: float | None  # bytes/s per chip
  chip_config: str  # libtpu's chip configuration for compile-only devices: one device per chip
  source: str


CHIPS = {
  "v4": Chip(
    "v4", "TPU v4", 275e12, 32 * GIB, 1200 * GB, None, None, "megacore", "https://cloud.google.com/tpu/docs/v4"
  ),
  "v5e": Chip(
    "v5e",
    "TPU v5 lite",
    197e12,
    16 * GIB,
    819 * GB,
    400 * GB,
    2 * 100e9 / 8 / 8,
    "default",
    "https://cloud.google.com/tpu/docs/v5e",
  ),
  "v5p": Chip(
    "v5p",
    "TPU v5",
    459e12,
    95 * GIB,
    2765 * GB,
    1200 * GB,
    50e9 / 8,
    "megacore",
    "https://cloud.google.com/tpu/docs/v5p",
  ),
  "v6e": Chip(
    "v6e", "TPU v6 lite", 918e12, 32 * GB, 1638 * GB, 800 * GB, None, "default", "https://cloud.google.com/tpu/docs/v6e"
  ),
}


def chip(topology: str) -> Chip:
  """The chip of a topology name such as `v5e:4x4`; ValueError naming the known ones otherwise."""
  name = topology.split(":", 1)[0]
  if name not in CHIPS:
    raise ValueError(
      f"--topology={topology!r}: unknown TPU generation {name!r}; give one of {sorted(CHIPS)} as "
      "GENERATION:SHAPE, e.g. v5e:4x4 or v5p:2x2x2"
    )
  return CHIPS[name]


def table_markdown() -> str:
  """The chip table as markdown (docs/tpu.md prints it)."""
  fmt = lambda x, scale, unit: "—" if x is None else f"{x / scale:,.4g} {unit}"
  rows = [
    "| chip | jax device kind | peak bf16 | HBM | HBM bandwidth | ICI per chip | DCN per chip | source |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for c in CHIPS.values():
    rows.append(
      f"| {c.name} | {c.device_kind} | {fmt(c.peak_bf16_flops, 1e12, 'TFLOP/s')} | "
      f"{fmt(c.hbm_bytes, GIB, 'GiB')} | {fmt(c.hbm_bandwidth, GB, 'GB/s')} | "
      f"{fmt(c.ici_bandwidth, GB, 'GB/s')} | {fmt(c.dcn_bandwidth, GB, 'GB/s')} | {c.source} |"
    )
  return "\n".join(rows)
