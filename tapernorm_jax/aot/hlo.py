"""Figures read from an optimised HLO module's text, each counted as many times as it runs per call.

XLA's own cost analysis counts a while loop's body once, however many times it runs (a gradient-accumulation
scan of k microbatches reads as one), so the compile check reads the module itself: the products' FLOPs
(`dot`, and `convolution`, which the TPU compiler turns dots into), the bytes every top-level operation moves
to and from device memory (both to add what the cost analysis leaves out of repeated loop bodies; a fusion's by
what its fused computation touches, `hlo_fusion.py`, so a scanned loop's trip moves one layer's slice of each
stacked buffer, not the stack), the collectives (kind, count, bytes each device sends, and whether a group spans
slices), and the custom calls (Pallas kernels by name). A loop's trip count comes from XLA's
`known_trip_count` or from its condition (`counter < N`, counting from 0 as jax's loops do); a loop whose count
cannot be read is counted once and reported.

    module = parse(compiled.as_text())
    counts = Counts.of(module)          # how many times each computation runs
    product_flops(module, counts.runs), hbm_bytes(module, counts, counts.runs)
    collectives(module, counts, device_slices), custom_calls(module, counts)
"""

import collections
import dataclasses
import math
import re

import numpy as np

from tapernorm_jax.aot import hlo_fusion

# hlo.parse and hlo.Module are what callers read a module with: the parser's names are this module's too
from tapernorm_jax.aot.hlo_text import Instruction, Module, array_bytes, callees, dims, parse  # noqa: F401

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
# Operations that move no data of their own: views, tuples, parameters and constants.
FREE = {
  "parameter",
  "get-tuple-element",
  "tuple",
  "bitcast",
  "constant",
  "after-all",
  "partition-id",
  "replica-id",
  "copy-done",
  "all-gather-done",
  "all-reduce-done",
  "collective-permute-done",
  "async-done",
  "slice-done",
}


@dataclasses.dataclass
class Counts:
  """How many times each computation runs per call of the entry, and which of them are control flow (not fused)."""

  runs: dict[str, float]
  control: set[str]
  unknown_loops: int

  def repeats(self) -> dict[str, float]:
    """Runs beyond the first: what a count that sees each computation once (XLA's cost analysis) leaves out."""
    return {name: runs - 1.0 for name, runs in self.runs.items() if runs > 1.0}

  @classmethod
  def of(cls, module: Module) -> "Counts":
    """Walks the call graph from the entry, multiplying by loop trip counts."""
    order, seen = [], set()

    def visit(name: str) -> None:  # post-order: callees first
      if name in seen or name not in module.computations:
        return
      seen.add(name)
      for instruction in module.computations[name]:
        for _, callee in callees(instruction):
          visit(callee)
      order.append(name)

    visit(module.entry)
    runs: dict[str, float] = collections.defaultdict(float)
    runs[module.entry] = 1.0
    control, unknown = {module.entry}, 0
    for name in reversed(order):  # callers before callees
      for instruction in module.computations[name]:
        trip = None
        if instruction.opcode == "while":
          trip = trip_count(module, name, instruction)
          unknown += trip is None
        for attribute, callee in callees(instruction):
          if attribute == "to_apply" and instruction.opcode != "call":  # a reducer's scalar body
            continue
          runs[callee] += runs[name] * ((trip or 1) + (attribute == "condition"))
          if name in control and instruction.opcode != "fusion":  # a fusion's inner steps stay on the chip
            control.add(callee)
    return cls(dict(runs), control, unknown)


def trip_count(module: Module, computation: str, loop: Instruction) -> int | None:
  """A while loop's trip count: XLA's `known_trip_count`, else from a condition `i < N` (or `N > i`) on a counter
  that the body steps by a constant (1 and a start of 0 when that cannot be read, as jax's loops do; XLA's
  windowed matrix products step by 2); None if no bound can be read."""
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attributes)
  if known:
    return int(known.group(1))
  called = dict(callees(loop))
  condition, body = called.get("condition", ""), called.get("body", "")
  for compare in module.computations.get(condition, []):
    direction = re.search(r"direction=(LT|GT)", compare.attributes)
    if compare.opcode != "compare" or not direction or len(compare.operands) != 2:
      continue
    counter_name, bound_name = compare.operands if direction.group(1) == "LT" else compare.operands[::-1]
    bound = _constant(module, condition, bound_name)
    if bound is None:
      continue
    counter = module.instruction(condition, counter_name)
    index = _tuple_index(counter)
    step = _counter_step(module, body, index) if index is not None else None
    start = _constant_element(module, computation, loop.operands[0], index) if index is not None else None
    step, start = step or 1, start or 0
    return max(0, -(-(bound - start) // step))
  return None


def _constant(module: Module, computation: str, name: str) -> int | None:
  """The integer value of a scalar constant (through copies), or None."""
  instruction = module.instruction(computation, name)
  while instruction is not None and instruction.opcode == "copy":
    instruction = module.instruction(computation, instruction.operands[0])
  if instruction is None or instruction.opcode != "constant" or not instruction.operands:
    return None
  return int(instruction.operands[0]) if re.fullmatch(r"-?\d+", instruction.operands[0]) else None


def _tuple_index(instruction: Instruction | None) -> int | None:
  """k of a `get-tuple-element(..., index=k)`, or None."""
  if instruction is None or instruction.opcode != "get-tuple-element":
    return None
  found = re.search(r"index=(\d+)", instruction.attributes)
  return int(found.group(1)) if found else None


def _counter_step(module: Module, body: str, index: int) -> int | None:
  """c where the loop body returns element `index` as `element + c`, or None."""
  root = module.root(body)
  if root is None or root.opcode != "tuple" or index >= len(root.operands):
    return None
  update = module.instruction(body, root.operands[index])
  if update is None or update.opcode != "add":
    return None
  for this, other in (update.operands, update.operands[::-1]):
    if _tuple_index(module.instruction(body, this)) == index and (c := _constant(module, body, other)) is not None:
      return c
  return None


def _constant_element(module: Module, computation: str, tuple_name: str, index: int) -> int | None:
  """The constant a `tuple(...)` instruction puts at `index`, or None."""
  made = module.instruction(computation, tuple_name)
  if made is None or made.opcode != "tuple" or index >= len(made.operands):
    return None
  return _constant(module, computation, made.operands[index])


def product_flops(module: Module, runs: dict[str, float]) -> float:
  """FLOPs of every matrix product and convolution (2 per multiply-add), times `runs` of its computation."""
  total = 0.0
  for name, body in module.computations.items():
    for instruction in body:
      if instruction.opcode in ("dot", "convolution") and runs.get(name, 0.0) > 0:
        total += runs[name] * _product_flops(module, name, instruction)
  return total


def _product_flops(module: Module, computation: str, instruction: Instruction) -> float:
  """2 × what each output element sums over, for every output element."""
  if instruction.opcode == "dot":
    lhs = dims(module.shape_of(computation, instruction.operands[0]))
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instruction.attributes)
    summed = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d) if contracting else 1
    return 2.0 * math.prod(dims(instruction.shape)) * summed
  return _convolution_flops(
    dims(module.shape_of(computation, instruction.operands[0])),
    dims(module.shape_of(computation, instruction.operands[1])),
    dims(instruction.shape),
    instruction.attributes,
  )


def _convolution_flops(lhs: list[int], rhs: list[int], out: list[int], attributes: str) -> float:
  """2 × batch × output features × input features × the (output, window) position pairs that land on input
  rather than on padding or dilation holes, per spatial axis: the TPU compiler writes matrix products (batched
  ones too) as convolutions whose spatial windows mostly cover padding."""
  labels = re.search(r"dim_labels=([^_\s,]+)_([^\-\s,]+)->([^\s,]+)", attributes)
  if not labels:
    return 0.0
  lhs_l, rhs_l, out_l = labels.groups()
  window = re.search(r"window=\{([^}]*)\}", attributes)
  fields = dict(re.findall(r"(\w+)=([\w\-]+)", window.group(1))) if window else {}
  axes = sorted((c for c in lhs_l if c.isdigit()), key=int)  # the window lists the spatial axes as 0, 1, 2, ...
  per_axis = lambda key, default: [int(v) for v in fields[key].split("x")] if key in fields else [default] * len(axes)
  size, stride = per_axis("size", 1), per_axis("stride", 1)
  lhs_dilate, rhs_dilate = per_axis("lhs_dilate", 1), per_axis("rhs_dilate", 1)
  pads = (
    [[int(p) for p in pad.split("_")] for pad in fields["pad"].split("x")] if "pad" in fields else [[0, 0]] * len(axes)
  )
  pairs = 1
  for j, axis in enumerate(axes):
    n_in, n_out = lhs[lhs_l.index(axis)], out[out_l.index(axis)]
    position = np.arange(n_out)[:, None] * stride[j] + np.arange(size[j])[None, :] * rhs_dilate[j] - pads[j][0]
    pairs *= int(np.sum((position >= 0) & (position <= (n_in - 1) * lhs_dilate[j]) & (position % lhs_dilate[j] == 0)))
  return 2.0 * out[out_l.index("b")] * rhs[rhs_l.index("o")] * rhs[rhs_l.index("i")] * pairs


def hbm_bytes(module: Module, counts: Counts, runs: dict[str, float]) -> float:
  """Bytes read and written by every top-level operation (`_bytes_moved`; a fusion's inner steps stay on the chip),
  times `runs` of its computation: an upper bound on device-memory traffic, since the compiler keeps some of it in
  on-chip memory."""
  total = 0.0
  for name in counts.control:
    for instruction in module.computations.get(name, []):
      total += runs.get(name, 0.0) * _bytes_moved(module, name, instruction)
  return total


def _bytes_moved(module: Module, computation: str, instruction: Instruction) -> float:
  """What one top-level instruction reads and writes: its operands and result, except that a slice reads only what
  it returns, an in-place update writes only its update, a fusion counts what its fused computation touches in the
  same way (`hlo_fusion.py`), an asynchronous copy or transfer reads and writes its operand once, and the
  compiler's own plumbing (views, the `-done` halves, CamelCase custom calls) moves nothing of its own."""
  op = instruction.opcode
  if (
    op in FREE
    or op == "while"
    or (op == "custom-call" and re.search(r'custom_call_target="[A-Z]', instruction.attributes))
  ):
    return 0.0
  operands = sum(array_bytes(module.shape_of(computation, o)) for o in instruction.operands)
  if op in ("slice", "dynamic-slice"):
    return 2.0 * array_bytes(instruction.shape)
  if op == "slice-start":  # its result holds the operand beside the slice
    return 2.0 * (array_bytes(instruction.shape) - operands)
  if op.endswith("-start"):  # a copy or transfer: its operand read once and written once
    return 2.0 * operands
  if op == "dynamic-update-slice":
    return 2.0 * array_bytes(module.shape_of(computation, instruction.operands[1]))
  if op == "fusion" and (fused := dict(callees(instruction)).get("calls")) in module.computations:
    return hlo_fusion.fusion_bytes(module, fused, [module.shape_of(computation, o) for o in instruction.operands])
  return array_bytes(instruction.shape) + operands


@dataclasses.dataclass
class Collective:
  """One collective instruction: kind, runs per call, group size, bytes each device sends per run, and whether a
  group spans slices (then it crosses the data-centre network)."""

  kind: str
  runs: float
  group: int
  bytes_sent: float
  crosses_slices: bool


def collectives(module: Module, counts: Counts, device_slices: list[int]) -> list[Collective]:
  """Every collective that runs, with the bytes each device sends (ring algorithms: all-gather (n−1)·shard,
  reduce-scatter and all-to-all (n−1)/n·input, all-reduce 2(n−1)/n·input, a permute its input). A program for
  several slices is compiled per slice: its groups name one slice's devices, and what crosses slices is a `send`
  to the multi-slice runtime (`_xla_megascale_transfer_type`), counted as a collective over the slices."""
  found = []
  slices = len(set(device_slices))
  for name, body in module.computations.items():
    runs = counts.runs.get(name, 0.0)
    for instruction in body:
      if dcn := re.search(r'_xla_megascale_transfer_type="(\w+)"', instruction.attributes):
        if instruction.opcode == "send" and runs:  # a multi-slice program's collective between slices
          sent = array_bytes(module.shape_of(name, instruction.operands[0]))
          kind = dcn.group(1).lower().replace("_", "-")
          found.append(Collective(kind, runs, slices, _ring_bytes(kind, sent, slices), True))
        continue
      kind = instruction.opcode.removesuffix("-start")
      if kind not in COLLECTIVES or not runs:
        continue
      sent_in = sum(array_bytes(module.shape_of(name, o)) for o in instruction.operands)
      groups = replica_groups(instruction.attributes, len(device_slices))
      n = len(groups[0]) if groups else 1
      crosses = any(len({device_slices[d] for d in group if d < len(device_slices)}) > 1 for group in groups)
      found.append(Collective(kind, runs, n, _ring_bytes(kind, sent_in, n), crosses))
  return found


def _ring_bytes(kind: str, sent_in: float, n: int) -> float:
  """Bytes each of n devices sends for a collective over `sent_in` bytes of its own, as a ring does it."""
  n = max(n, 1)
  return {"all-gather": sent_in * (n - 1), "all-reduce": 2 * sent_in * (n - 1) / n, "collective-permute": sent_in}.get(
    kind, sent_in * (n - 1) / n
  )


def replica_groups(attributes: str, devices: int) -> list[list[int]]:
  """The device groups of a collective, from any of XLA's three spellings (explicit lists, `[G,N]<=[dims]T(perm)`,
  `mesh['a'=2,'b'=4] {'b'}`) or a permute's source-target pairs; one group of every device when empty."""
  explicit = re.search(r"(?:replica_groups|source_target_pairs)=(\{\{[\d,{} ]*\}\})", attributes)
  if explicit:
    return [[int(d) for d in g.split(",") if d.strip()] for g in re.findall(r"\{([\d, ]*)\}", explicit.group(1)[1:-1])]
  iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attributes)
  if iota:
    shape, reshape = [int(d) for d in iota.group(1).split(",")], [int(d) for d in iota.group(2).split(",")]
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    if iota.group(3):
      ids = ids.transpose([int(d) for d in iota.group(3).split(",")])
    return ids.reshape(shape[0], -1).tolist()
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes)
  if mesh:
    axes = re.findall(r"'(\w+)'=(\d+)", mesh.group(1))
    names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
    over = [names.index(a) for a in re.findall(r"'(\w+)'", mesh.group(2))]
    ids = np.moveaxis(np.arange(math.prod(sizes)).reshape(sizes), over, list(range(len(sizes) - len(over), len(sizes))))
    return ids.reshape(-1, math.prod(sizes[i] for i in over)).tolist()
  return [list(range(devices))]


def custom_calls(module: Module, counts: Counts) -> dict[str, float]:
  """Runs per call of each kernel called as a custom call: a Pallas/Mosaic kernel by its name, other targets by
  theirs; the compiler's own CamelCase plumbing (AsyncCollectiveStart, SliceId, ...) left out."""
  found: dict[str, float] = collections.defaultdict(float)
  for name, body in module.computations.items():
    for instruction in body:
      if instruction.opcode != "custom-call" or not counts.runs.get(name):
        continue
      target = re.search(r'custom_call_target="([^"]+)"', instruction.attributes)
      target = target.group(1) if target else "?"
      if re.match(r"[A-Z]", target):
        continue
      kernel = re.sub(r"\.\d+$", "", instruction.name) if target == "tpu_custom_call" else target
      found[kernel] += counts.runs[name]
  return dict(found)
