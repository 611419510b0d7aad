"""Hugging Face checkpoints: hub access, GPT-2 import and export, Llama export, and pretrained starts."""
