"""The permissions of everything gac-check writes (issue 22, "tests that bite"): reports, run
documents, JUnit files, merged and zoo reports, the pytest plugin's report, baselines, and
every file and folder of a repaired OUT get what any new file gets under the umask
(0o666 & ~umask, folders 0o777 & ~umask): never mkstemp's 0600, which hides a report from the
CI user serving it, never a mode copied from the model directory, never wider than the umask.

Each case runs under two umasks, so a hard-coded 0644 and a forgotten chmod both show.
Each test fails on one of the "modes" mutants in benchmarks/hand_mutants.py.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from gac_check.bench import baselines
from gac_check.bench.baselines import Fingerprint, Measurement, Provenance
from tests.helpers import gac

pytest_plugins = ["pytester"]

MASKS = [0o022, 0o077]


def umasked(mask: int):
    """``preexec_fn`` for a CLI run under ``mask``."""
    return lambda: os.umask(mask)


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(*paths: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in paths}


def tree_modes(root: Path) -> dict[str, int]:
    """Every file and folder under ``root`` (and ``root``), relative name -> mode."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def expected(mask: int, paths: dict[str, int] | list[str], folders: tuple[str, ...] = ()):
    names = paths if isinstance(paths, list) else list(paths)
    return {n: (0o777 if n in folders else 0o666) & ~mask for n in names}


@pytest.mark.parametrize("mask", MASKS)
def test_report_run_document_and_junit(tiny_checkpoints, tmp_path, mask):
    out = tmp_path / "new" / "dir"
    old = tmp_path / "old.html"  # an existing, private report is replaced by a new file
    old.write_text("old")
    old.chmod(0o600)
    for html in (out / "a100.html", old):
        proc = gac(tiny_checkpoints["single"], "--gpu", "a100", "--report", html, "--junit",
                   html.with_suffix(".xml"), preexec_fn=umasked(mask))
        assert proc.returncode == 1, proc.stderr
    written = [out / "a100.html", out / "a100.json", out / "a100.xml", old,
               old.with_suffix(".json"), old.with_suffix(".xml")]
    assert modes(*written) == expected(mask, [p.name for p in written])
    assert modes(tmp_path / "new", out) == expected(mask, ["new", "dir"], ("new", "dir"))


@pytest.mark.parametrize("mask", MASKS)
def test_zoo_report_and_merge(tiny_checkpoints, tmp_path, mask):
    zoo = tmp_path / "zoo.html"
    proc = gac(tiny_checkpoints["single"], tiny_checkpoints["sharded"], "--gpu", "a100",
               "--report", zoo, "--junit", tmp_path / "zoo.xml", preexec_fn=umasked(mask))
    assert proc.returncode == 1, proc.stderr
    merged = tmp_path / "merged" / "all.html"
    proc = gac("report", "merge", zoo.with_suffix(".json"), "-o", merged,
               preexec_fn=umasked(mask))
    assert proc.returncode == 0, proc.stderr
    written = [zoo, zoo.with_suffix(".json"), tmp_path / "zoo.xml", merged]
    assert modes(*written) == expected(mask, [p.name for p in written])


@pytest.mark.parametrize("mask", MASKS)
def test_every_file_and_folder_of_a_repaired_out(tiny_checkpoints, tmp_path, mask):
    """Side files are copied as new files: a world-readable tokenizer does not stay
    world-readable under umask 077, a private one gets the umask's mode like the rest."""
    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoints["single"], model)
    (model / "tokenizer.json").write_text("{}")
    (model / "tokenizer.json").chmod(0o644)
    (model / "notes.txt").write_text("private")
    (model / "notes.txt").chmod(0o600)
    (model / "extra").mkdir()
    (model / "extra" / "vocab.txt").write_text("a\nb\n")
    (model / "extra" / "vocab.txt").chmod(0o640)
    (model / "extra").chmod(0o750)
    out = tmp_path / "out"
    proc = gac(model, "--repair", out, "--gpu", "a100", preexec_fn=umasked(mask),
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = tree_modes(out)
    assert {"tokenizer.json", "notes.txt", "extra/vocab.txt", "model.safetensors",
            "config.json", "gac-repair.json"} <= set(got)
    assert got == expected(mask, got, (".", "extra"))


@pytest.mark.parametrize("mask", MASKS)
def test_baselines(tmp_path, mask):
    fp = Fingerprint("cpu", "test cpu", isa=("avx2",), torch="2.13.0", threads=1)
    prov = Provenance("measured", "2026-11-25T00:00:00Z", "test")
    path = tmp_path / "baselines" / "cpu-test.json"
    with umask(mask):
        baselines.update(path, "cpu-test", fp, [Measurement.from_samples("k/a=1", [1.0, 1.1],
                                                                         prov)])
        first = modes(path)
        path.chmod(0o600)
        baselines.update(path, "cpu-test", fp, [Measurement.from_samples("k/a=2", [1.0, 1.1],
                                                                         prov)])
    assert first == modes(path) == expected(mask, [path.name])
    assert modes(path.parent) == expected(mask, ["baselines"], ("baselines",))


@pytest.mark.parametrize("mask", MASKS)
def test_the_plugins_report(pytester, mask):
    pytester.makepyfile("def test_ok():\n    assert True\n")
    with umask(mask):
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--gac-report",
                                              "reports/run.html")
    result.assert_outcomes(passed=1)
    report = pytester.path / "reports" / "run.html"
    assert modes(report, report.with_suffix(".json")) == expected(mask, ["run.html",
                                                                         "run.json"])
