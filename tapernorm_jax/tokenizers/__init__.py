"""Tokenizers behind one encode/decode interface: SentencePiece (trained here) and GPT-2's BPE; no jax needed."""
