"""What one Hub model may cost (:class:`Limits`): seconds per request, body bytes and requests.

The seconds are the user's, wherever they said them: ``--hub-timeout`` when given, else the
Hugging Face ecosystem's own variables, read as huggingface_hub reads them
(``huggingface_hub/constants.py``, 2.4): ``HF_HUB_ETAG_TIMEOUT`` for the model listing (a
metadata call, as ``HfApi.model_info`` and ``get_hf_file_metadata`` time it) and
``HF_HUB_DOWNLOAD_TIMEOUT`` for every file read (JSON files and header ranges, as
``hf_hub_download`` times it). Each is a total deadline for one request, redirects included,
not a wait per read, so a body trickled one byte a second ends when the user said.

This module does not import huggingface_hub: a value huggingface_hub itself cannot read (it
takes whole seconds and fails on import otherwise) is refused here first, in one line.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from gac_check.errors import BadInput

#: huggingface_hub's default for both variables (``DEFAULT_ETAG_TIMEOUT``,
#: ``DEFAULT_DOWNLOAD_TIMEOUT``), and ours.
DEFAULT_TIMEOUT = 10.0
#: The variables honoured, and what each times.
LISTING_TIMEOUT_VAR = "HF_HUB_ETAG_TIMEOUT"
DOWNLOAD_TIMEOUT_VAR = "HF_HUB_DOWNLOAD_TIMEOUT"
#: Body bytes one model may cost, listing, JSON files and headers together (``--hub-max-bytes``):
#: an 8B model's headers are ~120 KB, the largest MoE checkpoints' (160 shards) ~10 MB.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
#: HTTP requests one model may cost, redirects and retries included (``--hub-max-requests``).
DEFAULT_MAX_REQUESTS = 256
#: A whole model may take this many of its longest request timeout.
MODEL_TIMEOUTS = 6


def environment_timeout(name: str) -> float:
    """A timeout variable as huggingface_hub reads it: unset (or ``0``, which it reads as
    unset) is the default; whole seconds otherwise; anything else refused in one line."""
    text = os.environ.get(name)
    if text is None:
        return DEFAULT_TIMEOUT
    try:
        value = int(text)
    except ValueError:
        raise BadInput(f"{name}={text[:40]!r}: not a whole number of seconds (huggingface_hub "
                       "reads it as one)") from None
    if value < 0:
        raise BadInput(f"{name}={text[:40]!r}: a timeout must be a positive number of seconds")
    return float(value) if value else DEFAULT_TIMEOUT


def check_environment() -> None:
    """Refuse, in one line, a timeout variable huggingface_hub would crash on when imported."""
    environment_timeout(LISTING_TIMEOUT_VAR)
    environment_timeout(DOWNLOAD_TIMEOUT_VAR)


@dataclass(frozen=True)
class Limits:
    """What one model may cost. ``timeout``: ``--hub-timeout``, the seconds every request may
    take; None reads the Hub's variables (:func:`environment_timeout`) when constructed."""

    timeout: float | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    max_requests: int = DEFAULT_MAX_REQUESTS
    listing_timeout: float = field(init=False)
    download_timeout: float = field(init=False)

    def __post_init__(self) -> None:
        for name in ("timeout", "max_bytes", "max_requests"):
            value = getattr(self, name)
            if value is not None and not (0 < value < math.inf):
                raise BadInput(f"--hub-{name.replace('_', '-')} must be a positive number, "
                               f"not {value!r}")
        listing = self.timeout or environment_timeout(LISTING_TIMEOUT_VAR)
        download = self.timeout or environment_timeout(DOWNLOAD_TIMEOUT_VAR)
        object.__setattr__(self, "listing_timeout", listing)
        object.__setattr__(self, "download_timeout", download)

    @property
    def model_seconds(self) -> float:
        return MODEL_TIMEOUTS * max(self.listing_timeout, self.download_timeout)

    def said_by(self, listing: bool | None) -> str:
        """Where a request's timeout came from (None: the model's), as the user would set it."""
        if self.timeout is not None:
            return "--hub-timeout"
        if listing is None:
            return f"the longer of {LISTING_TIMEOUT_VAR} and {DOWNLOAD_TIMEOUT_VAR}"
        return LISTING_TIMEOUT_VAR if listing else DOWNLOAD_TIMEOUT_VAR
