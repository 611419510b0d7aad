"""The paper's model sizes and variants: which norms taper, and whether the scale loss is on (docs/method.md §7–8)."""

# The paper's widths and step counts (docs/method.md §8), all 8 layers deep; `cpu` is a preset that trains in minutes
# on 2 cores (2 layers); `1b` goes beyond the paper, for TPU pods (docs/tpu.md): 24 layers of width 2048, 1.2B.
SIZES = {
    "1m": dict(D=64, steps=500_000),
    "3m": dict(D=128, steps=500_000),
    "9m": dict(D=256, steps=750_000),
    "30m": dict(D=512, steps=1_000_000),
    "1b": dict(D=2048, L=24, steps=1_000_000),
    "cpu": dict(D=64, L=2, steps=300),
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
