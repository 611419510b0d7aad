"""The Hugging Face Hub as a source of model and tokenizer files: a local directory, or a hub name fetched on demand.

Needs only `huggingface_hub` (no jax): the GPT-2 tokenizer resolves its files here too.
"""

import json
import os
from pathlib import Path

import huggingface_hub
from huggingface_hub import errors as hub_errors
from huggingface_hub.utils import validate_repo_id

from tapernorm_jax.errors import UserError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MODEL_FILES = (CONFIG_FILE, WEIGHTS_FILE)


class HubUnavailableError(UserError, OSError):
  """A hub name could not be fetched (offline, or the hub refused) and is not a local directory either."""


def resolve(source: str | os.PathLike, names: tuple[str, ...], loader: str) -> Path:
  """A local directory holding the files `names`, or the hub snapshot of repo `source` with just those files."""
  path = Path(source).expanduser()
  if path.is_dir():
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
      raise FileNotFoundError(
        f"{path} has no {', '.join(missing)}; {loader} reads a directory holding "
        f"{', '.join(names)} (the Hugging Face layout)"
      )
    return path
  repo = str(source)
  try:
    validate_repo_id(repo)
  except hub_errors.HFValidationError:
    raise FileNotFoundError(
      f"{repo!r} is neither a local directory nor a Hugging Face Hub name ('gpt2' or 'owner/name')"
    ) from None
  try:
    directory = Path(huggingface_hub.snapshot_download(repo, allow_patterns=list(names)))
  except (
    hub_errors.LocalEntryNotFoundError,
    hub_errors.OfflineModeIsEnabled,
    hub_errors.HfHubHTTPError,
    ConnectionError,
    TimeoutError,
  ) as e:
    reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    raise HubUnavailableError(
      f"could not fetch {', '.join(names)} of {repo!r} from the Hugging Face Hub ({reason}), and {repo!r} is "
      f"not a local directory. Without internet access, download them on a machine that has it: "
      f"`hf download {repo} {' '.join(names)} --local-dir DIR` (huggingface_hub's CLI; before 1.0 it was "
      f"`huggingface-cli download`), copy DIR here and pass the directory instead: {loader}('DIR')"
    ) from e
  missing = [n for n in names if not (directory / n).is_file()]
  if missing:
    raise FileNotFoundError(
      f"the Hugging Face Hub repo {repo!r} has no {', '.join(missing)} ({loader} reads "
      f"{', '.join(names)}; a repo with only PyTorch .bin weights is not supported)"
    )
  return directory


def read_config(path: Path) -> dict:
  """config.json as a dict; a file that is not JSON is reported with its path."""
  try:
    return json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from e
