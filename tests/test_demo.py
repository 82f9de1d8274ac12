"""`make demo` (`gac-check demo`) end to end: the real bundled model compressed, checked,
repaired, realigned."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_demo_runs_the_main_job_on_the_bundled_model(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gac_check.cli", "demo", str(tmp_path / "demo")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "\n$ gac-check compress " in out  # each step echoed as a user types it
    assert "36 of 55 sites misaligned (36 errors" in out  # ranks 153 and 245 at ratio 0.8
    assert re.search(r"compressed vs repaired: max abs difference \S+ \(unchanged\)", out)
    cos = dict(re.findall(r"embeddings, (\w+): mean ([0-9.]+)", out))
    assert set(cos) == {"compressed", "realigned"}
    # what --realign writes is the best it measured, never below each rank rounded down
    (margin,) = re.findall(r"([+-][0-9.]+) against each rank rounded down", out)
    assert float(margin) >= 0, out[-3000:]
    # and, with each rank kept within one step of the compressor's, not below the misaligned
    # model the user gave (measured 0.6625 vs 0.6507; it was 0.631 when the plan could store
    # query and key dense, paid for by a step down everywhere else: issue 40)
    assert float(cos["realigned"]) >= float(cos["compressed"]), out[-3000:]
    assert (tmp_path / "demo" / "a100.html").read_text().count("<svg") >= 1
    assert (tmp_path / "demo" / "realign.html").read_text().count('class="kept-row"') == 36
