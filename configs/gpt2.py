"""GPT-2 fine-tuning (docs/method.md §10): `--config=configs/gpt2.py:model=s,variant=internal_taper,seed=0`.

Arguments: `model=s|m|l|xl|demo`, `variant=baseline|internal_taper|all_taper|fakeln|prepbn`, `aux=0|1`,
`seed=N`, `pretrain=1` (the demo's starting model); every field can be overridden with `--config.X.Y=`. The
tables and the builder live in the package (tapernorm_jax/taper/gpt2_variants.py, tapernorm_jax/train/gpt2_config.py),
so the library fine-tunes GPT-2 from an installed wheel; this file is the name `--config=` and scripts use.
"""

from tapernorm_jax.taper.gpt2_variants import FAKELN, GPT2_EOT, MODELS, VARIANTS
from tapernorm_jax.train.gpt2_config import get_config

__all__ = ["FAKELN", "GPT2_EOT", "MODELS", "VARIANTS", "get_config"]
