"""Where a compiled train step's all-gather traffic goes: the step compiled for a TPU topology (libtpu, from any host),
each all-gather's bytes per chip (ring: 15/16 of its result on 16 chips, times the runs its loop makes) grouped by
its result's shape and dtype and the model operation it feeds (layers folded into `block_N`).

    .venv/bin/python scripts/all_gather_breakdown.py v5e:4x4 'configs/gpt2.py:model=xl,variant=all_taper' \\
        mesh.fsdp=16 train.microbatches=32

A development tool (the package never imports it); docs/tpu.md reads its output for GPT-2 XL.
"""

import ast
import collections
import importlib.util
import pathlib
import re
import sys

from tapernorm_jax.runtime import platforms

platforms.without_absent_tpu()

from absl import logging  # noqa: E402

from tapernorm_jax.aot import hlo, programs, topology  # noqa: E402
from tapernorm_jax.model import sharding  # noqa: E402
from tapernorm_jax.train import run_config  # noqa: E402


def compiled_train_step(topology_name: str, config: str, *overrides: str, slices: int = 1) -> hlo.Module:
  """The parsed HLO of `config`'s train step (`path.py:arg`, `key=value` overrides) compiled for `slices` slices of
  `topology_name`."""
  logging.set_verbosity(logging.ERROR)
  path, _, arg = config.partition(":")
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the checkout: configs/ imports configs.base
  spec = importlib.util.spec_from_file_location("config", path)
  config_module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(config_module)
  changes = {k: ast.literal_eval(v) for k, v in (o.split("=", 1) for o in overrides)}
  cfg = run_config.override(config_module.get_config(arg or None), changes)
  devices = list(topology.devices(topology_name, slices))
  mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, devices)
  step = next(p for p in programs.run_programs(cfg, mesh, None) if p.name == "train_step")
  return hlo.parse(step.lower().compile().as_text())


def main(topology_name: str, config: str, *overrides: str) -> None:
  """Prints the all-gathers of `config`'s train step on `topology_name`, the largest first."""
  module = compiled_train_step(topology_name, config, *overrides)
  devices = list(topology.devices(topology_name))
  counts = hlo.Counts.of(module)
  sent, runs = collections.Counter(), collections.Counter()
  for name, body in module.computations.items():
    for i in body:
      if i.opcode.removesuffix("-start") != "all-gather" or not counts.runs.get(name):
        continue
      n = len(hlo.replica_groups(i.attributes, len(devices))[0])
      shard = sum(hlo.array_bytes(module.shape_of(name, o)) for o in i.operands)
      op = re.search(r'op_name="([^"]*)"', i.attributes)
      key = (i.shape.split("{")[0], re.sub(r"block_\d+", "block_N", op.group(1) if op else "?").split("/")[-2:])
      key = (key[0], "/".join(key[1]))
      sent[key] += counts.runs[name] * shard * (n - 1)
      runs[key] += counts.runs[name]
  print(f"all-gather: {sum(sent.values()) / 2**30:.1f} GiB per chip per step")
  for key, b in sent.most_common(20):
    print(f"{b / 2**30:8.2f} GiB  {runs[key]:>8,.0f} runs  {key[0]:<28} {key[1]}")


if __name__ == "__main__":
  main(*sys.argv[1:])
