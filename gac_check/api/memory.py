"""A model in memory as a checkpoint: a compressor's own tests check what they just built.

The index is what a save would write, without writing it: each tensor's name, shape and dtype
(tied aliases dropped, as safetensors and ``save_pretrained`` drop them) and the config as
``config.json`` would hold it (a transformers config's ``to_diff_dict``, exactly what
``save_pretrained`` writes). So the check of a module finds what the check of its saved
directory finds (tests/test_api_check.py holds the two equal). A transformers model whose
class keeps weights in another layout than it saves (5.x fuses a mixture-of-experts layer's
experts into 3-D tensors and writes them back one module per expert) is indexed under the
saved names, converted by transformers' own ``revert_weight_conversion`` on meta tensors: no
weight is copied. A quantizer's state dict (packed weights, scales, a config with its
``quantization_config``) is read by the same layout readers as its saved safetensors. A
format that keeps part of its description in a file beside the weights (SliceGPT's slicing
config) cannot be judged from the module and is refused: save it first.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from gac_check.checkpoint.index import Checkpoint, with_quantization
from gac_check.checkpoint.tensorinfo import IN_MEMORY, TensorInfo
from gac_check.errors import BadInput
from gac_check.formats.slicegpt import SliceGPT


def from_module(module, config: object = None) -> Checkpoint:
    """A ``torch.nn.Module``'s checkpoint: its state dict and ``config`` (default: its own
    ``.config``, as every transformers model has)."""
    if config is not None:
        return from_state(_as_saved(module), config, type(module).__name__, "config=")
    ckpt = from_state(_as_saved(module), getattr(module, "config", None),
                      type(module).__name__, "the module's config")
    _architecture_as_saved(module, ckpt.config)
    return ckpt


def _architecture_as_saved(module, config: dict) -> None:
    """A transformers module's own config names no architecture until ``save_pretrained``
    writes its class there (a whole model a compressor pickled never went through one): the
    engines pick their model class by that name, so the check of the module names it as its
    save would."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return
    if isinstance(module, PreTrainedModel) and not config.get("architectures"):
        config["architectures"] = [type(module).__name__]


def _as_saved(module) -> Mapping:
    """The state dict under the names and shapes ``save_pretrained`` writes, tied aliases
    dropped first (the conversion sees no storage to tell them by)."""
    state = module.state_dict()
    try:
        from transformers import PreTrainedModel
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # not a transformers model, or a transformers that saves as it holds
        return state
    if not isinstance(module, PreTrainedModel):
        return state
    import torch

    from gac_check.models.lowrank import tied_names

    tied = tied_names(state)
    meta = {n: torch.empty(t.shape, dtype=t.dtype, device="meta")
            for n, t in state.items() if tied.get(n, n) == n}
    return revert_weight_conversion(module, meta)


def from_state(state: Mapping, config: object, what: str = "state dict",
               source: str = "config=") -> Checkpoint:
    """A state dict's checkpoint, with the config the model was built from (``source``: how
    the report names where it came from)."""
    where = Path(f"<in-memory {what}>")
    if config is None:
        raise BadInput("a model in memory needs its config: pass config= (a dict or a "
                       "transformers PretrainedConfig), or save the model and check the "
                       "directory", where)
    from gac_check.models.lowrank import tied_names  # imports torch, which the model has

    tied = tied_names(state)
    tensors = {name: _info(name, t, where) for name, t in state.items()
               if tied.get(name, name) == name}
    ckpt = with_quantization(Checkpoint(where, _config_dict(config, where), tensors, IN_MEMORY,
                                        config_source=source), _bytes_of(state))
    if SliceGPT().matches(ckpt):
        raise BadInput("is a SliceGPT model, whose slicing config lives in a file beside the "
                       "weights, not in the module; save it with its slicing config "
                       "and check the directory", where)
    return ckpt


def _info(name: str, tensor, where: Path) -> TensorInfo:
    """Each tensor its own "file" of its bytes, so a quantized layout's reader (which reads a
    GPTQ ``g_idx`` or a scale's bytes) asks for one tensor at a time."""
    return TensorInfo(name, tuple(tensor.shape), _dtype(tensor), where / name, 0,
                      tensor.numel() * tensor.element_size())


def _bytes_of(state: Mapping):
    """The reader of a state dict's bytes: the slice of one tensor :func:`_info` describes."""
    import torch

    def read(info: TensorInfo) -> bytes:
        tensor = state[info.name].detach().cpu().contiguous().reshape(-1)
        return tensor.view(torch.uint8).numpy().tobytes()[info.begin:info.end]
    return read


def _dtype(tensor) -> str:
    """``torch.float16`` -> ``float16``, the names the header readers give."""
    return str(tensor.dtype).removeprefix("torch.")


def _config_dict(config: object, where: Path) -> dict:
    """The config as config.json would hold it (JSON types only)."""
    if isinstance(config, Mapping):
        data = dict(config)
    elif callable(getattr(config, "to_diff_dict", None)):
        data = config.to_diff_dict()
    else:
        raise BadInput(f"config= must be a dict or a transformers PretrainedConfig, not a "
                       f"{type(config).__name__}", where)
    return json.loads(json.dumps(data, default=str))
