"""One process of a multi-process training run on this machine, for tests/train/test_multihost.py.

    python tests/train/multihost_worker.py SPEC_JSON

SPEC: {"process_id", "num_processes", "port", "local_devices", "workdir", "changes" (dotted config fields),
"stop_after", "record", "compilation_cache" (a directory, or empty)}. Trains through `cli.train` (the entry points'
body; with num_processes > 1, `mesh.distributed=True` and the coordinator fields), then writes the training rows this
process loaded to `<record>/process<i>.npz`, and its JAX layout and every file under the workdir it opened for
writing, renamed or removed to `<record>/process<i>.json`.
"""

import json
import os
import sys
import traceback

SPEC = json.loads(sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

import jax  # noqa: E402 (after the checkout is on the path)

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", SPEC["local_devices"])
if SPEC.get("compilation_cache"):  # shared by the test's runs: a later run with the same layout compiles nothing
  jax.config.update("jax_compilation_cache_dir", SPEC["compilation_cache"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

import numpy as np  # noqa: E402 (after jax's platform and device count are set)

from configs import base  # noqa: E402
from tapernorm_jax import cli, data  # noqa: E402

WORKDIR = os.path.abspath(SPEC["workdir"])
written: list[str] = []


def audit(event: str, args: tuple) -> None:
  """Records every file under the workdir that this process opens for writing, creates by a rename, or removes."""
  if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
    path, mode, flags = args
    if (mode and any(c in mode for c in "wax+")) or (flags and flags & (os.O_WRONLY | os.O_RDWR)):
      written.append(os.path.abspath(os.fsdecode(path)))
  elif event in ("os.rename", "os.remove") and isinstance(args[0], (str, bytes, os.PathLike)):
    written.extend(os.path.abspath(os.fsdecode(p)) for p in args[: 2 if event == "os.rename" else 1])


class Recording:
  """A training iterator that keeps a copy of every batch it yields (checkpointing passes through)."""

  def __init__(self, it):
    self.it, self.batches = it, []

  def __iter__(self):
    return self

  def __next__(self) -> np.ndarray:
    batch = next(self.it)
    self.batches.append(np.array(batch))
    return batch

  def get_state(self):
    return self.it.get_state()

  def set_state(self, state) -> None:
    self.it.set_state(state)


def main() -> None:
  """Trains, then records what this process loaded and wrote."""
  cfg = base.override(base.get_config("all_taper"), SPEC["changes"])
  if SPEC["num_processes"] > 1:
    base.override(
      cfg,
      {
        "mesh.distributed": True,
        "mesh.coordinator_address": f"localhost:{SPEC['port']}",
        "mesh.num_processes": SPEC["num_processes"],
        "mesh.process_id": SPEC["process_id"],
      },
    )
  iterators = []
  train_iterator = data.train_iterator
  data.train_iterator = lambda *a, **k: iterators.append(Recording(train_iterator(*a, **k))) or iterators[-1]
  sys.addaudithook(audit)
  cli.train(["worker"], cfg, WORKDIR, SPEC["stop_after"])
  layout = {
    "process_index": jax.process_index(),
    "process_count": jax.process_count(),
    "local_devices": [d.id for d in jax.local_devices()],
    "devices": [d.id for d in jax.devices()],
    "collectives": jax.config.jax_cpu_collectives_implementation,
    "written": sorted({os.path.relpath(p, WORKDIR) for p in written if p.startswith(WORKDIR + os.sep)}),
  }
  name = os.path.join(SPEC["record"], f"process{SPEC['process_id']}")
  np.savez(name + ".npz", rows=np.stack(iterators[0].batches))
  with open(name + ".json", "w") as f:
    json.dump(layout, f)


if __name__ == "__main__":
  try:
    main()
  except BaseException:  # noqa: BLE001 (exit now: JAX's shutdown would wait minutes for the other process)
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
