"""pytest-xdist across devices: one GPU per worker, one timing test per device at a time.

Equivalence suites are embarrassingly parallel (``-n auto``); timing is not: two perf tests on
one GPU measure each other. So the controller deals the visible CUDA devices out to workers
round-robin (``gw0`` -> device 0, ``gw1`` -> device 1, ...) by setting each worker's
``CUDA_VISIBLE_DEVICES`` before it touches CUDA, and every test marked ``perf`` holds an
exclusive lock on its device for its whole run (setup to teardown). With more workers than
devices, workers share a device but their perf tests queue; on a CPU-only machine all workers
share the lock ``cpu``. Locks are ``fcntl`` file locks in a directory the controller creates
and removes; on platforms without ``fcntl`` perf tests are not serialised (run them with
``-n 0`` there).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

DEVICE_KEY = "gac_cuda_device"
LOCK_DIR_KEY = "gac_lock_dir"


def visible_cuda_devices() -> list[str]:
    """The CUDA devices this run may use, as ``CUDA_VISIBLE_DEVICES`` entries."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def device_for(worker_id: str, devices: list[str]) -> str | None:
    """``gw5`` with devices [0, 1] -> "1"; None without CUDA devices."""
    if not devices:
        return None
    index = int(worker_id.removeprefix("gw")) if worker_id.removeprefix("gw").isdigit() else 0
    return devices[index % len(devices)]


class Controller:
    """Registered on the xdist controller: hands each worker its device and the lock dir."""

    def __init__(self) -> None:
        self.devices = visible_cuda_devices()
        self.lock_dir = tempfile.mkdtemp(prefix="gac-check-locks-")

    def pytest_configure_node(self, node) -> None:
        node.workerinput[DEVICE_KEY] = device_for(node.workerinput["workerid"], self.devices)
        node.workerinput[LOCK_DIR_KEY] = self.lock_dir

    def pytest_unconfigure(self) -> None:
        shutil.rmtree(self.lock_dir, ignore_errors=True)


class PerfSerializer:
    """Registered on each worker: perf tests take their device's lock for their whole run."""

    def __init__(self, lock_dir: Path, device: str | None) -> None:
        self.lock = lock_dir / f"perf-{'cuda' + device if device is not None else 'cpu'}.lock"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        if item.get_closest_marker("perf") is None:
            return (yield)
        with device_lock(self.lock):
            return (yield)


@contextlib.contextmanager
def device_lock(path: Path) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    from gac_check.checkpoint.atomic import file_lock

    with file_lock(path):
        yield


def register(config: pytest.Config) -> None:
    """Pin this worker (before any CUDA use) or, on the controller, prepare the dealing."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        device = workerinput.get(DEVICE_KEY)
        if device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = device
        if workerinput.get(LOCK_DIR_KEY):
            config.pluginmanager.register(
                PerfSerializer(Path(workerinput[LOCK_DIR_KEY]), device), "gac-check-perf-lock")
    elif config.pluginmanager.hasplugin("xdist") and _distributing(config):
        config.pluginmanager.register(Controller(), "gac-check-xdist")


def _distributing(config: pytest.Config) -> bool:
    """Whether this run starts workers (``-n N``/``-n auto``, not ``-n 0``)."""
    return getattr(config.option, "dist", "no") != "no"
