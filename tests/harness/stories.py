"""The local tasks' documents, stories.jsonl beside this file, wherever lm-eval runs from (`custom_dataset:
!function stories.load` in each task's YAML; a `data_files` path would be taken relative to the working directory)."""

import json
import os

import datasets


def load(**_) -> dict[str, datasets.Dataset]:
  """{"test": the stories}."""
  with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "stories.jsonl")) as f:
    return {"test": datasets.Dataset.from_list([json.loads(line) for line in f])}
