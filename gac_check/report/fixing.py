"""Before and after a fix: the re-check of OUT, each site with what it was in the input.

``--repair`` and ``--realign`` write their ``--report``/``--junit`` from the re-check of OUT
(what a CI gate must judge), but a reviewer also wants to see what the fix changed. Both come
from two ``gac-check/1`` documents (the input's and OUT's) joined by site name: repairs and
realigns never rename a site, they change its value.
"""
from __future__ import annotations

import copy


def annotate(before: dict, after: dict) -> dict:
    """A copy of ``after`` whose sites carry ``before`` (value, aligned, severity in the input)
    and which names the input it was fixed from."""
    was = {s["name"]: s for s in before["sites"]}
    doc = copy.deepcopy(after)
    for site in doc["sites"]:
        old = was.get(site["name"])
        site["before"] = None if old is None else {
            "value": old["value"], "aligned": old["aligned"], "severity": old["severity"]}
    doc["fixed_from"] = before["model_dir"]
    return doc


def fix_record(kind: str, before: dict, after: dict, quality: dict | None = None) -> dict:
    """The run document's ``fix`` entry: what was fixed how, summaries, and every site whose
    value or verdict changed; for a realign, ``quality``: what its ranks and rounding each rank
    keep (:meth:`gac_check.ranks.kept.Kept.to_json`), which the report charts."""
    was = {s["name"]: s for s in before["sites"]}
    changes = []
    for site in after["sites"]:
        old = was.get(site["name"])
        if old is None or (old["value"], old["aligned"]) == (site["value"], site["aligned"]):
            continue
        changes.append({"name": site["name"], "role": site["role"],
                        "from": old["value"], "to": site["value"],
                        "before": _state(old), "after": _state(site)})
    record = {"kind": kind, "source": before["model_dir"], "out": after["model_dir"],
              "before": before["summary"], "after": after["summary"], "changes": changes}
    if quality is not None:
        record["quality"] = quality
    return record


def _state(site: dict) -> str:
    return "aligned" if site["aligned"] else site.get("severity") or "misaligned"


def change_note(site: dict) -> str | None:
    """One line for a site the fix touched (a JUnit testcase's output), else None."""
    old = site.get("before")
    if not old or (old["value"], old["aligned"]) == (site["value"], site["aligned"]):
        return None
    state = "aligned" if site["aligned"] else site.get("severity") or "misaligned"
    was = "aligned" if old["aligned"] else old.get("severity") or "misaligned"
    return f"was {old['value']} ({was}) in the input, now {site['value']} ({state})"
