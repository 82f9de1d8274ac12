"""Expected slowdowns carry their provenance and apply only where their data cover the shape.

The figures are read from the paper's A100 and H100 tables packaged in gac_check/data (the same
numbers baselines/a100.json and baselines/h100.json hold), so every expected value below is the
table's own ratio, computed here from the TSV rather than copied from the code under test.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gac_check.bench import baselines, published, workloads
from gac_check.bench.baselines import Baseline, Fingerprint, Measurement, Provenance
from gac_check.contract.select import for_hardware
from gac_check.contract.slowdown import Slowdown
from gac_check.report.junit import to_junit
from gac_check.sites import DimSite, Role
from tests import helpers

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "gac_check" / "data"


def table(gpu: str, kind: str) -> dict[int, tuple[float, ...]]:
    name = {"sdpa": "sdpa-latency", "gemm": "gemm-alignment-sweep"}[kind]
    rows = published.read_tsv(DATA / f"published-{gpu}-{name}.tsv")
    return {int(r[0]): tuple(float(x) for x in r[1:]) for r in rows}


def figure(profile: str, dtype: str, role: Role, value: int):
    (finding,) = for_hardware(profile, dtype).check([DimSite("x", role, value, [])])
    return finding


@pytest.fixture(autouse=True)
def no_measured_baselines(tmp_path, monkeypatch):
    """Published figures only, unless a test stores a measured sweep itself."""
    monkeypatch.setenv("GAC_BASELINES_DIR", str(tmp_path))


# ------------------------------------------------------------------ the published baselines
@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_packaged_tables_are_the_committed_baselines(gpu):
    """baselines/<gpu>.json is what `gac-check baseline published` makes of the
    packaged tables: same cases, same medians, same provenance form."""
    stored = baselines.load(ROOT / "baselines" / f"{gpu}.json")
    fresh = published.published_baseline(gpu)
    assert stored.cases.keys() == fresh.cases.keys()
    for key, m in fresh.cases.items():
        assert stored.cases[key].median_s == pytest.approx(m.median_s, rel=1e-12), key
        assert stored.cases[key].provenance == m.provenance
    assert stored.fingerprint == fresh.fingerprint
    assert all(m.provenance.kind == "published" and "EuroMLSys 2026" in m.provenance.citation
               for m in stored.cases.values())


def test_h100_baseline_has_both_sweeps():
    sdpa, gemm = table("h100", "sdpa"), table("h100", "gemm")
    base = baselines.load(ROOT / "baselines" / "h100.json")
    assert base.fingerprint.device == "NVIDIA H100" and base.fingerprint.capability == "9.0"
    key = workloads.sdpa(4, 2048, 32, 107, "float16").key
    assert base.cases[key].median_s == pytest.approx(sdpa[107][0] / 1e3)
    k = workloads.gemm(512, 4001, 4096, "float16")
    assert base.cases[k.key].tflops == pytest.approx(gemm[4001][0])


# --------------------------------------------------------------- where a figure applies
def test_head_dim_inside_the_sdpa_sweep_reads_the_table_at_that_size():
    sdpa = table("h100", "sdpa")
    f = figure("h100", "float16", Role.HEAD_DIM, 107)
    fig = f.figure
    assert f.fix_to == 112
    assert fig.value == pytest.approx(sdpa[107][0] / sdpa[112][0], abs=1e-3)
    assert (fig.source, fig.hardware, fig.dtype) == ("published", "NVIDIA H100", "float16")
    assert "head_dim=107" in fig.shape and "head_dim=112" in fig.shape
    assert "B=4 S=2048 H=32" in fig.coverage and "64-256" in fig.coverage
    assert "arXiv 2604.09595" in fig.citation
    assert f.slowdown == fig.value


def test_gemm_size_inside_the_sweep_sums_its_k_and_n_gemms():
    gemm = table("h100", "gemm")
    f = figure("h100", "float16", Role.RANK, 4001)
    # TFLOP/s at (almost) the same work: time ~ size / throughput
    t = {v: v / gemm[v][0] + v / gemm[v][1] for v in (4001, 4008)}
    assert f.figure.value == pytest.approx(t[4001] / t[4008], rel=2e-3)
    assert "K=4001" in f.figure.shape and "N=4001" in f.figure.shape
    vocab = figure("h100", "float16", Role.VOCAB, 4001)  # the LM head: N only
    assert vocab.figure.value == pytest.approx(gemm[4008][1] / gemm[4001][1] * 4001 / 4008,
                                               rel=2e-3)
    assert "K=4001" not in vocab.figure.shape


@pytest.mark.parametrize("profile", ["a100", "h100", "h200", "gpu"])
def test_a_rank_far_below_the_k_sweep_is_not_measured(profile):
    f = figure(profile, "float16", Role.RANK, 153)
    assert f.figure.value is None and f.figure.source is None
    assert f.figure.note.startswith("not measured at this shape")
    assert "4000-4100" in f.figure.coverage
    assert f.slowdown is None


@pytest.mark.parametrize("value", [40, 300])
def test_head_dims_outside_64_256_are_not_measured(value):
    assert figure("h100", "float16", Role.HEAD_DIM, value).figure.value is None


@pytest.mark.parametrize("profile", ["gpu", "a100", "h100"])
def test_fp32_contract_quotes_no_fp16_figure(profile):
    c = for_hardware(profile, "float32")
    assert all(r.slowdown is None for r in c.rules if r.source == "published")
    f = figure(profile, "float32", Role.RANK, 4001)  # inside the fp16 sweep's range
    assert f.figure.value is None and "float32" in f.figure.note


def test_bf16_reads_the_fp16_table_and_says_so():
    f = figure("h100", "bfloat16", Role.HEAD_DIM, 107)
    assert f.figure.value == figure("h100", "float16", Role.HEAD_DIM, 107).figure.value
    assert f.figure.dtype == "float16" and "applied to bfloat16" in f.figure.note


def test_h200_inherits_the_h100_figures_and_says_why():
    h100, h200 = (figure(p, "float16", Role.HEAD_DIM, 107).figure for p in ("h100", "h200"))
    assert h200.value == h100.value and h200.hardware == "NVIDIA H100"
    assert "H200 inherits" in h200.note and "sm_90" in h200.note and "HBM3e" in h200.note
    assert "inherits" not in h100.note


def test_a100_and_h100_figures_differ():
    """Each profile reads its own GPU's table (the H100's odd-K cliff is deeper)."""
    a, h = (figure(p, "float16", Role.RANK, 4002).figure for p in ("a100", "h100"))
    assert a.hardware == "NVIDIA A100-80GB" and h.hardware == "NVIDIA H100"
    assert h.value > a.value + 0.3


def test_size_in_range_but_not_sampled_is_a_marked_estimate():
    """The H100 SDPA table has only even head_dims above 160: 161 is estimated from the odd
    sizes it has, each against its own fix, and labelled as such."""
    sdpa = table("h100", "sdpa")
    assert 161 not in sdpa
    f = figure("h100", "float16", Role.HEAD_DIM, 161)
    odd = [sdpa[d][0] / sdpa[-(-d // 8) * 8][0] for d in sdpa
           if d % 2 and -(-d // 8) * 8 in sdpa]
    odd.sort()
    assert f.figure.source == "estimate" and f.figure.short.startswith("~")
    assert f.figure.value == pytest.approx(odd[len(odd) // 2], abs=0.02)
    assert "model:" in f.figure.note and f"{len(odd)} timed sizes" in f.figure.note
    assert f.slowdown is None  # an estimate is never the bare expected figure


def test_measured_sweep_of_the_profile_takes_precedence(tmp_path):
    """A sweep recorded on the hardware (baselines/<profile>.json) is read first, with its
    file, command and date as the citation."""
    prov = Provenance("measured", "2026-11-23T00:00:00Z", "python -m gac_check.bench.sweep")
    cases = {}
    for k in range(4040, 4120):  # overlaps the published 4000-4100
        t = k * 1e-6 * (1.5 if k % 8 else 1.0)
        samples = [t * (1 + 0.001 * (i - 4)) for i in range(9)]  # enough for Mann-Whitney
        m = Measurement.from_samples(workloads.gemm(4096, k, 4096, "float16").key, samples,
                                     prov)
        cases[m.case] = m
    fp = Fingerprint("cuda", "NVIDIA H100 80GB HBM3", "9.0")
    baselines.save(Baseline("h100", fp, cases), tmp_path / "h100.json")
    f = figure("h100", "float16", Role.RANK, 4041)  # both cover it: the measured one wins
    assert f.figure.source == "measured" and f.figure.hardware == "NVIDIA H100 80GB HBM3"
    assert f.figure.value == pytest.approx(4041 * 1.5 / 4048, rel=1e-3)
    assert "h100.json" in f.figure.citation and "gac_check.bench.sweep" in f.figure.citation
    # a size the measured sweep does not cover still reads the published table
    assert figure("h100", "float16", Role.RANK, 4001).figure.source == "published"


def test_a_lone_case_does_not_stretch_a_sweeps_range(tmp_path):
    """The recording command stores the reference GEMM (K=4096) beside the K 96-320 sweep at
    the same M and N: a rank of 1001 is still outside what was timed."""
    prov = Provenance("measured", "2026-11-23T00:00:00Z", "python -m gac_check.bench.sweep")
    cases = {}
    for k in [*range(96, 321), 4096]:
        t = k * 1e-6 * (1.5 if k % 8 else 1.0)
        samples = [t * (1 + 0.001 * (i - 4)) for i in range(9)]
        m = Measurement.from_samples(workloads.gemm(4096, k, 4096, "float16").key, samples,
                                     prov)
        cases[m.case] = m
    baselines.save(Baseline("h100", Fingerprint("cuda", "NVIDIA H100", "9.0"), cases),
                   tmp_path / "h100.json")
    assert figure("h100", "float16", Role.RANK, 153).figure.source == "measured"
    far = figure("h100", "float16", Role.RANK, 1001).figure
    assert far.value is None
    assert "measured NVIDIA H100 float16: GEMM K 96-320 at M=4096 N=4096;" in far.note
    assert "published NVIDIA H100 float16: GEMM K 4000-4100" in far.note


def test_slowdown_refuses_a_value_without_a_source():
    with pytest.raises(ValueError):
        Slowdown(1.5)
    with pytest.raises(ValueError):
        Slowdown(1.5, "guess")


def test_junit_of_an_older_document_keeps_its_bare_figure():
    site = {"name": "m.rank", "value": 153, "aligned": False, "severity": "error",
            "rules": ["gemm-align-16B"], "repair_to": 160, "expected_slowdown": 3.05}
    doc = {"model_dir": "/m", "hardware": {"profile": "a100"}, "sites": [site]}
    assert "expected 3.05x slower" in to_junit(doc)


# ---------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A real Llama whose head_dim (106) is inside the H100 SDPA sweep and whose MLP width
    (4100) is inside the GEMM sweep but its fix (4104) is not: one direct figure, one
    estimate."""
    import torch

    path = tmp_path_factory.mktemp("models") / "llama-106-4100"
    helpers.tiny_llama(dtype=torch.float16, vocab_size=128, intermediate_size=4100, head_dim=106,
                       num_key_value_heads=2).save_pretrained(path)
    return path


def gac(*args: object, env_dir: Path):
    """The CLI with ``env_dir`` as its baselines directory (no sweep of this machine's)."""
    return helpers.gac(*args, env={"GAC_BASELINES_DIR": str(env_dir)})


def test_cli_h100_shows_slowdowns_with_provenance_everywhere(llama, tmp_path):
    sdpa = table("h100", "sdpa")
    junit, html = tmp_path / "r.xml", tmp_path / "r.html"
    proc = gac(llama, "--gpu", "h100", "--junit", junit, "--report", html, env_dir=tmp_path)
    assert proc.returncode == 1, proc.stderr
    text = proc.stdout
    head_row = next(ln for ln in text.splitlines() if "head_dim" in ln and "106" in ln)
    mlp_row = next(ln for ln in text.splitlines() if "intermediate" in ln and "4100" in ln)
    assert f"{sdpa[106][0] / sdpa[112][0]:.2f}x [" in head_row
    assert "~" in mlp_row  # the estimate is marked in the table
    legend = text[text.index("slower: time at the value"):]
    assert "published: NVIDIA H100 float16; SDPA head_dim 64-256" in legend
    assert "estimate: NVIDIA H100 float16" in legend and "model:" in legend

    doc = json.loads(gac(llama, "--gpu", "h100", "--format", "json",
                         env_dir=tmp_path).stdout)
    by_role = {s["role"]: s for s in doc["sites"] if not s["aligned"]}
    head, mlp = by_role["head_dim"], by_role["intermediate"]
    assert head["slowdown"]["source"] == "published"
    assert head["expected_slowdown"] == head["slowdown"]["value"]
    assert head["slowdown"]["hardware"] == "NVIDIA H100"
    assert mlp["slowdown"]["source"] == "estimate" and mlp["expected_slowdown"] is None

    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    msg = cases[head["name"]].find("failure").get("message")
    assert "expected" in msg and "published: NVIDIA H100, float16, SDPA" in msg
    assert "estimated ~" in cases[mlp["name"]].find("failure").get("message")
    page = html.read_text()
    assert "published · NVIDIA H100 · float16 · SDPA head_dim 64-256" in page
    assert "(estimate)" in page


def test_cli_h200_and_fp32(llama, tmp_path):
    doc = json.loads(gac(llama, "--gpu", "h200", "--format", "json", env_dir=tmp_path).stdout)
    head = next(s for s in doc["sites"] if s["role"] == "head_dim" and not s["aligned"])
    assert "H200 inherits" in head["slowdown"]["note"]
    doc = json.loads(gac(llama, "--gpu", "gpu", "--dtype", "float32", "--format", "json",
                         env_dir=tmp_path).stdout)
    bad = [s for s in doc["sites"] if not s["aligned"]]
    assert bad and all(s["slowdown"]["value"] is None for s in bad)


# ------------------------------------------------------------------------ --bench first
def test_bench_on_the_profiles_hardware_takes_precedence(llama, tmp_path, monkeypatch):
    """--bench times the site's own kernels; on the contract's hardware (here: --gpu cpu on
    this CPU) its figure replaces the expected one everywhere, with its provenance."""
    from gac_check.analysis import check
    from gac_check.bench.model_bench import bench_findings
    from gac_check.contract.evidence import adopt_bench
    from gac_check.profiles import cpu_name
    from gac_check.report.json_report import to_json
    from gac_check.report.text import render_text

    monkeypatch.setenv("GAC_BASELINES_DIR", str(tmp_path))
    result = check(llama, "cpu", "float32")
    heads = [f for f in result.findings if f.site.role == Role.HEAD_DIM]
    head = heads[0]
    assert head.figure.value is None  # no CPU sweep recorded: not measured
    report = bench_findings(result)
    line = adopt_bench(result.findings, report, result.contract)
    timed = {s.name: s for s in report.sites if s.speedup is not None}
    assert head.site.name in timed and "expected slowdowns above" in line
    fig = head.figure
    assert fig.source == "bench" and fig.hardware == cpu_name() and fig.dtype == "float32"
    assert fig.value == pytest.approx(timed[head.site.name].speedup, abs=1e-3)
    assert "D=106" in fig.shape and head.slowdown == fig.value
    assert all(f.figure.source == "bench" for f in heads)  # every layer's site
    site = next(s for s in to_json(result)["sites"] if s["name"] == head.site.name)
    assert site["slowdown"]["source"] == "bench" and site["expected_slowdown"] == fig.value
    assert f"bench: {cpu_name()} float32" in render_text(result)


def test_bench_on_other_hardware_leaves_the_expected_figures(llama, tmp_path, monkeypatch):
    from gac_check.analysis import check
    from gac_check.bench.model_bench import bench_findings
    from gac_check.contract.evidence import adopt_bench

    monkeypatch.setenv("GAC_BASELINES_DIR", str(tmp_path))
    result = check(llama, "h100", "float16")
    before = [f.figure for f in result.findings]
    line = adopt_bench(result.findings, bench_findings(result), result.contract)
    assert "not on h100 hardware" in line
    assert [f.figure for f in result.findings] == before


def test_cli_bench_figures_reach_every_output(llama, tmp_path):
    junit = tmp_path / "r.xml"
    proc = gac(llama, "--gpu", "cpu", "--dtype", "float32", "--bench", "--format", "json",
               "--junit", junit, "--fail-on", "never", env_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    heads = [s for s in doc["sites"] if s["role"] == "head_dim" and not s["aligned"]]
    assert heads and all(s["slowdown"]["source"] == "bench" for s in heads)
    assert "expected slowdowns above" in doc["bench"]["precedence"]
    msg = next(c for c in ET.parse(junit).getroot().iter("testcase")
               if c.get("name") == heads[0]["name"]).find("system-out").text
    assert "(bench: " in msg
    text = gac(llama, "--gpu", "h100", "--bench", env_dir=tmp_path).stdout
    assert "not on h100 hardware: shown here only" in text


def test_html_of_an_older_run_document_marks_its_bare_figure(llama, tmp_path):
    """`gac-check report merge` may read run documents written before slowdowns had
    provenance: their number is shown, marked as of unrecorded origin."""
    from gac_check.report.html import render_html

    html = tmp_path / "r.html"
    gac(llama, "--gpu", "h100", "--report", html, env_dir=tmp_path)
    run = json.loads(html.with_suffix(".json").read_text())
    for site in run["checks"][0]["sites"]:
        site.pop("slowdown", None)
        site["expected_slowdown"] = None if site["aligned"] else 3.05
    page = render_html([run])
    assert "3.05× slower" in page and "provenance not recorded" in page
    assert "published ·" not in page
