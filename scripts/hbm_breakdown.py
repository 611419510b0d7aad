"""Where a compiled train step's estimated device-memory traffic goes: compile_check's count (`hlo.hbm_bytes`: what
every top-level operation reads and writes, times its runs) grouped by opcode and by the model operation it comes
from (layers folded into `block_N`), the largest first.

    .venv/bin/python scripts/hbm_breakdown.py v5e:4x4 1 configs/all_taper.py:size=1b train.batch_size=256 \\
        mesh.fsdp=16 "model.remat='save_matmuls'"

A development tool (the package never imports it); docs/tpu.md reads its output for the 1.2B train step.
"""

import collections
import re
import sys

from all_gather_breakdown import compiled_train_step

from tapernorm_jax.aot import hlo

GIB = 2**30


def main(topology_name: str, slices: str, config: str, *overrides: str) -> None:
  """Prints the traffic by opcode, then by (opcode, model operation)."""
  module = compiled_train_step(topology_name, config, *overrides, slices=int(slices))
  counts = hlo.Counts.of(module)
  by_opcode, by_operation = collections.Counter(), collections.Counter()
  for name in counts.control:
    for instruction in module.computations.get(name, []):
      moved = counts.runs.get(name, 0.0) * hlo._bytes_moved(module, name, instruction)
      op_name = re.search(r'op_name="([^"]*)"', instruction.attributes)
      operation = "/".join(re.sub(r"block_\d+", "block_N", op_name.group(1) if op_name else "?").split("/")[-3:])
      by_opcode[instruction.opcode] += moved
      by_operation[(instruction.opcode, operation)] += moved
  print(f"{sum(by_opcode.values()) / GIB:.1f} GiB per chip per step")
  for opcode, moved in by_opcode.most_common(8):
    print(f"{moved / GIB:8.1f} GiB  {opcode}")
  for (opcode, operation), moved in by_operation.most_common(16):
    print(f"{moved / GIB:8.1f} GiB  {opcode:<26} {operation}")


if __name__ == "__main__":
  main(*sys.argv[1:])
