"""Activation statistics for ASVD-style activation-aware rank selection (``--calib FILE``).

A weight column that meets large activations matters more than its singular values alone say.
ASVD scales each input channel j by ``mean|x_j|^alpha`` before the SVD (alpha = 0.5 in the
ASVD paper), so the discarded singular values measure output error on real inputs rather than
weight error. We collect ``mean|x_j|`` with forward pre-hooks on the dense base model running
the user's calibration text.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gac_check.errors import BadInput

MAX_LINES, MAX_TOKENS = 128, 256


def read_lines(path: Path) -> list[str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read calibration text: {exc}", path) from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()][:MAX_LINES]
    if not lines:
        raise BadInput("calibration text is empty", path)
    return lines


def input_scales(base_dir: Path, modules: list[str], text_file: Path,
                 alpha: float = 0.5) -> dict[str, torch.Tensor]:
    """Per module, ``mean|x|^alpha`` over every token of the calibration text (clamped > 0)."""
    from transformers import AutoTokenizer

    from gac_check.models.loaders import load_model

    lines = read_lines(text_file)
    try:
        tok = AutoTokenizer.from_pretrained(base_dir)
    except (OSError, ValueError):
        raise BadInput("has no tokenizer, which --calib needs", base_dir) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    model = load_model(base_dir)
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    hooks = [model.get_submodule(m).register_forward_pre_hook(_hook(m, sums, counts))
             for m in modules]
    try:
        with torch.no_grad():
            for line in lines:
                ids = tok(line, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
                model(**ids)
    finally:
        for h in hooks:
            h.remove()
    return {m: (sums[m] / counts[m]).clamp_min(1e-6) ** alpha for m in modules}


def _hook(name: str, sums: dict, counts: dict):
    def record(_module, args):
        x = args[0].detach().double().reshape(-1, args[0].shape[-1])
        sums[name] = sums.get(name, 0) + x.abs().sum(0)
        counts[name] = counts.get(name, 0) + x.shape[0]
    return record
