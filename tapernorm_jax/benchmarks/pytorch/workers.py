"""Contenders in processes of their own: the line protocol between a benchmark's coordinator and its workers.

A worker holds one contender (a compiled step and its state) for as long as the coordinator needs it. It writes
one JSON line when it is ready (what it is: `Contender.describe`, and the malloc setting it runs with), then
answers each command on its stdin with one JSON line:

    check            one step from the initial weights: `Contender.check` (its loss, where it left its parameters)
    warmup N S       N untimed steps; then how many steps make a sample of at least S seconds (timed)
    time             one timed sample of that many steps: {"seconds": seconds per step}
    quit             exits

A command that fails is answered {"error": one line} (the traceback goes to stderr). The coordinator asks its
workers in turn, one at a time, so rounds interleave as `timing.time_interleaved`'s do while every contender keeps
its own process, allocator and threads. This module imports the standard library and
tapernorm_jax.runtime.allocator only: a worker of another framework (experiments/peer_train_hf.py's PyTorch) imports
it without jax.
"""

import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import IO, Any, Protocol

from tapernorm_jax.runtime import allocator

READY_TIMEOUT_S = 600.0  # imports and building the contender
COMMAND_TIMEOUT_S = 1800.0  # a first step compiles (torch.compile of a 30M model's step: minutes on 2 cores)


class WorkerError(RuntimeError):
  """A worker failed a command, or died, or did not answer in time."""


class Contender(Protocol):
  """One contender's step inside its worker."""

  def describe(self) -> dict[str, Any]:
    """What the coordinator needs to know about it (dtypes, what is compiled, ...)."""

  def check(self) -> dict[str, Any]:
    """One step from the initial weights: {"loss": ..., ...}, or {"na": reason} where it cannot run."""

  def step(self) -> Any:
    """Starts one step; returns what `wait` waits for."""

  def wait(self, out: Any) -> None:
    """Returns once the step that returned `out` (and every one before it) is done."""


def allocator_setting() -> dict[str, Any]:
  """The malloc setting this worker runs with (`allocator.in_effect`), as a benchmark row names it: `setting` (default
  or project settings), `keep_freed_memory` (set, or why not) and `set_before_jax`."""
  effect = allocator.in_effect()
  return {
    "setting": "project settings" if effect["keeps_freed_memory"] else "default",
    "keep_freed_memory": effect["why_not"] or "set",
    "set_before_jax": effect.get("set_before_jax", False),
  }


def protocol_stream() -> IO[str]:
  """This process's stdout, for the replies alone: file descriptor 1 (and `sys.stdout`) then go to stderr, so what
  a library prints cannot break a reply."""
  replies = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  return replies


def reason(error: BaseException) -> str:
  """An exception as one short line: its type and the first line of its message."""
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")


def main(argv: list[str], make: Callable[[dict[str, Any]], Contender], usage: str) -> None:
  """A worker process's body: SPEC (JSON) from `argv[1]`, replies on the original stdout, `make(SPEC)` served."""
  if len(argv) != 2:
    sys.exit(f"usage: {usage}")
  spec = json.loads(argv[1])
  replies = protocol_stream()
  header = {"contender": spec["contender"], "pid": os.getpid(), "allocator": allocator_setting()}
  serve(lambda: make(spec), sys.stdin, replies, header)


def serve(make: Callable[[], Contender], commands: IO[str], replies: IO[str], header: dict[str, Any]) -> None:
  """The worker's loop: builds the contender, says it is ready (`header` and its description), answers commands."""
  reply = lambda message: replies.write(json.dumps(message) + "\n") or replies.flush()
  try:
    session = Session(make())
  except Exception as e:  # noqa: BLE001 (the coordinator reports it)
    traceback.print_exc()
    reply({**header, "error": reason(e)})
    return
  reply({**header, **session.contender.describe()})
  for line in commands:
    if line.split()[:1] == ["quit"]:
      return
    if line.strip():
      reply(session.answer(line))


class Session:
  """A contender and what the commands so far set (the steps per sample)."""

  def __init__(self, contender: Contender):
    self.contender, self.loops = contender, 1

  def answer(self, line: str) -> dict[str, Any]:
    """The reply to one command line (not `quit`); {"error": ...} where it fails."""
    command, *args = line.split()
    try:
      if command == "check":
        return self.contender.check()
      if command == "warmup":
        timed(self.contender, max(int(args[0]), 1))  # a recompile (torch.compile's second call) lands here
        per_step = timed(self.contender, 1)
        per_step = timed(self.contender, max(1, math.ceil(0.1 / max(per_step, 1e-9))))  # steady state, ~0.1 s
        self.loops = max(1, math.ceil(float(args[1]) / max(per_step, 1e-9)))
        return {"seconds": per_step, "loops": self.loops}
      if command == "time":
        return {"seconds": timed(self.contender, self.loops), "loops": self.loops}
      return {"error": f"unknown command {command!r}"}
    except Exception as e:  # noqa: BLE001 (the coordinator stops the run with it)
      traceback.print_exc()
      return {"error": reason(e)}


def timed(contender: Contender, steps: int) -> float:
  """Seconds per step of `steps` steps in a row, waiting for the last one only (as a training loop runs)."""
  t0 = time.perf_counter()
  for _ in range(steps):
    out = contender.step()
  contender.wait(out)
  return (time.perf_counter() - t0) / steps


class WorkerProcess:
  """The coordinator's side of one worker: a process started with `argv` and `env`, its stderr in `log_path`."""

  def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: str, cwd: str | None = None):
    self.name, self.log_path = name, log_path
    with open(log_path, "w") as log:
      self.process = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=cwd
      )
    self.lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()
    self.ready = self._reply(READY_TIMEOUT_S, "starting")

  def _read(self) -> None:
    """Moves the worker's reply lines into the queue; '' at its end."""
    for line in self.process.stdout:
      self.lines.put(line)
    self.lines.put("")

  def request(self, command: str, timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
    """Sends one command and returns the worker's reply; WorkerError if it failed, died or timed out."""
    try:
      self.process.stdin.write(command + "\n")
      self.process.stdin.flush()
    except BrokenPipeError:
      pass  # the reply's end of file says the worker died
    return self._reply(timeout_s, command)

  def _reply(self, timeout_s: float, command: str) -> dict[str, Any]:
    """The next reply line as a dict, or WorkerError with the end of the worker's stderr."""
    try:
      line = self.lines.get(timeout=timeout_s)
    except queue.Empty:
      self.process.kill()
      raise WorkerError(f"{self.name} worker: no answer to {command!r} within {timeout_s:g} s{self.tail()}") from None
    if not line:
      code = self.process.wait()
      raise WorkerError(f"{self.name} worker exited (code {code}) during {command!r}{self.tail()}")
    message = json.loads(line)
    if "error" in message:
      raise WorkerError(f"{self.name} worker: {command!r} failed: {message['error']}{self.tail()}")
    return message

  def tail(self, lines: int = 15) -> str:
    """The last lines of the worker's stderr, indented, after a newline ('' if it wrote none)."""
    try:
      with open(self.log_path) as f:
        text = f.read().strip().splitlines()[-lines:]
    except OSError:
      return ""
    return "".join(f"\n  | {line}" for line in text)

  def close(self) -> None:
    """Asks the worker to quit; kills it if it has not exited within 30 s."""
    if self.process.poll() is None:
      try:
        self.process.stdin.write("quit\n")
        self.process.stdin.close()
      except (BrokenPipeError, OSError):
        pass
      try:
        self.process.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()


class InProcessWorker:
  """A contender in this process behind `WorkerProcess`'s interface (for tests, and for a debugger)."""

  def __init__(self, name: str, contender: Contender, header: dict[str, Any]):
    self.name, self.session = name, Session(contender)
    self.ready = {**header, **contender.describe()}

  def request(self, command: str, timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
    """The contender's reply to `command`; WorkerError if it failed."""
    message = self.session.answer(command)
    if "error" in message:
      raise WorkerError(f"{self.name} worker: {command!r} failed: {message['error']}")
    return message

  def close(self) -> None:
    """Nothing to stop."""
