"""Index a model on the Hugging Face Hub from its JSON files and safetensors headers only.

Choosing a compressed model, or publishing one, should not cost tens of gigabytes: a check
needs names, dtypes and shapes, which a safetensors file keeps in a header at its start. So a
Hub model is indexed from the file listing (:mod:`.listing`), ``config.json``, the shard
index and small sidecar JSON files (:mod:`.files`) and, per shard, one HTTP range request
for its header (:mod:`.headers`); every request is one bounded GET of :mod:`.transport`, and
every field of every answer is checked before use. This module assembles them into the same
:class:`Checkpoint` a directory gives, so a remote check and a local check of the same files
agree.

Everything is read at one commit, resolved once, so a branch that moves mid-check cannot mix
two versions; what was read is kept per commit, once validated, so a model checked once can be
checked again offline (``HF_HUB_OFFLINE=1``) or when the network is down. Weights pickled by
``torch.save`` (LLM-Pruner, SVD-LLM) are refused: their index is a pickle inside a zip, and
only downloading them is supported.
"""
from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from gac_check.checkpoint.hub.files import (
    MAX_CONFIG_BYTES,
    HubCommit,
    read_hub_json,
    sidecars,
    weight_files,
)
from gac_check.checkpoint.hub.headers import FIRST_READ, byte_range, hub_tensors
from gac_check.checkpoint.hub.listing import resolve
from gac_check.checkpoint.hub.ref import HF_SCHEME, HubRef, looks_like_repo_id, parse_ref
from gac_check.checkpoint.hub.transport import Fetch, Limits
from gac_check.checkpoint.index import Checkpoint
from gac_check.checkpoint.quantized.reader import hub_reader, read_quantization
from gac_check.errors import BadInput

__all__ = ["FIRST_READ", "HF_SCHEME", "HubRef", "RemoteCheckpoint", "looks_like_repo_id",
           "open_remote", "parse_ref", "renamed"]


@dataclass
class RemoteCheckpoint(Checkpoint):
    """A Hub model's index: the same fields as a directory's, and where they came from.

    ``path`` is the commit's snapshot folder in the Hub cache, where ``config.json`` and the
    sidecars now are and where each shard would be downloaded (``TensorInfo.file``); the
    shards themselves are not there, so nothing may read tensor data from this checkpoint.
    """

    ref: HubRef = field(default_factory=lambda: HubRef(""))
    commit: str = ""
    fetch: Fetch = field(default_factory=Fetch)

    @property
    def source(self) -> str:
        return f"{HF_SCHEME}{self.ref.repo_id}@{self.commit}"


def open_remote(ref: HubRef | str, limits: Limits | None = None) -> RemoteCheckpoint:
    """Index a Hub model at one commit, reading kilobytes: listing, JSON files, headers.

    Every request is bounded (:mod:`.transport`): ``limits`` are the seconds per step, and the
    bytes and requests the whole model may cost.
    """
    ref = parse_ref(ref) if isinstance(ref, str) else ref
    fetch = Fetch(limits or Limits())
    fetch.start()
    start = time.perf_counter()
    with _quiet():
        commit, listing = resolve(ref, fetch)
        hub = HubCommit(ref, commit, listing, fetch)
        config = (read_hub_json(hub, "config.json", MAX_CONFIG_BYTES) if "config.json" in listing
                  else {})
        container, names = weight_files(hub)
        tensors = hub_tensors(hub, names)
        side = sidecars(hub)  # optional: after what the check needs, from what is left
        snapshot = hub.snapshot
        ckpt = read_quantization(  # a quantized layout's shape records: bounded range reads
            RemoteCheckpoint(snapshot, config, tensors, container,
                             [snapshot / n for n in names], side, ref=ref, commit=commit,
                             fetch=fetch), hub_reader(partial(byte_range, hub), snapshot))
    fetch.seconds = time.perf_counter() - start
    return ckpt


def renamed(exc: BadInput, ckpt: Checkpoint) -> BadInput:
    """A refusal about a remote checkpoint's snapshot folder, reworded to name the Hub model
    (``hf://org/name@commit/config.json``) rather than a cache path the user never chose."""
    if not isinstance(ckpt, RemoteCheckpoint) or exc.path is None:
        return exc
    try:
        rel = exc.path.relative_to(ckpt.path)
    except ValueError:
        return exc
    message = str(exc).removeprefix(f"{exc.path}: ")
    where = ckpt.source + ("" if rel == Path() else f"/{rel.as_posix()}")
    return BadInput(f"{where}: {message}")


@contextmanager
def _quiet() -> Iterator[None]:
    """huggingface_hub's own log lines and warnings silenced: a refusal is our one line."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
