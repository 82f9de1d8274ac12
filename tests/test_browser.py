"""A real report, drawn by a real browser: headless Chromium screenshots it and the pixels
must show the alignment map's colours.

Skipped (with the reason) where Debian's ``chromium`` package is not installed; CI images
often lack it. The PNG is decoded with the standard library so the test needs nothing else.
"""
from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from gac_check.report.charts import CELL_H, CELL_W, COLOURS
from tests.helpers import gac, tiny_llama

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                                "(Debian: apt-get install chromium)")


def screenshot(page: Path, png: Path, profile: Path, size: str = "1280,1000") -> None:
    """Chromium's own flags for a quiet, offline, sandbox-free (containers) headless shot."""
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--hide-scrollbars",
                    f"--user-data-dir={profile}", f"--window-size={size}",
                    f"--screenshot={png}", page.resolve().as_uri()],
                   capture_output=True, timeout=120, check=True)


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB/RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + pred) & 255
        rows.append(bytes(b for i, b in enumerate(line) if i % channels < 3))
        prev = line
    return width, height, rows


def pixels(rows: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), -1, 3)


def cell_scanlines(image: np.ndarray, hex_colour: str, tol: int = 8) -> int:
    """Horizontal runs of the colour as wide as one map cell: a cell of height h gives h runs,
    while badges, swatches and table borders (other widths) give none."""
    target = np.frombuffer(bytes.fromhex(hex_colour.lstrip("#")), dtype=np.uint8)
    mask = np.abs(image.astype(int) - target).max(axis=2) <= tol
    edges = np.diff(np.pad(mask.astype(np.int8), ((0, 0), (1, 1))), axis=1)
    lengths = np.flatnonzero(edges.ravel() == -1) - np.flatnonzero(edges.ravel() == 1)
    return int(((lengths >= CELL_W - 2 - 6) & (lengths <= CELL_W - 2)).sum())


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """The CLI's report of a real Llama whose MLP width (1843) a pruner left misaligned."""
    import torch

    root = tmp_path_factory.mktemp("browser")
    tiny_llama(dtype=torch.float16, vocab_size=128, hidden_size=256, intermediate_size=1843,
               num_hidden_layers=4, torch_dtype="float16").save_pretrained(root / "llama-1843")
    out = root / "report.html"
    proc = gac(root / "llama-1843", "--gpu", "h100", "--report", out)
    assert proc.returncode == 1, proc.stderr
    return out


def test_chromium_draws_the_alignment_map(report, tmp_path):
    png = tmp_path / "shot.png"
    screenshot(report, png, tmp_path / "profile")
    width, height, rows = decode_png(png.read_bytes())
    assert (width, height) == (1280, 1000)
    image = pixels(rows)
    distinct = np.unique(image.reshape(-1, 3), axis=0)
    assert len(distinct) > 30, "the page rendered (nearly) blank"
    # 4 layers x 1843 (error); head_dim 64 and 4 heads per layer, hidden 256 and vocabulary
    # 128 (aligned).
    # A cell is CELL_H - 2 scanlines high; its number's glyphs break about half of them.
    assert cell_scanlines(image, COLOURS["error"]) >= 4 * (CELL_H // 3)
    assert cell_scanlines(image, COLOURS["aligned"]) >= 10 * (CELL_H // 3)


#: A page that frames a report ``srcdoc`` (same origin: scripts may read it) at a phone's
#: width (headless Chromium's window is never narrower than 500 px, a frame is) and writes
#: what the report's root scrolls over, and what it shows, into its own DOM for --dump-dom.
PROBE = """<!DOCTYPE html><html><body style="margin:0"><iframe style="width:{width}px;
height:800px;border:0" srcdoc="{page}" onload="var r=this.contentDocument.documentElement;
document.body.setAttribute('data-width', r.scrollWidth + ' ' + r.clientWidth)"></iframe>
</body></html>"""


def phone_width(report: Path, profile: Path, width: int = 390) -> tuple[int, int]:
    """(scrollWidth, clientWidth) of the report's root in a frame ``width`` px wide: equal
    when the page does not scroll sideways (clientWidth less any vertical scroll bar)."""
    import html
    import re

    probe = profile.parent / "probe.html"
    probe.write_text(PROBE.format(width=width, page=html.escape(report.read_text(
        encoding="utf-8"), quote=True)), encoding="utf-8")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          "--disable-background-networking", "--disable-component-update",
                          "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                          "--window-size=800,900", "--dump-dom", probe.resolve().as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    found = re.search(r'data-width="(\d+) (\d+)"', dom)
    assert found, "the probe did not run: " + dom[-300:]
    return int(found[1]), int(found[2])


@pytest.fixture(scope="module")
def wide_report(tmp_path_factory) -> Path:
    """A report whose targets table has four engines' columns and its map 7 columns."""
    root = tmp_path_factory.mktemp("phone")
    tiny_llama(0, intermediate_size=170, num_hidden_layers=2, vocab_size=128,
               num_key_value_heads=2).save_pretrained(root / "pruned-llama-with-a-long-name")
    out = root / "wide.html"
    proc = gac(root / "pruned-llama-with-a-long-name", "--gpu", "h100", "--dtype", "float16",
               "--target", "vllm,tp=2,quant=awq", "--target", "sglang", "--target", "llamacpp",
               "--target", "tensorrt-llm", "--fail-on", "never", "--report", out)
    assert proc.returncode == 0, proc.stderr
    return out


def test_a_phone_does_not_scroll_the_page_sideways(wide_report, tmp_path):
    scroll, client = phone_width(wide_report, tmp_path / "profile")
    assert 300 < client <= 390 and scroll == client, (scroll, client)
    # and the frame does measure overflow: the same page 120 px wide cannot fit its verdict card
    scroll, client = phone_width(wide_report, tmp_path / "profile", width=120)
    assert scroll > client, (scroll, client)
