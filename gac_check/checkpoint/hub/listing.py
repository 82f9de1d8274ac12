"""A Hub model's file listing at one commit: the revision resolved to a commit once, every
file and its size, every field of the answer checked before use; the cached listing where the
Hub cannot be asked (offline mode, no network, no answer in time)."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from huggingface_hub import constants

from gac_check.checkpoint.files import name_problem, parse_json
from gac_check.checkpoint.hub.ref import HubRef
from gac_check.checkpoint.hub.transport import (
    COMMIT,
    Answer,
    Fetch,
    HubCache,
    Unreachable,
    endpoint,
    get,
    status_line,
)
from gac_check.errors import BadInput

#: The model listing (``?blobs=True``) is at most this long: ~300 bytes a file, so 10,000 files.
MAX_LISTING_BYTES = 4 * 1024 * 1024
#: A listed file name: at most this many bytes per path component (what filesystems allow).
MAX_NAME_BYTES = 255

Listing = dict[str, int | None]


def resolve(ref: HubRef, fetch: Fetch) -> tuple[str, Listing]:
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
                         min(MAX_LISTING_BYTES, fetch.limits.max_bytes), listing=True)
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
    return status_line(str(ref), answer)


def _parse_listing(ref: HubRef, body: bytes, fetch: Fetch) -> tuple[str, Listing]:
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
    listing: Listing = {}
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
