"""Reference low-rank compressor: truncated SVD of every transformer-layer linear.

It exists to produce the irregular ranks real tools produce (ASVD's rank formula
``int(numel * ratio) // (in + out)``) on any transformers model, written in ASVD's layout, so
the checker, repair and realign stages have real compressed checkpoints to work on.

    gac-check compress SRC OUT --ratio 0.8
"""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from gac_check.checkpoint.index import Checkpoint, open_checkpoint
from gac_check.checkpoint.outdir import (
    atomic_output_dir,
    check_output_dir,
    copy_side_files,
    weight_file_names,
)
from gac_check.errors import BadInput
from gac_check.models.loaders import load_model
from gac_check.models.lowrank import factorize, match_prefix, tied_names
from gac_check.progress import steps

#: Linears inside the repeated blocks; embeddings, poolers and lm_head stay dense (as in ASVD).
LAYER_LINEAR = re.compile(r"(^|\.)(layers|layer|h|blocks)\.\d+\.")


def asvd_rank(out_features: int, in_features: int, ratio: float) -> int:
    """ASVD's rank for a parameter ratio: keep ``ratio`` of the matrix's parameters."""
    return max(1, int(out_features * in_features * ratio) // (in_features + out_features))


def layer_linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and LAYER_LINEAR.search(n)}


def compress_state(model: nn.Module, ratio: float,
                   dtypes: Mapping[str, torch.dtype] | None = None
                   ) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """The ASVD-layout state dict of ``model`` and the rank chosen per linear.

    ``dtypes`` gives the dtype each floating tensor is written in (the source checkpoint's:
    the model runs in fp32, but a bf16 model must stay a bf16 checkpoint); its factors take
    their weight's. Tied aliases are dropped (safetensors refuses them; loaders re-tie).
    """
    dtypes = dtypes or {}
    full = model.state_dict()
    tied = tied_names(full)
    state = {k: _cast(v.detach(), dtypes.get(k)).contiguous() for k, v in full.items()
             if tied.get(k, k) == k}
    ranks: dict[str, int] = {}
    for name, lin in steps(layer_linears(model).items(), "compressing"):
        rank = asvd_rank(lin.out_features, lin.in_features, ratio)
        f = factorize(lin.weight.detach(), rank, dtypes.get(f"{name}.weight"))
        del state[f"{name}.weight"]
        state[f"{name}.BLinear.weight"] = f.B.contiguous()
        state[f"{name}.ALinear.weight"] = f.A.contiguous()
        if lin.bias is not None:
            state[f"{name}.ALinear.bias"] = state.pop(f"{name}.bias")
        ranks[name] = rank
    return state, ranks


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def source_dtypes(model: nn.Module, ckpt: Checkpoint) -> dict[str, torch.dtype]:
    """The dtype each of ``model``'s tensors had in the checkpoint it was loaded from."""
    dtypes = {n: getattr(torch, t.dtype) for n, t in ckpt.tensors.items()}
    return match_prefix(model, dtypes)


def refuse_low_rank(ckpt: Checkpoint) -> None:
    """Compressing factors again would name ``X.BLinear.BLinear``: no loader reads that."""
    if ckpt.config.get("truncation_ranks") or any(n.endswith(".BLinear.weight")
                                                  for n in ckpt.tensors):
        raise BadInput("is already low-rank (truncation_ranks / BLinear factors); compress "
                       "the dense model instead", ckpt.path)


def save_low_rank(model: nn.Module, state: dict[str, torch.Tensor], ranks: dict[str, int],
                  src: Path | None, out: Path, force: bool = False) -> None:
    """Write config (with truncation_ranks), tensors and the source's side files atomically."""
    from safetensors.torch import save_file

    config = model.config.to_dict()
    config["truncation_ranks"] = ranks
    with atomic_output_dir(out, force) as tmp:
        if src is not None:
            copy_side_files(src, tmp, skip=weight_file_names(src) | {"config.json"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})


def compress_dir(src: Path, out: Path, ratio: float, force: bool = False) -> dict[str, int]:
    if not 0 < ratio < 1:
        raise BadInput(f"--ratio must be between 0 and 1, not {ratio}")
    check_output_dir(out, force, src)
    ckpt = open_checkpoint(src)
    refuse_low_rank(ckpt)
    model = load_model(src)
    state, ranks = compress_state(model, ratio, source_dtypes(model, ckpt))
    save_low_rank(model, state, ranks, src, out, force)
    return ranks


if __name__ == "__main__":  # the old spelling of `gac-check compress`: runs that command
    import runpy  # the CLI is run as a program, not imported: it sits above this module

    sys.argv[1:1] = ["compress"]
    runpy.run_module("gac_check.cli", run_name="__main__")
