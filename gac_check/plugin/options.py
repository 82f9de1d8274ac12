"""The options gac-check's pytest plugin adds, defined once.

Option names are constants so the perf session, the report collector and the reproduce command
never spell them twice; :func:`add_gpu_option` is shared with the ``gac-check`` CLI, so
``pytest --gpu X`` and ``gac-check --gpu X`` accept exactly the same profiles. ``addoption``
is either pytest's ``group.addoption`` or argparse's ``add_argument``: both take the same
arguments.
"""
from __future__ import annotations

from collections.abc import Callable

from gac_check.profiles import CHOICES, CPU_PERF_FACTOR, GPU_PERF_FACTOR

OPTION_GPU = "--gac-gpu"
OPTION_MODEL = "--gac-model"
OPTION_REPORT = "--gac-report"
OPTION_UPDATE_BASELINES = "--gac-update-baselines"
OPTION_PERF_FACTOR = "--gac-perf-factor"
OPTION_TARGET = "--gac-target"
OPTION_DTYPE = "--gac-dtype"
#: Short spellings the plugin also answers to, unless another plugin already owns them.
ALIASES = {OPTION_GPU: "--gpu", OPTION_MODEL: "--model"}


def add_gpu_option(addoption: Callable[..., object], *names: str, default: str | None,
                   dest: str) -> None:
    """``--gpu PROFILE``: the hardware the model will be served on."""
    addoption(*names, dest=dest, default=default, metavar="PROFILE", type=str.lower,
              choices=CHOICES,
              help=f"hardware profile to check (and measure) against: {', '.join(CHOICES)} "
              "(default auto: the GPU present, else the generic published GPU contract)")


TARGET_HELP = (
    "a deployment target ENGINE[@VERSION][,tp=N][,quant=Q][,group=G][,kv=DTYPE], e.g. "
    "vllm,tp=4,quant=awq or llama.cpp,quant=Q4_K_M (repeatable; engines, versions and rules: "
    "docs/targets.md): will every layer load, which kernel runs it, is it the fast path, and "
    "what padding makes it so")


def add_target_option(addoption: Callable[..., object], *names: str, dest: str) -> None:
    """``--target SPEC`` (repeatable): the serving engine, TP size and quantization."""
    addoption(*names, dest=dest, action="append", default=[], metavar="SPEC",
              help=TARGET_HELP)


def add_options(addoption: Callable[..., object]) -> None:
    """Every option of the pytest plugin, by its ``--gac-`` name, in its ``gac-check`` group."""
    add_gpu_option(addoption, OPTION_GPU, default=None, dest="gac_gpu")
    addoption(OPTION_MODEL, dest="gac_model", action="append", default=[], metavar="DIR",
              help="model directory the suites check (repeatable)")
    add_target_option(addoption, OPTION_TARGET, dest="gac_target")
    addoption(OPTION_DTYPE, dest="gac_dtype", default=None, metavar="DTYPE",
              help="the dtype the model is served in (float16, bfloat16, float32): the "
              "contract gac_check_model and the model suite judge and repair --gac-model "
              "against (default: the checkpoint's own)")
    addoption(OPTION_REPORT, action="store", default=None, metavar="FILE.html",
              help="write the alignment-regression HTML report here")
    addoption(OPTION_UPDATE_BASELINES, action="store_true", default=False,
              help="store this run's measurements as the profile's new baseline")
    addoption(OPTION_PERF_FACTOR, action="store", type=float, default=None, metavar="X",
              help="perf regression threshold as a time ratio (default "
              f"{GPU_PERF_FACTOR} on a GPU, {CPU_PERF_FACTOR} on a CPU)")


def add_aliases(addoption: Callable[..., object], taken: frozenset[str]) -> list[str]:
    """``--gpu`` and ``--model``, the short spellings, for every one no other plugin or
    conftest has claimed (``taken``); the ``--gac-`` names always work. Returns those added."""
    added = []
    if ALIASES[OPTION_GPU] not in taken:
        add_gpu_option(addoption, ALIASES[OPTION_GPU], default=None, dest="gac_gpu")
        added.append(ALIASES[OPTION_GPU])
    if ALIASES[OPTION_MODEL] not in taken:
        addoption(ALIASES[OPTION_MODEL], dest="gac_model", action="append", default=[],
                  metavar="DIR", help=f"same as {OPTION_MODEL}")
        added.append(ALIASES[OPTION_MODEL])
    return added
