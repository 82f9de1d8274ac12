"""The SGLang pack against SGLang's own code (issue 39 item 4), as the vLLM pack is held to
vLLM's: the attention backend ``get_default_attn_backend`` picks on each compute capability,
and the vocabulary ``VocabParallelEmbedding`` pads and shards under tensor parallelism.

SGLang's release wheel (the one the pack was read at) runs on this CPU through
tests/sglang_oracle.py: the deciding functions taken from its modules and run alone, with
stand-ins only for the platform (a GPU of the drawn capability) and the TP group. A seeded,
drawn grid goes to it and to the pack; every disagreement fails, listed. ``make
sglang-oracle`` caches the wheel's few files under ``.cache/sglang-oracle`` (CI does); without
them the test skips, saying so (and fails where GAC_REQUIRE_ENGINE_SOURCES is set).

Excused, where SGLang's Python does not decide (listed by :func:`excused`): a head size the
backend's kernel does not compile. SGLang's Python picks its backend whatever the head size
(``get_default_attn_backend`` reads no head size); the kernels refuse at the first forward:
FlashInfer's ``DISPATCH_HEAD_DIM`` (include/flashinfer/utils.cuh, flashinfer_python 0.7.2, the
release sglang 0.5.23 requires), FlashAttention-3's ``mha_fwd`` (hopper/flash_api.cpp:
``head_size % 8``, at most 256) and TRT-LLM-gen's FMHA cubins. The pack refuses those sizes
with the kernel's own reason; the test holds that such a refusal names the backend SGLang
chose and nothing else. Not drawn: speculative decoding with top-k > 1, models with attention
sinks or unequal K/V head sizes, Whisper, MLA (other branches of the same function, which
gac-check's sglang pack judges by other rules).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gac_check.sites import DimSite, Role
from gac_check.targets.shards import LayerShape, ModelShape
from gac_check.targets.spec import parse_target
from gac_check.targets.verdicts import FAST, REFUSED, judge_uses, site_uses, worst

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "sglang-oracle"
RUNNER = Path(__file__).with_name("sglang_oracle.py")
#: every capability SGLang's choice branches on, and those between (Turing to Blackwell)
CAPS = ("7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1")


def grid(seed: int = 39) -> list[dict]:
    """Drawn at random (seeded): head sizes per capability, vocabularies under TP."""
    rnd = random.Random(seed)
    cases = []
    for cap in CAPS:
        for hd in sorted({*rnd.sample(range(8, 600), 30), 64, 128, 256}):
            cases.append({"cap": cap, "kind": "attention", "head_dim": hd})
    for _ in range(300):
        cases.append({"cap": "9.0", "kind": "vocab", "vocab": rnd.randint(1000, 260000),
                      "tp": rnd.choice((1, 2, 3, 4, 6, 8, 16))})
    for vocab in (32000, 128256, 151936, 32001, 50257):
        cases.append({"cap": "9.0", "kind": "vocab", "vocab": vocab, "tp": 8})
    return cases


def sglang_answers(cases: list[dict]) -> list[dict]:
    out = []
    for cap in CAPS:  # one process per capability: SGLang's probes are cached per process
        mine = [c for c in cases if c["cap"] == cap]
        proc = subprocess.run([sys.executable, str(RUNNER), str(CACHE / "src"), cap],
                              input=json.dumps(mine), capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        out += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(out) == len(cases)
    return out


def attention_outcome(case: dict):
    hd, sm = case["head_dim"], int(case["cap"].replace(".", ""))
    target = parse_target("sglang")
    shape = ModelShape(4096, 32000, {0: LayerShape(32, 8, hd, 14336)})
    site = DimSite("a:head_dim", Role.HEAD_DIM, hd, [], layer=0)
    (out,) = [o for o in judge_uses(target, site_uses(site, shape, target), hd, sm)
              if o.selection == "sglang-attention-backend"]
    return out


def vocab_outcome(case: dict) -> tuple[bool, int | None]:
    target = parse_target(f"sglang,tp={case['tp']}")
    site = DimSite("lm_head:vocab", Role.VOCAB, case["vocab"], [])
    outs = judge_uses(target, site_uses(site, ModelShape(4096, case["vocab"]), target),
                      case["vocab"], None)
    per_rank = next((dict(o.shard).get("vocab_per_rank") for o in outs
                     if "vocab_per_rank" in dict(o.shard)), None)
    return worst(outs) == REFUSED, per_rank


def disagreement(case: dict) -> str | None:
    """What the pack says differently from SGLang's own code (None: they agree, or the case
    is excused: :func:`excused`)."""
    if case["kind"] == "vocab":
        refused, per_rank = vocab_outcome(case)
        if refused != case["refused"]:
            return f"pack refused={refused}, SGLang refused={case['refused']}"
        if not refused and [per_rank] != case["rows"]:
            return f"pack {per_rank} rows per rank, SGLang {case['rows']}"
        return None
    out = attention_outcome(case)
    if out.verdict == FAST and out.kernel != case["backend"]:
        return f"pack picks {out.kernel}, SGLang {case['backend']}"
    if out.verdict != FAST and not excused(case, out):
        return f"pack {out.verdict} ({out.why}), SGLang picks {case['backend']}"
    return None


def excused(case: dict, out) -> bool:
    """A refusal where SGLang's Python picks a backend whose kernel does not take the size:
    the pack must name that backend (and only it) as what fails."""
    return (out.verdict == REFUSED and f"{case['backend']} needs head_dim" in out.why
            and case["head_dim"] not in (64, 128, 256))


def test_the_sglang_pack_agrees_with_sglangs_own_code():
    if not (CACHE / "src" / "sglang").is_dir():
        message = "SGLang's wheel is not cached: run `make sglang-oracle` (CI does)"
        if os.environ.get("GAC_REQUIRE_ENGINE_SOURCES"):
            pytest.fail(message)
        pytest.skip(message)
    cases = grid()
    answers = sglang_answers(cases)
    backends = {c["cap"]: c["backend"] for c in answers if c["kind"] == "attention"}
    # the grid reaches every branch of SGLang's MHA choice on CUDA
    assert set(backends.values()) == {"flashinfer", "fa3", "trtllm_mha"}, backends
    wrong = [f"{case}: {why}" for case in answers if (why := disagreement(case))]
    excuses = [c for c in answers if c["kind"] == "attention"
               and attention_outcome(c).verdict != FAST]
    assert excuses, "no kernel-level refusal drawn: the excuse is never exercised"
    assert not wrong, f"{len(wrong)} of {len(answers)} disagree:\n" + "\n".join(wrong[:60])

