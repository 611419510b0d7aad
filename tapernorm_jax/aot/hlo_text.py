"""An optimised HLO module's text parsed into computations of instructions, and the shapes' sizes (aot/hlo.py counts
what they do)."""

import dataclasses
import math
import re
from typing import Iterator

_ITEMSIZE = {
  "pred": 1,
  "s4": 0.5,
  "u4": 0.5,
  "s8": 1,
  "u8": 1,
  "s16": 2,
  "u16": 2,
  "f16": 2,
  "bf16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
  "c64": 8,
  "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([^\]]*)\]")
_CALLEES = re.compile(
  r"\b(calls|to_apply|body|condition|true_computation|false_computation|branch_computations|"
  r"called_computations)=(\{[^}]*\}|%?[\w.\-]+)"
)


@dataclasses.dataclass
class Instruction:
  """One HLO instruction: `name = shape opcode(operands), attributes`."""

  name: str
  shape: str
  opcode: str
  operands: list[str]
  attributes: str
  root: bool = False


@dataclasses.dataclass
class Module:
  """Computations by name (each a list of instructions) and the entry computation's name."""

  computations: dict[str, list[Instruction]]
  entry: str

  def shape_of(self, computation: str, name: str) -> str:
    """The result shape of instruction `name` in `computation` ('' when unknown)."""
    found = self.instruction(computation, name)
    return found.shape if found else ""

  def instruction(self, computation: str, name: str) -> Instruction | None:
    """Instruction `name` of `computation` (None when there is none)."""
    return self._by_name.get(computation, {}).get(name)

  def root(self, computation: str) -> Instruction | None:
    """The instruction a computation returns."""
    return next((i for i in self.computations.get(computation, []) if i.root), None)

  def __post_init__(self):
    self._by_name = {c: {i.name: i for i in body} for c, body in self.computations.items()}


def _balanced(text: str, start: int) -> int:
  """The index just past the bracket that closes the one at `start`."""
  pairs, depth = {"(": ")", "{": "}", "[": "]"}, []
  for i in range(start, len(text)):
    if text[i] in pairs:
      depth.append(pairs[text[i]])
    elif depth and text[i] == depth[-1]:
      depth.pop()
      if not depth:
        return i + 1
  return len(text)


def _split_top(text: str) -> list[str]:
  """`text` split at the commas outside any brackets."""
  parts, depth, start = [], 0, 0
  for i, ch in enumerate(text):
    depth += ch in "([{"
    depth -= ch in ")]}"
    if ch == "," and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  return [p.strip() for p in parts + [text[start:]] if p.strip()]


def _instruction(line: str) -> Instruction | None:
  """The instruction on `line`, or None for anything else."""
  m = re.match(r"\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*", line)
  if not m:
    return None
  rest = line[m.end() :]
  end = _balanced(rest, 0) if rest.startswith("(") else rest.find(" ")
  if end < 0:
    return None
  shape, rest = rest[:end], rest[end:].lstrip()
  op = re.match(r"([a-z][\w\-]*)\(", rest)
  if not op:
    return None
  close = _balanced(rest, op.end() - 1)
  operands = [p.split()[-1].lstrip("%") for p in _split_top(rest[op.end() : close - 1])]
  return Instruction(m.group(2), shape, op.group(1), operands, rest[close:].lstrip(", "), bool(m.group(1)))


def parse(text: str) -> Module:
  """The computations of an HLO module's text (`compiled.as_text()`); an instruction may run over several lines
  (a kernel's configuration string can hold newlines)."""
  text = re.sub(r"/\*.*?\*/", "", text)
  lines: dict[str, list[str]] = {}
  entry, current = "", None
  for line in text.splitlines():
    header = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$", line)
    if header:
      current = header.group(2)
      lines[current] = []
      entry = current if header.group(1) else entry
    elif line.rstrip() == "}":
      current = None
    elif current is not None and re.match(r"\s+(?:ROOT\s+)?%?[\w.\-]+\s*=\s", line):
      lines[current].append(line)
    elif current is not None and lines[current]:  # the rest of the instruction above
      lines[current][-1] += " " + line.strip()
  if not entry:
    raise ValueError("no ENTRY computation in the HLO text")
  computations = {name: [i for i in map(_instruction, body) if i] for name, body in lines.items()}
  return Module(computations, entry)


def array_bytes(shape: str) -> float:
  """Bytes of every array in a shape (a tuple's elements summed)."""
  total = 0.0
  for dtype, dims in _ARRAY.findall(shape):
    size = _ITEMSIZE.get(dtype, 1 if dtype.startswith("f8") else 0)
    total += size * math.prod(int(d.lstrip("<=")) for d in dims.split(",") if d)
  return total


def dims(shape: str) -> list[int]:
  """The dimensions of an array shape (the first array of a tuple)."""
  found = _ARRAY.search(shape)
  return [int(d.lstrip("<=")) for d in found.group(2).split(",") if d] if found else []


def callees(instruction: Instruction) -> Iterator[tuple[str, str]]:
  """(attribute, computation) for every computation `instruction` calls."""
  for attribute, value in _CALLEES.findall(instruction.attributes):
    for name in re.findall(r"%?([\w.\-]+)", value.strip("{}")):
      yield attribute, name
