"""The pytest plugin (entry point ``pytest11``): options, markers, fixtures, hypothesis profiles.

Installed with the package, so any compressor repository gets ``--gpu``/``--model`` and the
``gac_*`` fixtures. Heavy imports (torch, the bench engine) happen inside fixtures, never at
plugin load, so ``pytest --help`` stays fast.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

OPTION_GPU = "--gpu"
OPTION_MODEL = "--model"
OPTION_REPORT = "--gac-report"
OPTION_UPDATE_BASELINES = "--gac-update-baselines"
OPTION_PERF_FACTOR = "--gac-perf-factor"
GPU_CHOICES = ("a100", "h100", "h200", "cpu", "auto")


def add_options(group) -> None:
    """The option group; shared by this plugin and anything else that builds the same options."""
    group.addoption(OPTION_GPU, action="store", default=None, choices=GPU_CHOICES,
                    help="hardware profile the suites check and measure against "
                    "(a100, h100, h200, cpu, auto); default: auto")
    group.addoption(OPTION_MODEL, action="append", default=[], metavar="DIR",
                    help="model directory the suites check (repeatable)")
    group.addoption(OPTION_REPORT, action="store", default=None, metavar="FILE.html",
                    help="write the alignment-regression HTML report here")
    group.addoption(OPTION_UPDATE_BASELINES, action="store_true", default=False,
                    help="store this run's measurements as the profile's new baseline")
    group.addoption(OPTION_PERF_FACTOR, action="store", type=float, default=None,
                    metavar="X", help="perf regression threshold as a time ratio (default "
                    "1.10 on a GPU, 1.08 on a CPU)")


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser.getgroup("gac-check", "gac-check alignment regression"))


def register_hypothesis_profiles() -> None:
    """``ci``: no deadline (shared runners stall), derandomized (a red CI is reproducible);
    both print the ``@reproduce_failure`` blob so a report can quote it."""
    from hypothesis import HealthCheck, settings

    settings.register_profile("ci", deadline=None, derandomize=True, max_examples=25,
                              print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("dev", deadline=None, max_examples=25, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE",
                                         "ci" if os.environ.get("CI") else "dev"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with a reason else")
    config.addinivalue_line("markers", "perf: a timing test; serialized per device under xdist")
    register_hypothesis_profiles()
    from gac_check import workers
    from gac_check.report import collect

    workers.register(config)  # xdist: pin workers to devices, serialise perf tests per device
    collect.register(config)  # --gac-report: collect on the controller, write at session end


@pytest.fixture(scope="session")
def gac_profile(request: pytest.FixtureRequest) -> str:
    """The hardware profile key this session checks against (``--gpu``, default auto)."""
    from gac_check.hardware import resolve_profile

    return resolve_profile(request.config.getoption(OPTION_GPU) or "auto")


@pytest.fixture(scope="session")
def gac_models(request: pytest.FixtureRequest) -> list[Path]:
    """The model directories given with ``--model`` (possibly none)."""
    return [Path(p) for p in request.config.getoption(OPTION_MODEL)]


@pytest.fixture(scope="session")
def gac_contract(gac_profile: str):
    """A factory: ``gac_contract(dtype)`` is the Shape Contract of this session's profile."""
    from gac_check.contract import for_hardware

    return lambda dtype="float16": for_hardware(gac_profile, dtype)


# ------------------------------------------------------------ perf: gac_check/bench/pytest_perf.py
_PERF = pytest.StashKey["object"]()


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: only tests that will run count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from gac_check.bench import pytest_perf

    pytest_perf.collection_modifyitems(config, items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from gac_check.bench import pytest_perf

    pytest_perf.session_finish(session.config.stash.get(_PERF, None))


@pytest.fixture(scope="session")
def _gac_perf_session(request: pytest.FixtureRequest):
    from gac_check.bench import pytest_perf

    config = request.config
    if _PERF not in config.stash:
        config.stash[_PERF] = pytest_perf.make_session(config)
    return config.stash[_PERF]


@pytest.fixture(scope="session")
def gac_baseline(_gac_perf_session):
    """The stored Baseline for the device perf tests measure on, or None when there is no
    matching one (``gac_bench.regression`` then skips with the reason; never a pass)."""
    return _gac_perf_session.baseline()


@pytest.fixture
def gac_bench(request: pytest.FixtureRequest, _gac_perf_session):
    """Measure workloads on the present device (``.measure``, ``.interleaved``) or check one
    against the baseline (``.regression``); results go to the report and, with
    --gac-update-baselines, to the baseline file."""
    from gac_check.bench.pytest_perf import Bench

    return Bench(_gac_perf_session, request.node)
