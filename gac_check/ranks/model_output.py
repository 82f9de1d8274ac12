"""The whole model's output under each choice of ranks, against the dense model, on the start
of the calibration text (``--realign --base --calib``; the report's model-output table).

Each matrix's own output error (:mod:`gac_check.ranks.output_error`) does not say what the
errors do once they compound through the layers. This runs the dense model once as it is and
once per choice with every low-rank matrix's output replaced by what that choice computes
(a forward hook: ``x B^T A^T``, or ``x Vh_r^T S_r U_r^T`` for a truncation at r; a matrix kept
dense is left as it is), and compares the last hidden states token by token. Bounded: the
first ``MODEL_LINES`` lines of the text, so it costs a few forward passes, never a pass per
matrix; no weight is rebuilt.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from gac_check.progress import steps
from gac_check.ranks.calibration import MAX_TOKENS, read_lines

#: Lines of the calibration text the whole model is run on, once per choice and once dense.
MODEL_LINES = 16

#: What a matrix computes under one choice: its input rows (float64) -> its output rows,
#: without the bias (None: the dense weight, as it is).
Operator = Callable[[torch.Tensor], torch.Tensor] | None


@dataclass(frozen=True)
class ModelOutput:
    """Per choice, the last hidden state's relative error and mean cosine against dense."""

    inputs: str
    lines: int
    tokens: int
    relative: dict[str, float]  # ||H - H_dense||_F / ||H_dense||_F over every token
    cosine: dict[str, float]  # mean over tokens of cos(h, h_dense)

    def to_json(self) -> dict:
        return {"inputs": self.inputs, "lines": self.lines, "tokens": self.tokens,
                "relative": self.relative, "cosine": self.cosine}


def model_output(base_dir: Path, text_file: Path,
                 choices: Mapping[str, Mapping[str, Operator]],
                 biases: Mapping[str, torch.Tensor | None], progress: bool = True
                 ) -> ModelOutput:
    """The dense model's last hidden states on the first ``MODEL_LINES`` lines, against the
    same model with each choice's operators (module -> operator) in place of its matrices
    (``biases``: each module's bias under every choice, None: the dense model's own)."""
    from transformers import AutoTokenizer

    from gac_check.models.loaders import load_model

    lines = read_lines(text_file)[:MODEL_LINES]
    tok = AutoTokenizer.from_pretrained(base_dir)
    model = load_model(base_dir)
    batches = [tok(line, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
               for line in lines]
    dense = _last_hidden(model, batches)
    relative, cosine = {}, {}
    for choice in steps(list(choices), "running the model per choice", enabled=progress):
        ops = choices[choice]
        hooks = [model.get_submodule(m).register_forward_hook(_replace(op, biases.get(m)))
                 for m, op in ops.items() if op is not None]
        try:
            hidden = _last_hidden(model, batches)
        finally:
            for h in hooks:
                h.remove()
        relative[choice] = math.sqrt(float(((hidden - dense) ** 2).sum())
                                     / max(float((dense ** 2).sum()), 1e-300))
        cosine[choice] = float(torch.nn.functional.cosine_similarity(hidden, dense, dim=-1)
                               .mean())
    return ModelOutput(f"the first {len(lines)} lines of {text_file}", len(lines),
                       int(dense.shape[0]), relative, cosine)


def _last_hidden(model: torch.nn.Module, batches: list) -> torch.Tensor:
    """Every token's last hidden state, all lines' tokens stacked (float64)."""
    out = []
    with torch.no_grad():
        for ids in batches:
            hidden = model(**ids, output_hidden_states=True).hidden_states[-1]
            out.append(hidden.reshape(-1, hidden.shape[-1]).double())
    return torch.cat(out)


def _replace(op: Callable[[torch.Tensor], torch.Tensor], bias: torch.Tensor | None):
    def hook(module, args, output):
        x = args[0]
        y = op(x.reshape(-1, x.shape[-1]).double())
        b = bias if bias is not None else module.bias
        if b is not None:
            y = y + b.double()
        return y.to(output.dtype).reshape(output.shape)
    return hook
