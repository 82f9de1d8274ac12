"""The files of one commit of a Hub model, chosen and read the way :mod:`.index` reads a
directory's: which files hold the weights (the shard index first, else every top-level
``*.safetensors``; torch pickles refused), and the small JSON files (``config.json``, the shard
index, optional sidecars), each from the user's Hub cache, ours, or one bounded GET."""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

from huggingface_hub import constants, hf_hub_url, try_to_load_from_cache

from gac_check.checkpoint.files import name_problem, parse_json, read_json
from gac_check.checkpoint.hub.listing import Listing, listed_name_problem
from gac_check.checkpoint.hub.ref import HF_SCHEME, HubRef
from gac_check.checkpoint.hub.transport import Fetch, HubCache, get, status_line
from gac_check.checkpoint.index import MAX_SIDECAR_BYTES, TORCH_SUFFIXES, TRAINER_STATE_FILES
from gac_check.errors import BadInput

#: Sidecars fetched per model, and their bytes together; past either, skipped with a note.
MAX_SIDECARS = 16
MAX_SIDECAR_TOTAL = 2 * 1024 * 1024
#: The longest config.json read from a Hub: a model's config is kilobytes, so one listed
#: without a size and served as a gigabyte stops here, not at the model's byte budget.
MAX_CONFIG_BYTES = 1024 * 1024
#: The longest shard index: ~100 bytes a tensor, so ~160,000 tensors (the largest MoE
#: checkpoints have ~90,000).
MAX_INDEX_BYTES = 16 * 1024 * 1024


@dataclass
class HubCommit:
    """One commit of one repo, its listing, and what reading it costs."""

    ref: HubRef
    commit: str
    listing: Listing
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

    def downloaded(self, name: str) -> Path | None:
        """The file in the user's Hub cache, if they downloaded it before."""
        local = try_to_load_from_cache(self.ref.repo_id, name, revision=self.commit)
        return Path(local) if isinstance(local, str) else None

    def offline(self) -> bool:
        return self.fetch.offline or constants.is_offline_mode()


def read_hub_json(hub: HubCommit, name: str, limit: int) -> dict:
    """A JSON file of the commit, at most ``limit`` bytes (its kind's cap): the user's Hub
    cache, ours, or one bounded GET."""
    where = hub.where(name)
    size = hub.listing.get(name)
    if size is not None and size > limit:
        raise BadInput(f"{where}: is larger than {limit} bytes, too large for a JSON config")
    local = hub.downloaded(name)
    if local is not None:
        try:
            return read_json(local, limit)
        except BadInput as exc:
            raise about(exc, where) from None
    raw = hub.cache.file(hub.commit, name)
    fresh = raw is None
    if raw is None:
        if hub.offline():
            raise BadInput(f"{where}: offline, and it is not in the cache")
        answer = get(hub.url(name), hub.fetch, where, limit if size is None else size,
                     commit=hub.commit)
        if answer.status != 200:
            raise BadInput(status_line(where, answer))
        raw = answer.body
    if len(raw) > limit:
        raise BadInput(f"{where}: is larger than {limit} bytes, too large for a JSON config")
    try:
        data = parse_json(raw.decode("utf-8"), Path("x"))
    except UnicodeDecodeError:
        raise BadInput(f"{where}: is not UTF-8 text") from None
    except BadInput as exc:
        raise about(exc, where) from None
    if not isinstance(data, dict):
        raise BadInput(f"{where}: must hold a JSON object")
    if fresh:
        hub.cache.save_file(hub.commit, name, raw)
    return data


def sidecars(hub: HubCommit) -> dict[str, dict]:
    """Top-level JSON files but config and indexes, at most 1 MB each (as :mod:`.index`);
    optional, so one that cannot be read, or one past the model's budget, is skipped with a
    note, and at most :data:`MAX_SIDECARS` (:data:`MAX_SIDECAR_TOTAL` bytes) are read."""
    out: dict[str, dict] = {}
    names = [n for n in sorted(hub.listing)
             if "/" not in n and n.endswith(".json") and n != "config.json"
             and not n.endswith(".index.json")
             and (hub.listing[n] or 0) <= MAX_SIDECAR_BYTES]  # a tokenizer.json is not ours
    spent, skipped = 0, names[MAX_SIDECARS:]
    for name in names[:MAX_SIDECARS]:
        before = hub.fetch.bytes
        limit = min(MAX_SIDECAR_BYTES, MAX_SIDECAR_TOTAL - spent)
        try:
            out[name] = read_hub_json(hub, name, limit)
        except BadInput as exc:
            why = str(exc).removesuffix("; nothing was checked")
            hub.fetch.notes.append(f"skipped the sidecar {why}")
        spent += hub.fetch.bytes - before
    if skipped:
        hub.fetch.notes.append(f"{hub.where()}: read the first {MAX_SIDECARS} sidecar JSON "
                               f"files only; skipped {len(skipped)} more ({skipped[0]}, ...)")
    return out


def weight_files(hub: HubCommit) -> tuple[str, list[str]]:
    """The container and its files, chosen exactly as a local directory's would be."""
    top = sorted(n for n in hub.listing if "/" not in n)
    if "model.safetensors.index.json" in hub.listing:
        return "safetensors", _shards(hub, "model.safetensors.index.json")
    if "pytorch_model.bin.index.json" in hub.listing:
        _refuse_torch(hub, _shards(hub, "pytorch_model.bin.index.json"))
    safetensors = [n for n in top if n.endswith(".safetensors")]
    if safetensors:
        return "safetensors", safetensors
    torch_files = [n for n in top if n.endswith(TORCH_SUFFIXES)]
    preferred = [n for n in torch_files if fnmatch(n, "pytorch_model*.bin")]
    torch_files = preferred or [n for n in torch_files
                                if not any(fnmatch(n, p) for p in TRAINER_STATE_FILES)]
    if torch_files:
        _refuse_torch(hub, torch_files)
    raise BadInput(f"{hub.where()}: holds no checkpoint (no *.safetensors, "
                   "pytorch_model.bin or *.pt)")


def _shards(hub: HubCommit, index_name: str) -> list[str]:
    weight_map = read_hub_json(hub, index_name, MAX_INDEX_BYTES).get("weight_map")
    where = hub.where(index_name)
    if not isinstance(weight_map, dict) or not weight_map:
        raise BadInput(f"{where}: has no weight_map")
    names = set(weight_map.values())
    if not all(isinstance(n, str) for n in names):
        raise BadInput(f"{where}: weight_map values must be shard file names (strings)")
    shards: dict[str, None] = {}  # ordered set: "a" and "./a" are one shard
    for name in sorted(names):
        shard = _plain_name(name, where)
        if shard not in hub.listing:
            raise BadInput(f"{where}: names shard {name!r}, which is missing")
        shards[shard] = None
    return list(shards)


def _refuse_torch(hub: HubCommit, names: list[str]) -> None:
    total = sum(hub.listing.get(n) or 0 for n in names)
    raise BadInput(f"{hub.where(names[0])}: is a torch.save pickle (LLM-Pruner and SVD-LLM "
                   "save whole models this way); its index is inside the pickle, so the "
                   f"weights ({total:,} bytes in {len(names)} file(s)) would have to be "
                   "downloaded: download the model and check its directory")


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


def about(exc: BadInput, where: str) -> BadInput:
    """The same refusal, naming the Hub file instead of the local path it was read from."""
    if exc.path is None:
        return exc  # already worded for the Hub
    return BadInput(f"{where}: {str(exc).removeprefix(f'{exc.path}: ')}")
