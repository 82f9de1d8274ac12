"""Activation statistics for ASVD-style activation-aware rank selection (``--calib FILE``).

A weight column that meets large activations matters more than its singular values alone say.
ASVD scales each input channel j by ``mean|x_j|^alpha`` before the SVD (alpha = 0.5 in the
ASVD paper), so the discarded singular values measure output error on real inputs rather than
weight error. We collect ``mean|x_j|`` with forward pre-hooks on the dense base model running
the user's calibration text. The same pass keeps a bounded sample of each module's input rows,
on which ``--realign`` measures each choice's output error (:mod:`gac_check.ranks.output_error`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gac_check.errors import BadInput

MAX_LINES, MAX_TOKENS = 128, 256
#: Input rows kept per module for the output error, and the bytes all samples may take:
#: enough rows for a stable relative error, never the whole text's activations of a large model.
SAMPLE_ROWS, SAMPLE_BYTES = 512, 256 * 2**20


@dataclass
class Activations:
    """What the dense model's inputs to each module looked like on the calibration text."""

    scales: dict[str, torch.Tensor]  # mean|x|^alpha per input channel (ASVD's scaling)
    samples: dict[str, torch.Tensor]  # rows x in_features, evenly drawn from every line
    lines: int
    tokens: int


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
    return activations(base_dir, modules, text_file, alpha, rows=0).scales


def activations(base_dir: Path, modules: list[str], text_file: Path, alpha: float = 0.5,
                rows: int = SAMPLE_ROWS) -> Activations:
    """One pass of the dense model over the calibration text: each module's input scales and
    a sample of at most ``rows`` input rows (fewer where all samples would pass
    ``SAMPLE_BYTES``), spread evenly over the lines and the tokens of each."""
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
    widths = sum(model.get_submodule(m).weight.shape[1] for m in modules)  # [out, in]
    rows = min(rows, SAMPLE_BYTES // max(4 * widths, 1))
    per_line = -(-rows // len(lines)) if rows > 0 else 0
    record = _Record(per_line)
    hooks = [model.get_submodule(m).register_forward_pre_hook(record.hook(m))
             for m in modules]
    tokens = 0
    try:
        with torch.no_grad():
            for line in lines:
                ids = tok(line, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
                tokens += int(ids["input_ids"].numel())
                model(**ids)
    finally:
        for h in hooks:
            h.remove()
    return Activations(
        {m: (record.sums[m] / record.counts[m]).clamp_min(1e-6) ** alpha for m in modules},
        {m: torch.cat(record.rows[m])[:rows] for m in modules if record.rows.get(m)},
        len(lines), tokens)


class _Record:
    """The forward pre-hooks' accumulators: abs sums, token counts, sampled rows."""

    def __init__(self, per_line: int) -> None:
        self.per_line = per_line
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.rows: dict[str, list[torch.Tensor]] = {}

    def hook(self, name: str):
        def record(_module, args):
            x = args[0].detach().double().reshape(-1, args[0].shape[-1])
            self.sums[name] = self.sums.get(name, 0) + x.abs().sum(0)
            self.counts[name] = self.counts.get(name, 0) + x.shape[0]
            if self.per_line:
                pick = torch.linspace(0, x.shape[0] - 1, min(self.per_line, x.shape[0]))
                self.rows.setdefault(name, []).append(x[pick.round().long()].float())
        return record
