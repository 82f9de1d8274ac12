"""``gac-check --junit FILE.xml``: one JUnit testcase per dimension site, and with
``--target`` one per site and target (a fallback or refused verdict fails).

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
    if site["aligned"] or fail_on in ("never", "refused", "fallback"):
        return False  # refused/fallback gate on the targets' verdicts alone
    return site.get("severity") == "error" or fail_on == "warning"


def target_gated(verdict: dict, fail_on: str) -> bool:
    """A site on a target fails the gate when it is not fast (fallback and refused are
    error-level findings); ``--fail-on refused`` fails only a refusal."""
    if fail_on == "refused":
        return verdict.get("verdict") == "refused"
    return fail_on != "never" and verdict.get("verdict") != "fast"


def to_junit(check: dict, fail_on: str = "error") -> str:
    model = check["model_dir"].rstrip("/").rsplit("/", 1)[-1] or "model"
    profile = check["hardware"]["profile"]
    suite_name = f"gac-check.{model}.{profile}"
    pairs = [(s, v) for s in check["sites"] for v in s.get("targets") or []]
    tests = len(check["sites"]) + len(pairs)
    failures = (sum(gated(s, fail_on) for s in check["sites"])
                + sum(target_gated(v, fail_on) for _, v in pairs))
    root = ET.Element("testsuites", name="gac-check", tests=str(tests),
                      failures=str(failures), errors="0")
    suite = ET.SubElement(root, "testsuite", name=_clean(suite_name),
                          tests=str(tests), failures=str(failures), errors="0",
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
    for site, verdict in pairs:  # --target: one testcase per site and target
        _target_case(suite, suite_name, site, verdict, fail_on)
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


def _target_case(suite: ET.Element, suite_name: str, site: dict, verdict: dict,
                 fail_on: str) -> None:
    case = ET.SubElement(suite, "testcase", classname=_clean(f"{suite_name}.target"),
                         name=_clean(f"{site['name']} on {verdict['target']}"), time="0")
    kernel = verdict.get("kernel") or ""
    text = f"{verdict['verdict']} {kernel}".strip()
    if verdict.get("why"):
        text += f": {verdict['why']}"
    if verdict["verdict"] != "fast":
        fix = verdict.get("fix_to")
        text += (f"; pad to {fix} (--repair --target)" if fix is not None
                 else f"; {verdict.get('cannot_pad') or 'padding cannot make it fast'}")
    if verdict.get("source"):
        src = verdict["source"]
        text += (f"\nrule: {src.get('repo')}@{src.get('ref')}:{src.get('file')} "
                 f"({src.get('function')})")
    if target_gated(verdict, fail_on):
        failure = ET.SubElement(case, "failure", message=_clean(text.splitlines()[0]),
                                type=_clean(verdict["verdict"]))
        failure.text = _clean(text)
    else:
        ET.SubElement(case, "system-out").text = _clean(text)


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
