"""`experiments.sweep --launch=ray`: what a cell asks of the cluster, the shared-storage check, and a real Ray cluster
on loopback (a head and two worker nodes, each with one `acc` standing in for an accelerator) that loses a node while
a cell runs on it."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
import warnings

import pytest

from tapernorm_jax.studies import manifest, spec
from tapernorm_jax.studies.launch import grid, ray_launch
from locations import ROOT
from sweep_helpers import quiet, run_cli, tiny_sweep, write_sweep_file

ray = pytest.importorskip("ray")
# Every Ray address 127.0.0.1 (../shared/ENV_NOTES.md), and no usage report to Ray's servers.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
ACC = '{"acc": 1}'


def node(cpus: float = 0, alive: bool = True, **resources: float) -> dict:
  """An entry of `ray.nodes()`."""
  return {
    "NodeID": f"n{len(resources)}{cpus}",
    "NodeManagerAddress": "10.0.0.2",
    "Alive": alive,
    "Resources": {"CPU": cpus, "memory": 1e9, "node:10.0.0.2": 1.0, **resources}
    if cpus
    else {"memory": 1e9, **resources},
  }


def test_ctrl_c_stops_the_driver_even_where_a_wait_swallows_the_interrupt(monkeypatch):
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers are set in the main thread only")
  waits = []

  def wait(refs, num_returns, timeout):  # Ctrl-C lands inside the wait, which swallows the KeyboardInterrupt
    waits.append(refs)
    try:
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.05)
    except KeyboardInterrupt:
      pass
    assert len(waits) < 3, "the driver went on waiting after Ctrl-C"
    return [], refs

  monkeypatch.setattr(ray_launch, "_starts", lambda pending, progress, workdir: [])
  before = signal.getsignal(signal.SIGINT)
  with pytest.raises(KeyboardInterrupt):
    with ray_launch.ctrl_c_noted() as pressed:
      ray_launch._follow(types.SimpleNamespace(wait=wait), {"ref": None}, None, "dir", 30.0, quiet, pressed)
  assert len(waits) == 1 and signal.getsignal(signal.SIGINT) is before  # stopped at the next look; handler back


def test_a_cell_asks_for_one_accelerator_of_the_clusters_kind_else_one_nodes_cpus():
  assert ray_launch.cell_request([node(), node(8, GPU=4), node(8, GPU=4)]) == {"GPU": 1}
  assert ray_launch.cell_request([node(96, TPU=4, **{"TPU-v4-8-head": 1}), node(96, TPU=4)]) == {"TPU": 4}
  assert ray_launch.cell_request([node(), node(4), node(2), node(1, alive=False)]) == {"CPU": 2}
  assert ray_launch.cell_request([node(4), node(1, acc=1)], {"acc": 1}) == {"acc": 1}
  with pytest.raises(
    spec.SweepError,
    match=r'--cell_resources=\{"GPU": 1\}: no node of the Ray cluster offers that '
    r'\(its nodes: \{"CPU": 4\}\)',
  ):
    ray_launch.cell_request([node(4)], {"GPU": 1})
  assert ray_launch.task_options({"CPU": 2, "acc": 1}, 3) == dict(
    num_cpus=2, num_gpus=0, resources={"acc": 1}, max_retries=3, retry_exceptions=False
  )


@pytest.mark.parametrize(
  "text, message",
  [
    ("{GPU: 1}", "--cell_resources={GPU: 1}: not JSON"),
    ('{"GPU": -1}', "give a JSON object of resource names to amounts >= 0"),
    ('["GPU"]', "give a JSON object"),
    ("{}", "give a JSON object"),
  ],
)
def test_bad_cell_resources_are_one_line(text, message):
  with pytest.raises(spec.SweepError) as e:
    ray_launch.parse_resources(text)
  assert message in str(e.value) and "\n" not in str(e.value)
  assert ray_launch.parse_resources('{"GPU": 1}') == {"GPU": 1.0} and ray_launch.parse_resources("") == {}


class _BlindRay:
  """Stands in for `ray` on a cluster where the nodes in `blind` do not mount the driver's directory (they look for
  the probe file elsewhere)."""

  def __init__(self, blind: set[str]) -> None:
    self.blind = blind

  def remote(self, fn):
    def on(node_id: str):
      where = lambda path: path + ".elsewhere" if node_id in self.blind else path
      return types.SimpleNamespace(remote=lambda path, token: fn(where(path), token))

    return types.SimpleNamespace(options=lambda scheduling_strategy, **_: on(scheduling_strategy.node_id))

  def get(self, values):
    return values


def test_a_workdir_some_node_cannot_read_is_refused_in_one_line(tmp_path):
  nodes = [
    dict(node(2), NodeID="a" * 56, NodeManagerAddress="10.0.0.1"),
    dict(node(2), NodeID="b" * 56, NodeManagerAddress="10.0.0.7"),
  ]
  ray_launch.check_shared(_BlindRay(set()), str(tmp_path), nodes)  # every node reads it
  with pytest.raises(spec.SweepError) as e:
    ray_launch.check_shared(_BlindRay({"b" * 56}), str(tmp_path), nodes)
  assert str(e.value).startswith(f"--workdir={tmp_path}: the Ray node(s) at 10.0.0.7 (FileNotFoundError: ")
  assert "cannot read it; give a directory every node mounts at the same path" in str(e.value)
  assert os.listdir(tmp_path) == []  # the probe file is gone


def test_without_ray_the_launch_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "ray", None)
  with pytest.raises(ray_launch.RayMissingError, match=r"pip install 'tapernorm_jax\[cluster\]'"):
    ray_launch.import_ray()


# ----------------------------------------------------------------------------------------- a real Ray cluster


@pytest.fixture(scope="module")
def cluster():
  """A head without resources and two worker nodes with one CPU and one `acc` each, all on 127.0.0.1; its nodes see
  one CPU device each (the tests' 8 fake devices stay in this process)."""
  from ray.cluster_utils import Cluster

  with pytest.MonkeyPatch.context() as mp:
    for k, v in LOOPBACK.items():
      mp.setenv(k, v)  # kept while the cluster lives: this process's drivers connect on loopback too
    xla_flags = os.environ.pop("XLA_FLAGS", None)  # the nodes' workers see one CPU device
    try:
      with warnings.catch_warnings():  # Ray starts its processes by fork + exec: no JAX runs in the forked child
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        head = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        workers = [head.add_node(num_cpus=1, resources={"acc": 1}) for _ in range(2)]
        head.wait_for_nodes()
    finally:
      if xla_flags is not None:
        os.environ["XLA_FLAGS"] = xla_flags
    yield head, workers
    ray.shutdown()
    head.shutdown()


def study(tmp_path, data_dir: str, grids: list[dict], overrides: dict | None = None) -> tuple[str, list]:
  """A tiny sweep file in tmp_path and its cells; DIR/sweep.json written, as the sweep command writes it."""
  sweep = tiny_sweep(data_dir, grids)
  for section, fields in (overrides or {}).items():
    sweep["overrides"][section] = {**sweep["overrides"].get(section, {}), **fields}
  cells = grid.expand(sweep)
  return write_sweep_file(tmp_path / "tiny.py", sweep), cells


def test_a_study_runs_as_ray_tasks_and_a_second_launch_skips_it(cluster, tmp_path, data_dir):
  head, _ = cluster
  _, cells = study(tmp_path, data_dir, [dict(variants=["all_taper"], sizes=["cpu"])])
  workdir = str(tmp_path / "study")
  manifest.write_manifest(workdir, {"name": "tiny"}, cells)
  lines = []
  statuses = ray_launch.run(cells, workdir, address=head.address, resources={"acc": 1}, echo=lines.append)
  assert statuses[cells[0].name].state == "complete", lines
  record = manifest.read_record(os.path.join(workdir, cells[0].name))
  assert record["ray_node"] in {n["NodeID"] for n in ray.nodes()} and record["device_count"] == 1
  assert "acc" in lines[0] and "1 to run" in lines[0] and f"{cells[0].name}: complete" in lines
  assert "all_taper [" in (tmp_path / "study" / cells[0].name / "log.txt").read_text()  # the cell's bar, in its log
  again = []
  ray_launch.run(cells, workdir, address=head.address, resources={"acc": 1}, echo=again.append)
  assert "1 already done or skipped, 0 to run" in again[0]
  with pytest.raises(spec.SweepError, match=r'--cell_resources=\{"GPU": 1\}: no node .*\{"CPU": 1, "acc": 1\}'):
    ray_launch.run(cells, workdir, resources={"GPU": 1}, echo=quiet)


def _remove_a_node_mid_cell(head, workers, workdir: str, names: list[str], removed: list) -> None:
  """Removes the node of the first cell seen running past its first checkpoint, while it still runs."""
  deadline = time.time() + 600
  while time.time() < deadline and not removed:
    for name in names:
      run_dir = os.path.join(workdir, name)
      record = manifest.read_record(run_dir)
      saved = (
        [d for d in os.listdir(os.path.join(run_dir, "checkpoints"))]
        if os.path.isdir(os.path.join(run_dir, "checkpoints"))
        else []
      )
      if record.get("status") == "running" and any(d.isdigit() and int(d) > 0 for d in saved):
        victim = next(w for w in workers if w.node_id == record["ray_node"])
        head.remove_node(victim, allow_graceful=False)
        removed.append((name, manifest.last_step(run_dir)))
        return
    time.sleep(0.05)


@pytest.mark.slow
def test_a_lost_node_costs_one_checkpoint_interval_and_the_result_is_unchanged(cluster, tmp_path, data_dir):
  head, workers = cluster
  long = {"train": {"steps": 600, "log_every": 50, "diag_every": 200}, "checkpoint": {"every": 100}}
  grids = [
    dict(variants=["baseline", "all_taper"], sizes=["cpu"], seeds=[0]),
    dict(variants=["internal_taper"], sizes=["cpu"], overrides={"taper": {"taper_end": 5000}}),
  ]  # > steps
  sweep_file, cells = study(tmp_path, data_dir, grids, long)
  workdir = str(tmp_path / "study")
  flags = [
    f"--sweep={sweep_file}",
    f"--workdir={workdir}",
    "--launch=ray",
    f"--ray_address={head.address}",
    f"--cell_resources={ACC}",
    "--progress_every=5",
  ]
  removed: list = []
  good = [c.name for c in cells if c.variant != "internal_taper"]
  watcher = threading.Thread(target=_remove_a_node_mid_cell, args=(head, workers, workdir, good, removed))
  watcher.start()
  first = run_cli("experiments.sweep", *flags, check=False)
  watcher.join()
  assert removed, first.stdout
  assert first.returncode == 1 and "2 of 3 cells complete, 1 failed" in first.stdout, first.stdout + first.stderr
  assert first.stdout.rstrip().splitlines()[-1].count("internal_taper-cpu-aux1-seed0") == 1
  statuses = {c.name: manifest.cell_status(os.path.join(workdir, c.name)) for c in cells}
  assert "taper.taper_end=5000" in statuses["internal_taper-cpu-aux1-seed0"].error  # failed once: not retried
  name, step_at_loss = removed[0]
  resumed = statuses[name].results
  assert 0 < resumed["resumed_from"] <= step_at_loss and resumed["steps"] == 600
  with open(os.path.join(workdir, name, "metrics.jsonl")) as f:
    steps = [json.loads(line)["step"] for line in f if '"loss"' in line]
  assert steps == sorted(set(steps))  # no step recorded twice after the resume
  again = run_cli("experiments.sweep", *flags, "--noretry_failed", check=False)
  assert "3 already done or skipped, 0 to run" in again.stdout and again.returncode == 1
  # The same cell uninterrupted, on the node that is left: the same final validation loss, bit for bit.
  reference = [c for c in cells if c.name == name]
  manifest.write_manifest(str(tmp_path / "reference"), {"name": "ref"}, reference)
  clean = ray_launch.run(
    reference, str(tmp_path / "reference"), address=head.address, resources={"acc": 1}, echo=quiet
  )[name].results
  assert clean["resumed_from"] == 0 and clean["final_val_loss"] == resumed["final_val_loss"]


@pytest.mark.slow
def test_a_stopped_driver_is_started_again_without_losing_or_repeating_work(cluster, tmp_path, data_dir):
  head, _ = cluster
  # The first checkpoint comes at 1/12 of the run, so Ctrl-C lands long before its end even on a loaded machine.
  long = {"train": {"steps": 1200, "log_every": 50, "diag_every": 200}, "checkpoint": {"every": 100}}
  sweep_file, cells = study(tmp_path, data_dir, [dict(variants=["baseline"], sizes=["cpu"])], long)
  workdir, name = str(tmp_path / "study"), cells[0].name
  command = [
    sys.executable,
    "-m",
    "experiments.sweep",
    f"--sweep={sweep_file}",
    f"--workdir={workdir}",
    "--launch=ray",
    f"--ray_address={head.address}",
    f"--cell_resources={ACC}",
  ]
  driver = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  checkpoints = os.path.join(workdir, name, "checkpoints")
  deadline = time.time() + 300
  while time.time() < deadline and not (
    os.path.isdir(checkpoints) and any(d.isdigit() and int(d) > 0 for d in os.listdir(checkpoints))
  ):
    time.sleep(0.05)
  driver.send_signal(signal.SIGINT)  # Ctrl-C
  out, err = driver.communicate(timeout=60)
  assert driver.returncode == 130 and f"stopped: 1 cells not finished ({name})" in out, (driver.returncode, out, err)
  stopped_at = manifest.last_step(os.path.join(workdir, name))
  time.sleep(3)
  assert manifest.last_step(os.path.join(workdir, name)) == stopped_at < 1200  # the task stopped with its driver
  again = run_cli("experiments.sweep", *command[3:])
  assert "0 already done or skipped, 1 to run" in again.stdout and "1 of 1 cells complete" in again.stdout
  results = manifest.cell_status(os.path.join(workdir, name)).results
  assert 0 < results["resumed_from"] <= stopped_at and results["steps"] == 1200
  with open(os.path.join(workdir, name, "metrics.jsonl")) as f:
    steps = [json.loads(line)["step"] for line in f if '"loss"' in line]
  assert steps == sorted(set(steps)) and steps[-1] == 1199
