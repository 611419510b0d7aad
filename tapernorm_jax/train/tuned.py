"""Tuned presets: each method's setting (learning rate and its own knob) as the tuning study chose it on the tune
split at the sizes it tuned (docs/studies.md, "Tuning"), applied by `run_config.get_config` unless its argument says
`tuned=0`. The presets are `tuned.json` beside this module, in the format `experiments.report` writes a tuning study's
tuning.json: `{"<variant>:aux=<0|1>": {"<size>": {"tag", "overrides", "tune_loss", "seeds"} | null}}`; a method and
size it does not name keep the defaults. Adopting a new tuning study is copying its tuning.json here."""

import functools
import json
import os
from typing import Any

TUNED_FILE = os.path.join(os.path.dirname(__file__), "tuned.json")


@functools.lru_cache(maxsize=4)
def presets(path: str) -> dict[str, Any]:
  """The presets file, read once; {} where it does not exist."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def preset(variant: str, aux: bool, size: str) -> tuple[str, dict[str, Any]] | None:
  """(the chosen setting's tag, its dotted overrides, JSON lists as tuples) for a method at a size; None where the
  tuning study chose none (no setting trained) or never tuned it."""
  entry = presets(TUNED_FILE).get(f"{variant}:aux={int(aux)}", {}).get(size)
  if not entry:
    return None
  return entry["tag"], {k: tuple(v) if isinstance(v, list) else v for k, v in entry["overrides"].items()}
