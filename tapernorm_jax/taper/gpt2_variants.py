"""GPT-2 fine-tuning's sizes, schedules and variants (docs/method.md §10): the paper's per-size shapes and taper, and
FakeLN as its authors schedule it. `tapernorm_jax/train/gpt2_config.py` builds the configs from them."""

# The paper's per-size shapes and schedule: steps, LR warmup end, taper start, taper end (docs/method.md §10);
# microbatches keep 2^19 tokens per step (512 blocks of 1024) within one device's memory.
MODELS = {
  "s": dict(
    hub="gpt2", D=768, H=12, L=12, steps=300, warmup=25, taper=(25, 100), scale_loss_weight=0.1, microbatches=16
  ),
  "m": dict(
    hub="gpt2-medium", D=1024, H=16, L=24, steps=500, warmup=10, taper=(20, 200), scale_loss_weight=0.1, microbatches=32
  ),
  "l": dict(
    hub="gpt2-large", D=1280, H=20, L=36, steps=600, warmup=30, taper=(30, 500), scale_loss_weight=0.1, microbatches=64
  ),
  "xl": dict(
    hub="gpt2-xl", D=1600, H=25, L=48, steps=800, warmup=20, taper=(50, 700), scale_loss_weight=0.01, microbatches=128
  ),
  # The CPU demo: fine-tunes a model that configs/gpt2.py:model=demo,variant=baseline,pretrain=1 trained first.
  "demo": dict(hub="", D=64, H=4, L=4, steps=200, warmup=10, taper=(20, 150), scale_loss_weight=0.1, microbatches=1),
}
# FakeLN as its authors schedule it (github.com/submarat/removing-layer-norm, config.py at 583a9e6), per size and
# with (True) or without (False) their aux loss: (start_ln2, gap_ln2, gap_ln1qk, gap_ln1v, aux_loss_weight: λ). Their
# start_ln1qk = start_ln2 + L·gap_ln2, start_ln1v = start_ln1qk + L·gap_ln1qk, start_lnf = start_ln1v + L·gap_ln1v,
# which is fakeln.gap_final = gap_ln1v after the last value-path removal.
FAKELN = {
  ("s", False): (20, 2, 2, 3, 0.0),
  ("s", True): (20, 2, 2, 3, 0.1),  # make_gpt2_standard, _standard_aux
  ("m", False): (20, 2, 2, 3, 0.0),
  ("m", True): (20, 2, 2, 3, 0.1),  # make_gpt2_medium_fasttune(_aux)
  ("l", False): (30, 4, 4, 6, 0.0),
  ("l", True): (30, 4, 4, 6, 0.03),  # make_gpt2_large(_aux)
  ("xl", False): (20, 2, 2, 3, 0.0),
  ("xl", True): (50, 4, 4, 6, 0.01),  # make_gpt2_xl(_aux)
  # The demo (4 layers, 200 steps): the large model's gaps, here, so that each removal has steps to settle.
  ("demo", False): (20, 4, 4, 6, 0.0),
  ("demo", True): (20, 4, 4, 6, 0.1),
}
GPT2_EOT = 50_256  # <|endoftext|>, which FakeLN's scale loss leaves out of its target (SentencePiece's eos is 2)
VARIANTS = {  # (internal norm, final norm, method, the scale loss on by default)
  "baseline": ("plain", "plain", "taper", False),  # aux=1: the matched control, the scale loss without tapering
  "internal_taper": ("taper", "plain", "taper", True),  # the paper's Internal-TaperLN (+ the fixed-target scale loss)
  "all_taper": ("taper", "taper", "taper", True),
  "fakeln": ("taper", "taper", "fakeln", True),  # its own scale loss, fakeln.scale_loss_weight
  # PRepBN published no GPT-2 schedule: its λ is 1 until the paper's taper start and falls linearly to 0 at its end
  "prepbn": ("repbn", "repbn", "prepbn", False),
}
# DyT and Derf have no gate: swapping them into a pretrained GPT-2 changes its function at step 0, so they train from
# scratch only (taper/variants.py), not as fine-tuning variants.
