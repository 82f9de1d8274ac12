"""How a user names a model on the Hugging Face Hub: ``hf://ORG/NAME[@REVISION]`` (the
Hub's own URI syntax) or a bare ``ORG/NAME`` where no such directory exists, as transformers
resolves ``from_pretrained`` names. Checked before anything is fetched."""
from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub.errors import HfUriError, HFValidationError
from huggingface_hub.utils import parse_hf_uri, validate_repo_id

from gac_check.errors import BadInput

HF_SCHEME = "hf://"


@dataclass(frozen=True)
class HubRef:
    """A model on the Hub as the user named it: ``hf://org/name@revision`` or ``org/name``."""

    repo_id: str
    revision: str | None = None
    bare: bool = False  # named ``org/name``, so it might have been meant as a directory

    def __str__(self) -> str:
        if self.bare:
            return self.repo_id
        return HF_SCHEME + self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_ref(text: str) -> HubRef:
    """``hf://org/name[@rev]`` (huggingface_hub's URI syntax) or a bare ``org/name``."""
    if not text.startswith(HF_SCHEME):
        _validate_id(text)
        return HubRef(text, bare=True)
    try:
        uri = parse_hf_uri(text)
    except HfUriError as exc:
        raise BadInput(f"{text}: not a Hub model id ({exc.msg})") from None
    if uri.type != "model":
        raise BadInput(f"{text}: gac-check checks models, not {uri.type}s")
    if uri.path_in_repo:
        raise BadInput(f"{text}: name the model repository itself, not a path inside it")
    return HubRef(uri.id, uri.revision)


def looks_like_repo_id(text: str) -> bool:
    """Whether a name that is no local directory can be a Hub model (``org/name``), as
    transformers resolves ``from_pretrained`` names."""
    if text.count("/") != 1 or text.startswith((".", "/")) or text.endswith("/"):
        return False
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def _validate_id(repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise BadInput(f"{repo_id}: not a Hub model id ({exc})") from None
