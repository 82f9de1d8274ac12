"""Index a model on the Hugging Face Hub from its JSON files and safetensors headers only.

Choosing a compressed model, or publishing one, should not cost tens of gigabytes: a check
needs names, dtypes and shapes, which a safetensors file keeps in a header at its start. So a
Hub model is indexed from the file listing (``HfApi.model_info``), ``config.json``, the shard
index and small sidecar JSON files (``hf_hub_download``: the Hub cache, ``HF_ENDPOINT``,
``HF_TOKEN`` and offline mode all apply) and, per shard, one HTTP range request for its first
:data:`FIRST_READ` bytes (a second only when a header is longer). The header bytes go through
the same validation as a local file's (:mod:`gac_check.checkpoint.safetensors_header`), so a
remote check and a local check of the same files agree.

Everything is read at one commit, resolved once, so a branch that moves mid-check cannot mix
two versions. The listing and the header bytes are kept per commit (a commit never changes)
under the Hub's assets cache, so a model checked once can be checked again offline
(``HF_HUB_OFFLINE=1``) or when the network is down; a shard already downloaded into the Hub
cache is read from there. Weights pickled by ``torch.save`` (LLM-Pruner, SVD-LLM) are refused:
their index is a pickle inside a zip, and only downloading them is supported.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

import httpx2
from huggingface_hub import (
    HfApi,
    constants,
    hf_hub_download,
    hf_hub_url,
    try_to_load_from_cache,
)
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HfUriError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import disable_progress_bars, parse_hf_uri, validate_repo_id

from gac_check.checkpoint.files import MAX_JSON_BYTES, name_problem, read_json
from gac_check.checkpoint.hub_io import COMMIT, Fetch, HubCache, counted, get_range, reason
from gac_check.checkpoint.index import (
    MAX_SIDECAR_BYTES,
    TORCH_SUFFIXES,
    TRAINER_STATE_FILES,
    Checkpoint,
)
from gac_check.checkpoint.safetensors_header import (
    header_length,
    index_header,
    read_safetensors_header,
)
from gac_check.checkpoint.tensorinfo import TensorInfo
from gac_check.errors import BadInput

HF_SCHEME = "hf://"
#: The first range asked of every shard: the 8-byte length and, for all but the largest
#: headers (a 5 GB shard of ~100 tensors has a ~10 KB one), the whole header.
FIRST_READ = 16 * 1024
#: Shard headers fetched at once; a 70B model has 30 shards, and each costs one round trip.
WORKERS = 8


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


def open_remote(ref: HubRef | str) -> RemoteCheckpoint:
    """Index a Hub model at one commit, reading kilobytes: listing, JSON files, headers."""
    ref = parse_ref(ref) if isinstance(ref, str) else ref
    fetch = Fetch()
    start = time.perf_counter()
    with counted(fetch), disable_progress_bars(), _hub_errors(ref):
        commit, listing = _resolve(ref, fetch)
        hub = _Hub(ref, commit, listing, fetch)
        config = hub.json("config.json") if "config.json" in listing else {}
        sidecars = hub.sidecars()
        container, names = hub.weight_files()
        tensors = hub.tensors(names)
    fetch.seconds = time.perf_counter() - start
    snapshot = hub.snapshot
    return RemoteCheckpoint(snapshot, config, tensors, container,
                            [snapshot / n for n in names], sidecars, ref, commit, fetch)


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


# --- resolving the commit and its file listing --------------------------------------------

def _resolve(ref: HubRef, fetch: Fetch) -> tuple[str, dict[str, int | None]]:
    """The commit the revision names now, and every file at it with its size; the cached
    listing where the Hub cannot be asked (offline mode, no network)."""
    revision = ref.revision or constants.DEFAULT_REVISION
    cache = HubCache(ref.repo_id)
    if constants.is_offline_mode():
        why = "offline (HF_HUB_OFFLINE is set)"
    else:
        try:
            info = HfApi().model_info(ref.repo_id, revision=ref.revision, files_metadata=True)
        except (httpx2.ConnectError, httpx2.TimeoutException) as exc:
            why = f"cannot reach {constants.ENDPOINT} ({reason(exc)})"
        except HfHubHTTPError:
            raise  # worded by _hub_errors
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadInput(f"{ref}: {constants.ENDPOINT} answered with a model listing that is "
                           f"not the Hub's ({reason(exc)})") from None
        else:
            if not isinstance(info.sha, str) or not COMMIT.match(info.sha):
                raise BadInput(f"{ref}: {constants.ENDPOINT} did not say which commit "
                               f"{revision} is")
            listing = _listing(ref, info.siblings)
            cache.save_listing(revision, info.sha, listing)
            return info.sha, listing
    commit = cache.commit(revision)
    listing = cache.listing(commit) if commit else None
    if commit is None or listing is None:
        raise BadInput(f"{ref}: {why}, and this model was never checked here before; check "
                       "it once online, or check a downloaded copy's directory")
    fetch.offline = True
    return commit, listing


def _listing(ref: HubRef, siblings: list | None) -> dict[str, int | None]:
    """File name -> size as the Hub listed them; a size that is no byte count is unknown."""
    listing: dict[str, int | None] = {}
    for s in siblings or []:
        if not isinstance(s.rfilename, str):
            raise BadInput(f"{ref}: {constants.ENDPOINT} listed a file named {s.rfilename!r}")
        size = s.size if type(s.size) is int and s.size >= 0 else None
        listing[s.rfilename] = size
    return listing


# --- the files of one commit -----------------------------------------------------------------

@dataclass
class _Hub:
    """One commit of one repo: fetches its files the way :mod:`.index` reads a directory's."""

    ref: HubRef
    commit: str
    listing: dict[str, int | None]
    fetch: Fetch

    @property
    def snapshot(self) -> Path:
        folder = f"models--{self.ref.repo_id.replace('/', '--')}"
        return Path(constants.HF_HUB_CACHE) / folder / "snapshots" / self.commit

    def where(self, name: str = "") -> str:
        return f"{HF_SCHEME}{self.ref.repo_id}@{self.commit}" + (f"/{name}" if name else "")

    def download(self, name: str) -> Path:
        """A small file, through the Hub cache (downloaded once per commit)."""
        try:
            return Path(hf_hub_download(self.ref.repo_id, name, revision=self.commit))
        except RemoteEntryNotFoundError:
            raise BadInput(f"{self.where(name)}: listed by the Hub, but not served") from None

    def json(self, name: str, limit: int = MAX_JSON_BYTES) -> dict:
        size = self.listing.get(name)
        if size is not None and size > limit:
            raise BadInput(f"{self.where(name)}: is larger than {limit} bytes, too large for a "
                           "JSON config")
        try:
            return read_json(self.download(name), limit)
        except BadInput as exc:
            raise _about(exc, self.where(name)) from None

    def sidecars(self) -> dict[str, dict]:
        """Top-level JSON files but config and indexes, at most 1 MB each (as :mod:`.index`)."""
        out: dict[str, dict] = {}
        for name in sorted(self.listing):
            if ("/" in name or not name.endswith(".json") or name == "config.json"
                    or name.endswith(".index.json")):
                continue
            size = self.listing[name]
            if size is not None and size > MAX_SIDECAR_BYTES:
                continue  # a tokenizer.json is megabytes, and not ours to judge
            try:
                out[name] = self.json(name, MAX_SIDECAR_BYTES)
            except BadInput:
                continue
        return out

    def weight_files(self) -> tuple[str, list[str]]:
        """The container and its files, chosen exactly as a local directory's would be."""
        top = sorted(n for n in self.listing if "/" not in n)
        if "model.safetensors.index.json" in self.listing:
            return "safetensors", self._shards("model.safetensors.index.json")
        if "pytorch_model.bin.index.json" in self.listing:
            self._refuse_torch(self._shards("pytorch_model.bin.index.json"))
        safetensors = [n for n in top if n.endswith(".safetensors")]
        if safetensors:
            return "safetensors", safetensors
        torch_files = [n for n in top if n.endswith(TORCH_SUFFIXES)]
        preferred = [n for n in torch_files if fnmatch(n, "pytorch_model*.bin")]
        torch_files = preferred or [n for n in torch_files
                                    if not any(fnmatch(n, p) for p in TRAINER_STATE_FILES)]
        if torch_files:
            self._refuse_torch(torch_files)
        raise BadInput(f"{self.where()}: holds no checkpoint (no *.safetensors, "
                       "pytorch_model.bin or *.pt)")

    def _shards(self, index_name: str) -> list[str]:
        weight_map = self.json(index_name).get("weight_map")
        where = self.where(index_name)
        if not isinstance(weight_map, dict) or not weight_map:
            raise BadInput(f"{where}: has no weight_map")
        names = set(weight_map.values())
        if not all(isinstance(n, str) for n in names):
            raise BadInput(f"{where}: weight_map values must be shard file names (strings)")
        shards: dict[str, None] = {}  # ordered set: "a" and "./a" are one shard
        for name in sorted(names):
            shard = _plain_name(name, where)
            if shard not in self.listing:
                raise BadInput(f"{where}: names shard {name!r}, which is missing")
            shards[shard] = None
        return list(shards)

    def _refuse_torch(self, names: list[str]) -> None:
        total = sum(self.listing.get(n) or 0 for n in names)
        raise BadInput(f"{self.where(names[0])}: is a torch.save pickle (LLM-Pruner and SVD-LLM "
                       "save whole models this way); its index is inside the pickle, so the "
                       f"weights ({total:,} bytes in {len(names)} file(s)) would have to be "
                       "downloaded: download the model and check its directory")

    def tensors(self, names: list[str]) -> dict[str, TensorInfo]:
        """Every shard's header (fetched in parallel), merged as :mod:`.index` merges them."""
        with ThreadPoolExecutor(WORKERS) as pool:
            indexes = list(pool.map(self.header, names))
        tensors: dict[str, TensorInfo] = {}
        for name, index in zip(names, indexes, strict=True):
            for tensor, info in index.items():
                if tensor in tensors:
                    raise BadInput(f"{self.where(name)}: tensor {tensor!r} is also in "
                                   f"{tensors[tensor].file.name}")
                tensors[tensor] = info
        return tensors

    def header(self, name: str) -> dict[str, TensorInfo]:
        """One shard's index: from the Hub cache, our header cache, or two range requests."""
        where = self.where(name)
        local = try_to_load_from_cache(self.ref.repo_id, name, revision=self.commit)
        if isinstance(local, str):  # downloaded before: read its header like a local file's
            self.fetch.headers_cached += 1
            try:
                return read_safetensors_header(Path(local))
            except BadInput as exc:
                raise _about(exc, where) from None
        cache = HubCache(self.ref.repo_id)
        cached = cache.header(self.commit, name)
        if cached is not None:
            self.fetch.headers_cached += 1
            return self._index(name, *cached)
        if self.fetch.offline or constants.is_offline_mode():
            raise BadInput(f"{where}: offline, and its header is not cached")
        try:
            head, size = self._header_bytes(name)
        except BadInput as exc:
            raise _about(exc, where) from None
        index = self._index(name, head, size)
        cache.save_header(self.commit, name, head, size)
        return index

    def _index(self, name: str, head: bytes, size: int) -> dict[str, TensorInfo]:
        """Validate ``head`` (length prefix and header) for a file of ``size`` bytes."""
        file = self.snapshot / name
        try:
            n = header_length(head[:8], size, file)
            if len(head) < 8 + n:
                raise BadInput("the header fetched is shorter than it claims", file)
            return index_header(head[8:8 + n], size, file)
        except BadInput as exc:
            raise _about(exc, self.where(name)) from None

    def _header_bytes(self, name: str) -> tuple[bytes, int]:
        """The length prefix and header of a shard, and the shard's size, by range requests."""
        url = hf_hub_url(self.ref.repo_id, name, revision=self.commit)
        first, size = get_range(url, 0, FIRST_READ, self.where(name))
        listed = self.listing.get(name)
        if size is None:
            size = listed
        if size is None:
            raise BadInput(f"{self.where(name)}: the Hub gave no size for it")
        if listed is not None and listed != size:
            raise BadInput(f"{self.where(name)}: the Hub lists {listed} bytes but serves {size}")
        n = header_length(first[:8], size, self.snapshot / name)
        if len(first) < 8 + n:
            rest, _ = get_range(url, len(first), 8 + n - len(first), self.where(name))
            first += rest
        return first[:8 + n], size


def _plain_name(name: str, where: str) -> str:
    """A shard name as :func:`.index.inside` accepts it (relative, no ``..``), normalised."""
    if not name:
        raise BadInput(f"{where}: refers to {name!r}, which is not a file name")
    problem = name_problem(name)
    if problem:
        raise BadInput(f"{where}: refers to {name!r}, whose name {problem}")
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts:
        raise BadInput(f"{where}: refers to {name!r}, which is outside the model directory")
    return pure.as_posix()


def _about(exc: BadInput, where: str) -> BadInput:
    """The same refusal, naming the Hub file instead of the local path it was read from."""
    if exc.path is None:
        return exc  # already worded for the Hub
    return BadInput(f"{where}: {str(exc).removeprefix(f'{exc.path}: ')}")


@contextmanager
def _hub_errors(ref: HubRef) -> Iterator[None]:
    """huggingface_hub's exceptions as one-line refusals that say what to do."""
    try:
        yield
    except GatedRepoError:
        raise BadInput(f"{ref}: is gated; accept its conditions on the Hub and set HF_TOKEN "
                       "(or run `hf auth login`)") from None
    except RepositoryNotFoundError:
        here = "no such directory here, and " if ref.bare else ""
        raise BadInput(f"{ref}: {here}no such model on {constants.ENDPOINT} (if it is private, "
                       "set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise BadInput(f"{ref}: the model has no revision {ref.revision!r}") from None
    except (OfflineModeIsEnabled, LocalEntryNotFoundError) as exc:
        raise BadInput(f"{ref}: offline, and a file it needs is not in the Hub cache "
                       f"({reason(exc)})") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "an error"
        raise BadInput(f"{ref}: {constants.ENDPOINT} answered HTTP {status}; nothing was "
                       "checked") from None
    except httpx2.HTTPError as exc:
        raise BadInput(f"{ref}: the connection to {constants.ENDPOINT} failed "
                       f"({reason(exc)}); nothing was checked") from None
