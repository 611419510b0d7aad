"""The paper's model sizes and variants: which norms taper, and whether the scale loss is on (docs/method.md §7–8)."""

# The paper's widths and step counts (docs/method.md §8), all 8 layers deep with 16 heads; `1b` goes beyond the paper,
# for TPU pods (docs/tpu.md): 24 layers of width 2048, 1.2B. The `cpu*` presets are a ladder that trains in minutes on
# 2 cores (2 layers, the synthetic corpus, 300 steps), from 0.09M to 0.94M parameters; `cpu_xs` keeps a head width of 4
# with 8 heads. `cpu_scale` marks them: CPU-scale data, vocabulary, context and learning rate (train/run_config.py).
SIZES = {
  "cpu_xs": dict(D=32, L=2, H=8, steps=300, cpu_scale=True),
  "cpu": dict(D=64, L=2, steps=300, cpu_scale=True),
  "cpu_m": dict(D=96, L=2, steps=300, cpu_scale=True),
  "cpu_l": dict(D=128, L=2, steps=300, cpu_scale=True),
  "cpu_xl": dict(D=160, L=2, steps=300, cpu_scale=True),
  "1m": dict(D=64, steps=500_000),
  "3m": dict(D=128, steps=500_000),
  "9m": dict(D=256, steps=750_000),
  "30m": dict(D=512, steps=1_000_000),
  "1b": dict(D=2048, L=24, steps=1_000_000),
}
VARIANTS = {  # (internal norm, final norm, aux loss on by default)
  "baseline": ("plain", "plain", False),
  "internal_taper": ("taper", "plain", True),
  "final_taper": ("plain", "taper", False),  # the paper's unanchored ablation; aux=1 anchors it
  "all_taper": ("taper", "taper", True),
  "dyt": ("dyt", "dyt", False),  # every norm DyT from the start (Zhu et al., 2025): nothing to taper or fold
  "derf": ("derf", "derf", False),  # every norm Derf from the start (Chen et al., 2025)
  "prepbn": ("repbn", "repbn", False),  # every norm blended into RepBN (Guo et al., 2024); method=prepbn
  "fakeln": ("taper", "taper", True),  # all_taper's norms removed one at a time (Baroni et al., 2025); method=fakeln
}
METHODS = {"prepbn": "prepbn", "fakeln": "fakeln"}  # variants trained by a method other than TaperNorm
