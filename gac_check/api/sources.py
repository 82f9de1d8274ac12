"""What a model to check can be, turned into the one :class:`Checkpoint` every check starts from.

A directory is indexed from its headers; a Hugging Face Hub model (``hf://ORG/NAME[@REVISION]``,
or ``ORG/NAME`` where no such directory exists, as transformers resolves names) from its JSON
files and safetensors headers; a model in memory (a ``torch.nn.Module`` or a state dict, with its
config) from its tensors' shapes and dtypes (:mod:`gac_check.api.memory`). huggingface_hub and
torch are imported only when the model needs them: either would double a local check's cost.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gac_check.checkpoint.hub.limits import check_environment
from gac_check.checkpoint.index import Checkpoint, open_checkpoint
from gac_check.errors import BadInput

#: How a Hub model is named (huggingface_hub's URI scheme).
HF_SCHEME = "hf://"


def is_remote(name: str) -> bool:
    """``hf://...``, or ``ORG/NAME`` when nothing by that name exists here."""
    if name.startswith(HF_SCHEME):
        return True
    if name.count("/") != 1 or name.startswith((".", "/")) or os.path.lexists(name):
        return False
    check_environment()  # before huggingface_hub is imported: a bad value crashes its import
    from gac_check.checkpoint.hub.ref import looks_like_repo_id

    return looks_like_repo_id(name)


def is_remote_checkpoint(ckpt: Checkpoint) -> bool:
    """A Hub model's checkpoint, told without importing huggingface_hub for a local one."""
    return ckpt.source.startswith(HF_SCHEME)


def open_model(name: str | os.PathLike, limits=None) -> Checkpoint:
    """A directory's index, or a Hub model's from its headers, each request bounded by
    ``limits`` (:class:`gac_check.checkpoint.hub.limits.Limits`; default: its defaults, the Hub's
    timeout variables for the seconds)."""
    if is_remote(str(name)):
        if str(name).endswith(".gguf") and not str(name).startswith(HF_SCHEME):
            raise BadInput("does not exist", str(name))  # a GGUF is a file: meant to be here
        if str(name).endswith(".gguf"):
            raise BadInput(f"{name}: a GGUF file on the Hub is not read remotely yet: download "
                           "it (hf download ORG/NAME FILE.gguf --local-dir DIR) and check "
                           "DIR/FILE.gguf")
        check_environment()
        from gac_check.checkpoint.hub.remote import open_remote

        if str(name).startswith(HF_SCHEME):
            return open_remote(str(name), limits)
        try:
            return open_remote(str(name), limits)
        except BadInput as exc:  # most often build/model, which a failed step never wrote
            if "no such directory" in str(exc):  # the Hub said so already
                raise
            raise BadInput(f"{name}: no such directory here (did the step that writes it "
                           f"fail?); read as the Hub model {HF_SCHEME}{name} instead: "
                           f"{str(exc).removeprefix(f'{name}: ')}") from None
    return open_checkpoint(name)


def checkpoint_of(model: object, config: object = None) -> Checkpoint:
    """The checkpoint of anything :func:`gac_check.check` takes: an indexed checkpoint as it
    is, a directory or Hub name, a module (its ``.config``, or ``config``) or a state dict
    (with ``config``)."""
    if isinstance(model, Checkpoint | str | os.PathLike) and config is not None:
        where = model.path if isinstance(model, Checkpoint) else Path(model)
        raise BadInput("config= is for a model in memory; a directory (and its index) has "
                       "its config.json", where)
    if isinstance(model, Checkpoint):
        return model
    if isinstance(model, str | os.PathLike):
        return open_model(model)
    from gac_check.api.memory import from_module, from_state

    if isinstance(model, Mapping):
        return from_state(model, config)
    if callable(getattr(model, "state_dict", None)):
        return from_module(model, config)
    raise BadInput(f"cannot check a {type(model).__name__}: give a model directory, "
                   "hf://ORG/NAME, a torch.nn.Module or a state dict (with its config)")


def local_dir(model: object, job: str) -> Path:
    """The one local directory ``--repair`` / ``--realign`` rewrite: they need the weights."""
    if not isinstance(model, str | os.PathLike):
        raise BadInput(f"{job} rewrites a model directory, not a {type(model).__name__}: "
                       "save the model (save_pretrained) and pass its directory")
    if is_remote(str(model)) and not str(model).startswith(HF_SCHEME):
        raise BadInput(f"no such directory here (did the step that writes it fail?); {job} "
                       "rewrites a local model directory", model)
    if is_remote(str(model)):
        raise BadInput(f"{model}: {job} needs the weights, which a remote check never "
                       "downloads; download the model (hf download ORG/NAME --local-dir DIR) "
                       f"and run {job} on DIR")
    return Path(model)
