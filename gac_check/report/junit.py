"""``gac-check --junit FILE.xml``: one JUnit testcase per dimension site.

CI systems (GitHub, GitLab, Jenkins) already show JUnit files as test results, so a site that
breaks the gate shows up as a failed test named after the tensor dimension, next to pytest's
own ``--junitxml`` output. Built from the ``gac-check/1`` dict, like every other rendering.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gac_check.contract.slowdown import Slowdown
from gac_check.report.fixing import change_note

#: XML 1.0 cannot carry these at all, escaped or not; checkpoint names may contain them.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean(text: object) -> str:
    return _NOT_XML.sub("\ufffd", str(text))


def gated(site: dict, fail_on: str) -> bool:
    """Whether a site fails a gate of this severity (the CLI's exit-code rule, per site)."""
    if site["aligned"] or fail_on == "never":
        return False
    return site.get("severity") == "error" or fail_on == "warning"


def to_junit(check: dict, fail_on: str = "error") -> str:
    model = check["model_dir"].rstrip("/").rsplit("/", 1)[-1] or "model"
    profile = check["hardware"]["profile"]
    suite_name = f"gac-check.{model}.{profile}"
    failures = sum(gated(s, fail_on) for s in check["sites"])
    root = ET.Element("testsuites", name="gac-check", tests=str(len(check["sites"])),
                      failures=str(failures), errors="0")
    suite = ET.SubElement(root, "testsuite", name=_clean(suite_name),
                          tests=str(len(check["sites"])), failures=str(failures), errors="0",
                          skipped="0", time="0")
    props = ET.SubElement(suite, "properties")
    fields = [("model_dir", check["model_dir"]), ("profile", profile),
              ("dtype", check["hardware"].get("dtype", "")), ("fail_on", fail_on),
              ("format", check.get("format", ""))]
    if check.get("fixed_from"):  # the re-check of a --repair/--realign OUT
        fields.append(("fixed_from", check["fixed_from"]))
    for key, value in fields:
        ET.SubElement(props, "property", name=key, value=_clean(value))
    for site in check["sites"]:
        _testcase(suite, suite_name, site, fail_on)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _testcase(suite: ET.Element, suite_name: str, site: dict, fail_on: str) -> None:
    layer = site.get("layer")
    classname = f"{suite_name}.layer{layer}" if layer is not None else f"{suite_name}.model"
    case = ET.SubElement(suite, "testcase", classname=_clean(classname),
                         name=_clean(site["name"]), time="0")
    changed = change_note(site)  # a --repair/--realign re-check: what the fix did here
    if site["aligned"]:
        if changed:
            ET.SubElement(case, "system-out").text = _clean(changed)
        return
    message = _message(site)
    if gated(site, fail_on):
        failure = ET.SubElement(case, "failure", message=_clean(message),
                                type=_clean(site.get("severity") or "misaligned"))
        failure.text = _clean(f"{site['name']}: {message}\ntensors: "
                              + ", ".join(site.get("tensors") or []))
    else:
        out = ET.SubElement(case, "system-out")
        out.text = _clean(f"{site.get('severity')} below the gate: {message}"
                          + (f"\n{changed}" if changed else ""))


def _message(site: dict) -> str:
    text = f"{site['value']} breaks {', '.join(site.get('rules') or [])}"
    if site.get("refusal"):
        text += f"; no exact zero-padding repair ({site['refusal']})"
    elif site.get("repair_to"):
        text += f"; pad to {site['repair_to']} (+{site.get('padding_params', 0):,} params)"
    if site.get("slowdown"):
        text += f"; {Slowdown(**site['slowdown']).sentence()}"
    elif site.get("expected_slowdown"):  # a document written before slowdowns had provenance
        text += f"; expected {site['expected_slowdown']:.2f}x slower"
    return text
