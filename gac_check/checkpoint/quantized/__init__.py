"""Quantized safetensors read at their logical widths: the schemes, their layouts, their marks."""
