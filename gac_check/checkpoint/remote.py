"""Index a model on the Hugging Face Hub from its JSON files and safetensors headers only.

Choosing a compressed model, or publishing one, should not cost tens of gigabytes: a check
needs names, dtypes and shapes, which a safetensors file keeps in a header at its start. So a
Hub model is indexed from the file listing (the Hub's model info with ``blobs=True``),
``config.json``, the shard index and small sidecar JSON files (``HF_ENDPOINT``, ``HF_TOKEN``
and offline mode all apply) and, per shard, one HTTP range request for its first
:data:`FIRST_READ` bytes (a second only when a header is longer). Every request is one bounded
GET of :mod:`.hub_io` (time, bytes and requests per model: :class:`.hub_io.Limits`), and every
field of every answer is checked before use; optional sidecars that fail are notes. The header
bytes go through the same validation as a local file's
(:mod:`gac_check.checkpoint.safetensors_header`), so a remote check and a local check of the
same files agree.

Everything is read at one commit, resolved once, so a branch that moves mid-check cannot mix
two versions. The listing, the JSON files and the header bytes are kept per commit (a commit
never changes), once validated, under the Hub's assets cache, so a model checked once can be
checked again offline (``HF_HUB_OFFLINE=1``) or when the network is down; a shard already
downloaded into the Hub cache is read from there. Weights pickled by ``torch.save``
(LLM-Pruner, SVD-LLM) are refused: their index is a pickle inside a zip, and only
downloading them is supported.
"""
from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from urllib.parse import quote

from huggingface_hub import constants, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import HfUriError, HFValidationError
from huggingface_hub.utils import parse_hf_uri, validate_repo_id

from gac_check.checkpoint.files import MAX_JSON_BYTES, name_problem, parse_json, read_json
from gac_check.checkpoint.hub_io import (
    COMMIT,
    Answer,
    Fetch,
    HubCache,
    Limits,
    Unreachable,
    endpoint,
    get,
    over_budget,
)
from gac_check.checkpoint.hub_io import content_size as _content_size
from gac_check.checkpoint.index import (
    MAX_SIDECAR_BYTES,
    TORCH_SUFFIXES,
    TRAINER_STATE_FILES,
    Checkpoint,
)
from gac_check.checkpoint.quantized import hub_reader, read_quantization
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
#: The model listing (``?blobs=True``) is at most this long: ~300 bytes a file, so 10,000 files.
MAX_LISTING_BYTES = 4 * 1024 * 1024
#: Sidecars fetched per model, and their bytes together; past either, skipped with a note.
MAX_SIDECARS = 16
MAX_SIDECAR_TOTAL = 2 * 1024 * 1024
#: A listed file name: at most this many bytes per path component (what filesystems allow).
MAX_NAME_BYTES = 255


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


def open_remote(ref: HubRef | str, limits: Limits | None = None) -> RemoteCheckpoint:
    """Index a Hub model at one commit, reading kilobytes: listing, JSON files, headers.

    Every request is bounded (:mod:`.hub_io`): ``limits`` are the seconds per step, and the
    bytes and requests the whole model may cost.
    """
    ref = parse_ref(ref) if isinstance(ref, str) else ref
    fetch = Fetch(limits or Limits())
    fetch.start()
    start = time.perf_counter()
    with _quiet():
        commit, listing = _resolve(ref, fetch)
        hub = _Hub(ref, commit, listing, fetch)
        config = hub.json("config.json") if "config.json" in listing else {}
        container, names = hub.weight_files()
        tensors = hub.tensors(names)
        sidecars = hub.sidecars()  # optional: after what the check needs, from what is left
    fetch.seconds = time.perf_counter() - start
    snapshot = hub.snapshot
    return read_quantization(RemoteCheckpoint(snapshot, config, tensors, container,
                            [snapshot / n for n in names], sidecars, ref=ref, commit=commit,
                            fetch=fetch), hub_reader(hub._range, snapshot))


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
    listing where the Hub cannot be asked (offline mode, no network, no answer in time)."""
    revision = ref.revision or constants.DEFAULT_REVISION
    cache = HubCache(ref.repo_id)
    if constants.is_offline_mode():
        why = "offline (HF_HUB_OFFLINE is set)"
    else:
        url = f"{endpoint()}/api/models/{ref.repo_id}"
        if ref.revision is not None:
            url += f"/revision/{quote(ref.revision, safe='')}"
        try:
            answer = get(url + "?blobs=True", fetch, str(ref),
                         min(MAX_LISTING_BYTES, fetch.limits.max_bytes))
        except Unreachable as exc:
            why = exc.why.removesuffix("; nothing was checked")
        else:
            if answer.status != 200:
                raise BadInput(_listing_status(ref, answer))
            commit, listing = _parse_listing(ref, answer.body, fetch)
            cache.save_listing(revision, commit, listing)
            return commit, listing
    commit = cache.commit(revision)
    listing = cache.listing(commit) if commit else None
    if commit is None or listing is None:
        raise BadInput(f"{ref}: {why}, and this model was never checked here before; check "
                       "it once online, or check a downloaded copy's directory")
    fetch.offline = True  # the cache is trusted no more than the network: names checked again
    return commit, {n: v for n, v in listing.items() if not listed_name_problem(n)}


def _listing_status(ref: HubRef, answer: Answer) -> str:
    """The model listing's HTTP error as what it means for the user."""
    code = answer.headers.get("X-Error-Code", "")
    if code == "RevisionNotFound":
        return f"{ref}: the model has no revision {ref.revision!r}"
    if answer.status == 401 or (answer.status == 404 and code in ("", "RepoNotFound")):
        here = "no such directory here, and " if ref.bare else ""
        return (f"{ref}: {here}no such model on {endpoint()} (if it is private, set "
                "HF_TOKEN)")
    return _status_line(str(ref), answer)


def _status_line(where: str, answer: Answer) -> str:
    """An HTTP error as one line: gated, forbidden, not served, or the status itself."""
    if answer.headers.get("X-Error-Code") == "GatedRepo":
        return (f"{where}: is gated; accept its conditions on the Hub and set HF_TOKEN (or "
                "run `hf auth login`)")
    if answer.status == 401:
        return (f"{where}: {endpoint()} asks for a token (HTTP 401 unauthorized); set "
                "HF_TOKEN to one that may read this model; nothing was checked")
    if answer.status == 403:
        return (f"{where}: {endpoint()} refused access (HTTP 403 forbidden); set HF_TOKEN to "
                "a token that may read this model; nothing was checked")
    if answer.status == 404:
        return f"{where}: listed by the Hub, but not served (HTTP 404)"
    return f"{where}: {endpoint()} answered HTTP {answer.status}; nothing was checked"


def _parse_listing(ref: HubRef, body: bytes, fetch: Fetch) -> tuple[str, dict[str, int | None]]:
    """The commit and file name -> size of a model listing, every field checked before use."""
    def not_hub(why: str) -> BadInput:
        return BadInput(f"{ref}: {endpoint()} answered with a model listing that is not the "
                        f"Hub's ({why})")

    try:
        data = parse_json(body.decode("utf-8"), Path("listing"))
    except UnicodeDecodeError:
        raise not_hub("not UTF-8") from None
    except BadInput as exc:
        raise not_hub(str(exc).removeprefix("listing: ")) from None
    if not isinstance(data, dict):
        raise not_hub("not a JSON object")
    sha = data.get("sha")
    if not isinstance(sha, str) or not COMMIT.match(sha):
        raise not_hub(f"it does not say which commit {ref.revision or 'main'} is")
    if ref.revision is not None and COMMIT.match(ref.revision) and sha != ref.revision:
        raise BadInput(f"{ref}: {endpoint()} answered with commit {sha} for the pinned commit "
                       f"{ref.revision}; nothing was checked")
    siblings = data.get("siblings", [])
    if not isinstance(siblings, list):
        raise not_hub("siblings is not a list")
    listing: dict[str, int | None] = {}
    skipped: list[str] = []
    for s in siblings:
        name = s.get("rfilename") if isinstance(s, dict) else None
        if not isinstance(name, str):
            raise not_hub(f"a file without a name: {str(s)[:80]}")
        problem = listed_name_problem(name)
        if problem:
            skipped.append(f"{name[:60]!r} ({problem})")
            continue
        if name in listing:
            raise not_hub(f"it lists {name!r} twice")
        size = s.get("size")
        listing[name] = size if type(size) is int and 0 <= size < 2 ** 63 else None
    if skipped:
        fetch.notes.append(f"hf://{ref.repo_id}@{sha}: ignored {len(skipped)} listed file "
                           f"name(s) that are not plain relative paths: {skipped[0]}"
                           + (", ..." if len(skipped) > 1 else ""))
    return sha, listing


def listed_name_problem(name: str) -> str | None:
    """Why a listed file name cannot be a file of a model repository, or None."""
    if not name:
        return "empty"
    problem = name_problem(name)
    if problem:
        return problem
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "holds a control character"
    if "\\" in name:
        return "holds a backslash"
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return "is not a plain relative path"
    if any(len(p.encode()) > MAX_NAME_BYTES for p in parts):
        return f"has a part longer than {MAX_NAME_BYTES} bytes"
    return None


# --- the files of one commit -----------------------------------------------------------------

@dataclass
class _Hub:
    """One commit of one repo: fetches its files the way :mod:`.index` reads a directory's."""

    ref: HubRef
    commit: str
    listing: dict[str, int | None]
    fetch: Fetch
    cache: HubCache = field(init=False)

    def __post_init__(self) -> None:
        self.cache = HubCache(self.ref.repo_id)

    @property
    def snapshot(self) -> Path:
        folder = f"models--{self.ref.repo_id.replace('/', '--')}"
        return Path(constants.HF_HUB_CACHE) / folder / "snapshots" / self.commit

    def where(self, name: str = "") -> str:
        return f"{HF_SCHEME}{self.ref.repo_id}@{self.commit}" + (f"/{name}" if name else "")

    def url(self, name: str) -> str:
        return hf_hub_url(self.ref.repo_id, name, revision=self.commit)

    def json(self, name: str, limit: int = MAX_JSON_BYTES) -> dict:
        """A JSON file of the commit: the user's Hub cache, ours, or one bounded GET."""
        where = self.where(name)
        size = self.listing.get(name)
        if size is not None and size > limit:
            raise BadInput(f"{where}: is larger than {limit} bytes, too large for a JSON config")
        local = try_to_load_from_cache(self.ref.repo_id, name, revision=self.commit)
        if isinstance(local, str):  # downloaded by the user before: a local file
            try:
                return read_json(Path(local), limit)
            except BadInput as exc:
                raise _about(exc, where) from None
        raw = self.cache.file(self.commit, name)
        fresh = raw is None
        if raw is None:
            if self.fetch.offline or constants.is_offline_mode():
                raise BadInput(f"{where}: offline, and it is not in the cache")
            answer = get(self.url(name), self.fetch, where, limit if size is None else size,
                         commit=self.commit)
            if answer.status != 200:
                raise BadInput(_status_line(where, answer))
            raw = answer.body
        if len(raw) > limit:
            raise BadInput(f"{where}: is larger than {limit} bytes, too large for a JSON config")
        try:
            data = parse_json(raw.decode("utf-8"), Path("x"))
        except UnicodeDecodeError:
            raise BadInput(f"{where}: is not UTF-8 text") from None
        except BadInput as exc:
            raise _about(exc, where) from None
        if not isinstance(data, dict):
            raise BadInput(f"{where}: must hold a JSON object")
        if fresh:
            self.cache.save_file(self.commit, name, raw)
        return data

    def sidecars(self) -> dict[str, dict]:
        """Top-level JSON files but config and indexes, at most 1 MB each (as :mod:`.index`);
        optional, so one that cannot be read, or one past the model's budget, is skipped with a
        note, and at most :data:`MAX_SIDECARS` (:data:`MAX_SIDECAR_TOTAL` bytes) are read."""
        out: dict[str, dict] = {}
        names = [n for n in sorted(self.listing)
                 if "/" not in n and n.endswith(".json") and n != "config.json"
                 and not n.endswith(".index.json")
                 and (self.listing[n] or 0) <= MAX_SIDECAR_BYTES]  # a tokenizer.json is not ours
        spent, skipped = 0, names[MAX_SIDECARS:]
        for name in names[:MAX_SIDECARS]:
            before = self.fetch.bytes
            limit = min(MAX_SIDECAR_BYTES, MAX_SIDECAR_TOTAL - spent)
            try:
                out[name] = self.json(name, limit)
            except BadInput as exc:
                why = str(exc).removesuffix("; nothing was checked")
                self.fetch.notes.append(f"skipped the sidecar {why}")
            spent += self.fetch.bytes - before
        if skipped:
            self.fetch.notes.append(f"{self.where()}: read the first {MAX_SIDECARS} sidecar JSON "
                                    f"files only; skipped {len(skipped)} more ({skipped[0]}, ...)")
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
        cached = self.cache.header(self.commit, name)
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
        self.cache.save_header(self.commit, name, head, size)
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
        where = self.where(name)
        first, size = self._range(name, 0, FIRST_READ)
        listed = self.listing.get(name)
        if size is None:
            size = listed
        if size is None:
            raise BadInput(f"{where}: the Hub gave no size for it")
        if listed is not None and listed != size:
            raise BadInput(f"{where}: the Hub lists {listed} bytes but serves {size}")
        n = header_length(first[:8], size, self.snapshot / name)
        if len(first) < 8 + n:
            rest = 8 + n - len(first)
            if rest > self.fetch.bytes_left():  # refused before a byte of it is asked for
                raise over_budget(f"{where}: its header of {n:,} bytes",
                                  self.fetch.limits.max_bytes)
            more, _ = self._range(name, len(first), rest)
            first += more
        return first[:8 + n], size

    def _range(self, name: str, start: int, length: int) -> tuple[bytes, int | None]:
        """At most ``length`` bytes from ``start``, and the file's size where the server says.

        A server that ignores the range and sends the whole file is read only as far as
        needed, then the connection is dropped: a missing Range feature must not cost the
        weights.
        """
        where = self.where(name)
        answer = get(self.url(name), self.fetch, where, start + length,
                     headers={"Range": f"bytes={start}-{start + length - 1}"},
                     stop_at=start + length, commit=self.commit)
        if answer.status >= 400:
            raise BadInput(_status_line(where, answer))
        size = _content_size(answer, start, where)
        skip = start if answer.status == 200 else 0
        return answer.body[skip:skip + length], size


def _plain_name(name: str, where: str) -> str:
    """A shard name as :func:`.index.inside` accepts it (relative, no ``..``), normalised."""
    if not name:
        raise BadInput(f"{where}: refers to {name!r}, which is not a file name")
    problem = name_problem(name)
    if problem:
        raise BadInput(f"{where}: refers to {name!r}, whose name {problem}")
    problem = listed_name_problem(PurePosixPath(name).as_posix())
    if problem and "relative path" not in problem:
        raise BadInput(f"{where}: refers to {name[:120]!r}, whose name {problem}")
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
