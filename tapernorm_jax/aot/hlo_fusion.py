"""What a fusion reads from and writes to device memory, by what its fused computation touches (aot/hlo.py counts
the rest).

A scanned loop's body reads one layer's slice of each stacked (L, …) buffer and writes one layer's slice of each
stack it fills, and the TPU compiler fuses those slices into their neighbours: a parameter reached only through a
`dynamic-slice` (or `slice`, through bitcasts, reshapes and nested fusions), and a root `dynamic-update-slice`
into a parameter, whose output buffer is that operand's. Counting such a fusion's operands and result whole
charges every trip with the whole stack, L times what it moves.

    moved = fusion_bytes(module, "fused_computation.12", operand_shapes)
"""

import collections

from tapernorm_jax.aot.hlo_text import Instruction, Module, array_bytes, callees

_VIEWS = ("bitcast", "reshape")  # the same bytes seen with another shape
_SLICES = ("slice", "dynamic-slice")

Users = dict[str, dict[str, Instruction]]


def fusion_bytes(module: Module, fused: str, operand_shapes: list[str]) -> float:
  """Bytes a fusion of computation `fused`, over operands of these shapes, reads and writes: an operand every use of
  which slices it reads its slices; an output that is a `dynamic-update-slice` into an operand (in place) writes
  its update and reads nothing of that operand; every other operand and output counts whole."""
  root = module.root(fused)
  outputs = [] if root is None else root.operands if root.opcode == "tuple" else [root.name]
  written, in_place = 0.0, set()
  for name in outputs:
    update = _through_views(module, fused, name)
    into = (
      _through_views(module, fused, update.operands[0]) if update and update.opcode == "dynamic-update-slice" else None
    )
    if into is not None and into.opcode == "parameter":
      in_place.add(update.name)
      written += array_bytes(module.shape_of(fused, update.operands[1]))
    else:
      written += array_bytes(module.shape_of(fused, name))
  users = _users(module, fused)
  return written + sum(
    _operand_read(module, fused, users, k, array_bytes(shape), in_place) for k, shape in enumerate(operand_shapes)
  )


def _users(module: Module, computation: str) -> Users:
  """For every value of `computation`, the instructions that use it, by name."""
  users: Users = collections.defaultdict(dict)
  for instruction in module.computations[computation]:
    for operand in instruction.operands:
      users[operand][instruction.name] = instruction
  return users


def _through_views(module: Module, computation: str, name: str) -> Instruction | None:
  """The instruction behind `name` once bitcasts and reshapes are looked through (None where there is none)."""
  found = module.instruction(computation, name)
  while found is not None and found.opcode in _VIEWS:
    found = module.instruction(computation, found.operands[0])
  return found


def _operand_read(module: Module, fused: str, users: Users, k: int, whole: float, in_place: set[str]) -> float:
  """Bytes a fusion reads of its operand k (`whole` bytes): what its slices read where every use slices it."""
  parameter = next((i for i in module.computations[fused] if i.opcode == "parameter" and i.operands == [str(k)]), None)
  sliced = None if parameter is None else _sliced_bytes(module, fused, users, parameter.name, in_place)
  return whole if sliced is None else min(sliced, whole)


def _sliced_bytes(module: Module, fused: str, users: Users, name: str, in_place: set[str]) -> float | None:
  """Bytes the uses of value `name` read, where each one slices it, updates it in place or passes it to a nested
  fusion; None where one reads it whole (or the computation returns it)."""
  if (value := module.instruction(fused, name)) is None or value.root:
    return None
  total = 0.0
  for user in users[name].values():
    first = user.operands[0] == name
    if user.opcode in _VIEWS:
      part = _sliced_bytes(module, fused, users, user.name, in_place)
    elif user.opcode in _SLICES and first and name not in user.operands[1:]:
      part = array_bytes(user.shape)
    elif user.opcode == "dynamic-update-slice" and user.name in in_place and first and name not in user.operands[1:]:
      part = 0.0
    elif user.opcode == "fusion" and (nested := dict(callees(user)).get("calls")) in module.computations:
      whole, inner = array_bytes(module.shape_of(fused, name)), _users(module, nested)
      part = sum(
        _operand_read(module, nested, inner, k, whole, set()) for k, o in enumerate(user.operands) if o == name
      )
    else:
      return None
    if part is None:
      return None
    total += part
  return total
