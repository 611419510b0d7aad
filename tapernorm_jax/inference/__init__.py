"""Inference: KV-cache decoding, loading and running trained models or exports, and exports."""
