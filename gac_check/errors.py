"""Every error gac-check raises on purpose, in one place.

The CLI turns a :class:`BadInput` into one line on stderr and exit code 2; anything else is a
bug and is allowed to show its traceback.
"""
from __future__ import annotations

from pathlib import Path


class GacError(Exception):
    """Base of all deliberate gac-check errors."""


class BadInput(GacError):
    """The user's input (a model directory, a file, a flag) cannot be used.

    ``path`` names the offending file so the one-line message always says where to look.
    """

    def __init__(self, message: str, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        super().__init__(f"{self.path}: {message}" if self.path is not None else message)


class NotRead(BadInput):
    """The hand-written readers do not read this layout: they found no layers they know, or
    left tensors unread. Unlike every other refusal of a model, this one may be lifted by a
    reader that knows more (the layout table derived from transformers' classes); a refusal
    that a reader makes of a layout it does know (experts it cannot load, a config the
    tensors contradict) stands."""


class PickleRefused(BadInput):
    """The pickle reader will not read a ``data.pkl``: malformed, past its bounds, or not laid
    out as torch.save lays a state dict or model. Every refusal of the reader is one of these,
    whether a check lists the tensors or a repair rewrites the stream."""


class UnsafeCheckpoint(PickleRefused):
    """A pickle that would import or call something other than tensor storage."""


class HardwareMissing(GacError):
    """Perf tests were asked to measure on a device this machine does not have."""


class Unsupported(GacError):
    """This device or stack cannot run a workload (a backend refused the shape, a package is
    missing); the message says why, so a test can skip with it."""
