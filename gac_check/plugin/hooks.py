"""The pytest plugin (entry point ``pytest11``): options, markers, fixtures, hypothesis profiles.

Installed with the package, so any compressor repository gets ``--gpu``/``--model`` and the
``gac_*`` fixtures. Heavy imports (torch, the bench engine) happen inside fixtures, never at
plugin load, so ``pytest --help`` stays fast.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gac_check.plugin.options import (
    ALIASES,
    OPTION_DTYPE,
    OPTION_GPU,
    OPTION_MODEL,
    OPTION_TARGET,
    add_aliases,
    add_options,
)

GROUP = "gac-check"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser.getgroup(GROUP, "gac-check alignment regression").addoption)


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser):
    """After the project's own conftests have added their options, take ``--gpu`` and
    ``--model`` as aliases where nobody else did (options are parsed after this hook)."""
    result = yield
    add_aliases(parser.getgroup(GROUP).addoption, _registered_options(parser))
    return result


def _registered_options(parser: pytest.Parser) -> frozenset[str]:
    """Every option string registered so far. pytest offers no public query, so this reads
    its option groups; should that ever fail, the aliases are not claimed at all."""
    try:
        groups = [*parser._groups, parser._anonymous]
        return frozenset(n for g in groups for o in g.options for n in o.names())
    except AttributeError:
        return frozenset(ALIASES.values())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with a reason else")
    config.addinivalue_line("markers", "perf: a timing test; serialized per device under xdist")
    from gac_check.plugin import collect, workers

    _check_targets(config)
    _check_dtype(config)
    workers.register(config)  # xdist: pin workers to devices, serialise perf tests per device
    collect.register(config)  # --gac-report: collect on the controller, write at session end


def _check_targets(config: pytest.Config) -> None:
    """A bad ``--gac-target`` is a usage error (exit 4) before any test runs."""
    specs = config.getoption(OPTION_TARGET, None) or []
    if not specs:
        return
    from gac_check.errors import BadInput
    from gac_check.targets.spec import parse_target

    for spec in specs:
        try:
            parse_target(spec)
        except BadInput as exc:
            raise pytest.UsageError(str(exc)) from None


def _check_dtype(config: pytest.Config) -> None:
    """An unknown ``--gac-dtype`` is a usage error (exit 4) before any test runs."""
    dtype = config.getoption(OPTION_DTYPE, None)
    if dtype is None:
        return
    from gac_check.contract.dtype_choice import dtype_name
    from gac_check.errors import BadInput

    try:
        dtype_name(dtype)
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture(scope="session")
def gac_profile(request: pytest.FixtureRequest) -> str:
    """The hardware profile key this session checks against (``--gpu``, default auto)."""
    from gac_check.profiles import resolve_profile

    return resolve_profile(request.config.getoption(OPTION_GPU) or "auto")


@pytest.fixture(scope="session")
def gac_models(request: pytest.FixtureRequest) -> list[Path]:
    """The model directories given with ``--model`` (possibly none)."""
    return [Path(p) for p in request.config.getoption(OPTION_MODEL)]


@pytest.fixture(scope="session")
def gac_targets(request: pytest.FixtureRequest) -> list:
    """The deployment targets given with ``--gac-target`` (parsed; possibly none):
    :func:`gac_check_model` judges a model on them."""
    from gac_check.targets.spec import parse_target

    return [parse_target(t) for t in request.config.getoption(OPTION_TARGET) or []]


@pytest.fixture(scope="session")
def gac_dtype(request: pytest.FixtureRequest) -> str | None:
    """The dtype the model is served in (``--gac-dtype``, canonical name), or None: the
    checkpoint's own."""
    from gac_check.contract.dtype_choice import dtype_name

    dtype = request.config.getoption(OPTION_DTYPE)
    return None if dtype is None else dtype_name(dtype)


@pytest.fixture(scope="session")
def gac_check_model(gac_profile: str, gac_targets: list, gac_dtype: str | None):
    """A function: ``gac_check_model(model, dtype=None, config=None)`` is ``gac_check.check``
    of a directory, a Hub model or a model in memory (a module, or a state dict with its
    config) against this session's ``--gpu``, ``--gac-dtype`` and ``--gac-target``
    (docs/api.md)."""
    from gac_check.api import check

    def check_model(model, dtype: str | None = None, config=None):
        return check(model, gac_profile, dtype or gac_dtype, gac_targets, config=config)

    return check_model


@pytest.fixture(scope="session")
def gac_contract(gac_profile: str):
    """A factory: ``gac_contract(dtype)`` is the Shape Contract of this session's profile."""
    from gac_check.contract.select import for_hardware

    return lambda dtype="float16": for_hardware(gac_profile, dtype)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test that fails on bad input (a ``--model`` its pipeline never wrote, or wrote half)
    says so in one line, as the CLI does, not in a traceback through gac-check's reader;
    ``pytest.raises(BadInput)`` in a test still sees the exception itself."""
    outcome = yield
    from gac_check.errors import BadInput

    if call.excinfo is not None and call.excinfo.errisinstance(BadInput):
        outcome.get_result().longrepr = str(call.excinfo.value)


# ------------------------------------------------------------ perf: gac_check/plugin/perf.py
_PERF = pytest.StashKey["object"]()


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: only tests that will run count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from gac_check.plugin import perf as pytest_perf

    pytest_perf.collection_modifyitems(config, items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from gac_check.plugin import perf as pytest_perf

    pytest_perf.session_finish(session.config.stash.get(_PERF, None))


def pytest_terminal_summary(terminalreporter) -> None:
    from gac_check.plugin import perf as pytest_perf

    pytest_perf.terminal_summary(terminalreporter)


@pytest.fixture(scope="session")
def _gac_perf_session(request: pytest.FixtureRequest):
    from gac_check.plugin import perf as pytest_perf

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
    from gac_check.plugin.perf import Bench

    return Bench(_gac_perf_session, request.node)
