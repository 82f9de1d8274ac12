"""The vLLM pack against vLLM's own selection code (issue 28 item 1), as the llama.cpp pack is
held to llama.cpp's quantizer.

vLLM's newest release wheel runs on this CPU (tests/vllm_oracle.py: the wheel's own Python
code, stand-ins only for its compiled extensions, GPU packages and a platform reporting
the compute capability drawn: 8.0-12.0). A seeded grid of more than 500 combinations (head sizes;
GPTQ and AWQ linears of drawn widths per shard, TP sizes, group sizes and activation dtypes;
vocabularies and TP sizes) goes to it and to the pack; every disagreement fails, listed. A
second test draws a fresh seed each run (issue 39: every capability sm80-sm120, act-order,
compressed-tensors W4A16, each route's own ``create_weights``); excused cases are the named
list ``EXCUSED``.
``make vllm-oracle`` caches the wheel and its pure-Python dependencies under
``.cache/vllm-oracle`` (CI does, before the slow tier); without the cache the test skips,
saying so. FP8 and INT8 go through vLLM's own quantization methods for a checkpoint's
``quantization_config`` (compressed-tensors FP8 W8A8/W8A16/block and INT8 W8A8, vLLM's
``fp8`` per tensor and 128x128 blocks): ``create_weights`` and ``process_weights_after_loading``
for a drawn MLP's gate_up_proj and down_proj shard (docs/targets.md, "FP8 and INT8 in the
oracle"), each scheme by the ``quant=`` name a checkpoint of it is judged under. Fused-MoE
layers go through vLLM's own MoE layer construction: unquantized, AWQ/GPTQ, FP8 (per tensor,
per channel and 128x128 blocks, at sm80, sm89 and sm90), compressed-tensors INT8 (dynamic
and static activations) and gpt-oss's MXFP4 (the backend and the widths vLLM pads itself).
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
from gac_check.targets.shards import LayerShape, ModelShape, Use
from gac_check.targets.spec import parse_target
from gac_check.targets.verdicts import REFUSED, judge_uses, site_uses, worst

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "vllm-oracle"
RUNNER = Path(__file__).with_name("vllm_oracle.py")
SM = {"8.0": 80, "9.0": 90}
#: the capabilities the FP8 MoE grid runs at besides (sm89: FP8 compute, no Hopper moves), and
#: every capability the random draw covers: A10/RTX 3090 (sm86), L4/L40S/RTX 4090 (sm89),
#: B200 (sm100), RTX 50xx/RTX PRO 6000 (sm120). vLLM's code is driven by capability directly
#: and the pack's rules are evaluated at that capability (``judge_uses(..., sm)``), whether or
#: not a ``--gpu`` profile names it.
SM_ALL = {**SM, "8.6": 86, "8.9": 89, "10.0": 100, "12.0": 120}
#: the pack's kernel names as vLLM's classes (and whether Marlin pads its tiles)
VLLM_NAME = {"machete": "MacheteLinearKernel", "marlin": "MarlinLinearKernel",
             "awq_marlin": "MarlinLinearKernel", "exllama": "ExllamaLinearKernel",
             "triton_w4a16": "TritonW4A16LinearKernel", "humming": "HummingLinearKernel",
             "awq (triton)": "AutoAWQLinearMethod"}


def grid(seed: int = 28) -> list[dict]:
    rnd = random.Random(seed)
    cases: list[dict] = []
    for cap in SM:
        for hd in sorted({*rnd.sample(range(8, 600), 50), 32, 64, 256, 264, 512, 520}):
            cases.append({"cap": cap, "kind": "attention", "head_dim": hd,
                          "dtype": "bfloat16"})
        for _ in range(200):
            tp = rnd.choice((1, 2, 4, 8))
            k = rnd.choice((8, 16, 32, 64, 128)) * rnd.randint(1, 96)
            n = rnd.choice((8, 16, 32, 64, 128)) * rnd.randint(1, 96)
            row = rnd.random() < 0.5  # row-parallel: K is split; column-parallel: N is
            cases.append({"cap": cap, "kind": "linear", "quant": rnd.choice(("gptq", "awq")),
                          "in": k * tp if row else k, "out": n if row else n * tp,
                          "shard_in": k, "shard_out": n, "tp": tp,
                          "group": rnd.choice((-1, 32, 64, 128)),
                          "dtype": rnd.choice(("bfloat16", "float16"))})
    for _ in range(60):
        cases.append({"cap": "9.0", "kind": "vocab", "vocab": rnd.randint(1000, 200000),
                      "tp": rnd.randint(1, 8)})
    return (cases + w8a8_grid(rnd) + moe_grid(rnd)
            + moe_grid(random.Random(seed + 1), 60, FP8_MOE, FP8_MOE_CAPS)
            + mxfp4_grid(random.Random(seed + 2))
            + moe_grid(random.Random(seed + 3), 30, INT8_MOE, FP8_MOE_CAPS))


def moe_grid(rnd: random.Random, per_cap: int = 120, quants: tuple[str, ...] = ("none", "gptq",
                                                                                 "awq"),
             caps: tuple[str, ...] = tuple(SM)) -> list[dict]:
    """Fused-MoE layers: unquantized, GPTQ and AWQ experts (or ``quants``) of a drawn width
    (per rank, as the WNA16 grid draws it, and some that TP does not divide), expert counts
    2-160, TP 1-8 with and without expert parallelism (ep = tp x 1, 2 or 4), groups
    -1/32/64/128, hidden 4096."""
    cases = []
    for cap in caps:
        for _ in range(per_cap):
            tp = rnd.choice((1, 2, 4, 8))
            ep = rnd.choice((1, 1, tp, 2 * tp, 4 * tp))
            moe_tp = 1 if ep > 1 else tp
            width = rnd.choice((8, 16, 32, 64, 128)) * rnd.randint(1, 48) * moe_tp
            if rnd.random() < 0.15:
                width += rnd.randint(1, 7)
            cases.append({"cap": cap, "kind": "moe", "quant": rnd.choice(quants),
                          "width": width, "tp": tp, "ep": ep, "experts": rnd.randint(2, 160),
                          "group": rnd.choice((-1, 32, 64, 128)), "hidden": 4096,
                          "dtype": "bfloat16"})
    return cases


#: the FP8 MoE grid's schemes (the W8A8 grid's FP8 schemes that have an MoE method:
#: compressed-tensors FP8 dynamic, static and block, vLLM's own fp8 per tensor and in 128x128
#: blocks), on sm80 (Marlin), sm89 (Triton: FP8 compute) and sm90
FP8_MOE = ("ct_fp8_dynamic", "ct_fp8_static", "ct_fp8_block", "fp8", "fp8_block")
FP8_MOE_CAPS = ("8.0", "8.9", "9.0")
#: the INT8 MoE grid's schemes: compressed-tensors INT8 W8A8 with dynamic per-token and with
#: static per-tensor activation scales (vLLM builds an MoE method for the first only)
INT8_MOE = ("ct_int8_dynamic", "ct_int8_static")


def mxfp4_grid(rnd: random.Random, per_cap: int = 40) -> list[dict]:
    """gpt-oss's MXFP4 experts: widths in whole 32-value blocks (the format's), some that TP
    does not divide, hidden 2880 (gpt-oss's), 2816 or 4096, TP 1-8 with and without expert
    parallelism. Under expert parallelism only widths the ep ranks divide are drawn:
    gpt-oss's ``MLPBlock.__init__`` asserts ``intermediate_size % world_size``, a model
    class the oracle does not build (the pack's ``vllm-moe-mxfp4-load`` is read, not run)."""
    cases = []
    for cap in FP8_MOE_CAPS:
        for _ in range(per_cap):
            tp = rnd.choice((1, 2, 4, 8))
            ep = rnd.choice((1, 1, tp, 2 * tp))
            width = 32 * rnd.randint(1, 96) * (ep if ep > 1 else 1)
            cases.append({"cap": cap, "kind": "moe", "quant": "mxfp4", "width": width,
                          "tp": tp, "ep": ep, "experts": rnd.randint(2, 128), "group": 32,
                          "hidden": rnd.choice((2880, 2816, 4096)), "dtype": "bfloat16"})
    return cases


#: the W8A8/W8A16 schemes of the oracle (tests/vllm_oracle.py SCHEMES) by the pack's name
PACK_QUANT = {"ct_fp8_dynamic": "fp8", "ct_fp8_static": "fp8_static",
              "ct_fp8_w8a16": "fp8_w8a16", "fp8": "fp8", "ct_fp8_block": "ct_fp8_block",
              "fp8_block": "fp8_block", "ct_int8_dynamic": "int8_dynamic",
              "ct_int8_static": "int8_static", "ct_int8_asym": "int8_asym"}


def w8a8_grid(rnd: random.Random, per_cap: int = 90) -> list[dict]:
    """An MLP's intermediate width per rank drawn as the WNA16 grid draws it (multiples of
    8-128, and some odd), at TP 1-8, for each scheme, on the hidden 4096: its gate_up_proj
    (column-parallel, gate and up merged) and its down_proj (row-parallel)."""
    cases = []
    for cap in SM:
        for _ in range(per_cap):
            tp = rnd.choice((1, 2, 4, 8))
            shard = rnd.choice((1, 8, 16, 32, 64, 128)) * rnd.randint(1, 96)
            cases.append({"cap": cap, "kind": "w8a8", "scheme": rnd.choice(sorted(PACK_QUANT)),
                          "use": rnd.choice(("gate_up_proj", "down_proj")), "hidden": 4096,
                          "width": shard * tp, "tp": tp, "dtype": "bfloat16"})
        for scheme in sorted(PACK_QUANT):  # the engine cases' 8806: K % 16, % 4 and % 128
            cases.append({"cap": cap, "kind": "w8a8", "scheme": scheme, "use": "down_proj",
                          "hidden": 4096, "width": 8806, "tp": 1, "dtype": "bfloat16"})
    return cases


def vllm_answers(cases: list[dict]) -> list[dict]:
    out = []
    for cap in SM_ALL:
        mine = [c for c in cases if c["cap"] == cap]
        if not mine:
            continue
        proc = subprocess.run([sys.executable, str(RUNNER), str(CACHE / "src"),
                               str(CACHE / "deps"), cap], input=json.dumps(mine),
                              capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stderr[-4000:]
        out += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(out) == len(cases)
    return out


def wna16_quant(case: dict) -> str:
    """The pack's name for a drawn 4-bit checkpoint: GPTQ's ``desc_act`` with a group size and
    compressed-tensors' ``actorder: group`` are the ``*_act_order`` names (GPTQ's act-order is
    a no-op without groups: ``normalize_and_validate_gptq_desc_act``)."""
    quant = case["quant"]
    if case.get("act_order") and (quant == "wna16" or (quant == "gptq" and case["group"] > 0)):
        return f"{quant}_act_order"
    return quant


def vllm_refuses(case: dict) -> bool:
    """vLLM raised, or loaded a GPTQ/compressed-tensors linear whose scale rows per rank (as
    its ``create_weights`` allocated them) do not cover the rank's inputs exactly: the loader
    narrows the file's scales to those rows and the layer computes wrong numbers, which
    gac-check calls refused."""
    rows = case.get("scale_rows")
    wrong = (rows is not None and case["group"] > 0
             and rows * case["group"] != case["shard_in"])
    return case["refused"] or wrong


def mlp_outcomes(spec: str, hidden: int, width: int, use: str, sm: int | None) -> list:
    """The pack's outcomes for one MLP linear (``use``) of an MLP ``width`` wide under
    ``spec``, at capability ``sm``: what the oracles compare with vLLM's own choice."""
    target = parse_target(spec)
    shape = ModelShape(hidden, 32000, {0: LayerShape(32, 8, 128, width)})
    site = DimSite("mlp:intermediate", Role.INTERMEDIATE, width, [], layer=0)
    return [o for o in judge_uses(target, site_uses(site, shape, target), width, sm)
            if o.use == use]


def pack_answer(case: dict) -> dict:
    sm = SM_ALL[case["cap"]]
    if case["kind"] == "attention":
        target = parse_target("vllm")
        shape = ModelShape(4096, 32000, {0: LayerShape(32, 8, case["head_dim"], 14336)})
        site = DimSite("a:head_dim", Role.HEAD_DIM, case["head_dim"], [], layer=0)
        outs = [o for o in judge_uses(target, site_uses(site, shape, target), case["head_dim"],
                                      sm) if o.use == "attention"]
    elif case["kind"] == "vocab":
        target = parse_target(f"vllm,tp={case['tp']}")
        site = DimSite("lm_head:vocab", Role.VOCAB, case["vocab"], [])
        outs = judge_uses(target, site_uses(site, ModelShape(4096, case["vocab"]), target),
                          case["vocab"], sm)
        return {"refused": worst(outs) == REFUSED}
    elif case["kind"] == "moe":
        return moe_pack_answer(case, sm)
    elif case["kind"] == "w8a8":
        outs = mlp_outcomes(f"vllm,tp={case['tp']},quant={PACK_QUANT[case['scheme']]}",
                            case["hidden"], case["width"], case["use"], sm)
    else:
        target = parse_target(f"vllm,tp={case['tp']},quant={wna16_quant(case)},"
                              f"group={case['group']}")
        q = {"tp": case["tp"], "group": case["group"], "uniform_layers": 1,
             "act_fp16": int(case["dtype"] == "float16"), "in": case["in"],
             "out": case["out"], "shard_in": case["shard_in"], "shard_out": case["shard_out"]}
        outs = judge_uses(target, [Use("linear", "down_proj", lambda v: q)], 0, sm)
    refused = worst(outs) == REFUSED
    kernel = next((o.kernel for o in outs if not o.gate and o.kernel), None)
    return {"refused": refused, "kernel": None if refused else kernel, "why": _why(outs)}


def _why(outs: list) -> str:
    """The first refusal's reason (what an excuse is matched on)."""
    return next((o.why for o in outs if o.verdict == REFUSED), "")


def moe_pack_answer(case: dict, sm: int) -> dict:
    """The pack's verdicts on the expert-width site and the expert-count site."""
    spec = f"vllm,tp={case['tp']},ep={case['ep']}"
    if case["quant"] == "mxfp4":
        spec += ",quant=mxfp4"
    elif case["quant"] in PACK_QUANT:
        spec += f",quant={PACK_QUANT[case['quant']]}"
    elif case["quant"] != "none":
        spec += f",quant={wna16_quant(case)},group={case['group']}"
    target = parse_target(spec)
    shape = ModelShape(case["hidden"], 32000, {0: LayerShape(32, 8, 128, None, moe=True)})
    out = {}
    for role, value in ((Role.EXPERT, case["width"]), (Role.EXPERTS, case["experts"])):
        site = DimSite(f"experts:{role.value}", role, value, [], layer=0)
        outs = judge_uses(target, site_uses(site, shape, target), value, sm)
        out[role] = (worst(outs), next((o.kernel for o in outs if not o.gate and o.kernel), None),
                     _why(outs))
    verdict, kernel, why = out[Role.EXPERT]
    return {"refused": verdict == REFUSED, "kernel": None if verdict == REFUSED else kernel,
            "even": out[Role.EXPERTS][0] == "fast", "why": why or out[Role.EXPERTS][2]}


def moe_disagreement(case: dict, pack: dict) -> str | None:
    """The experts class vLLM chose (Humming's indexed or grouped class is the pack's
    HummingExperts), whether MoeWNA16Method runs it and Marlin pads its tiles, and whether the
    expert map is even."""
    even = len(set(case["local"])) == 1
    if even != pack["even"]:
        return f"expert map {case['local']}: the pack says {'even' if pack['even'] else 'uneven'}"
    kernel = pack["kernel"] or ""
    if case["quant"] == "mxfp4":
        return mxfp4_disagreement(case, kernel)
    name = kernel.split(" (", 1)[0]
    chosen = "HummingExperts" if case["kernel"].startswith("Humming") else case["kernel"]
    if name != chosen or kernel.endswith("(MoeWNA16Method)") != case.get("wna16", False):
        return f"vLLM {case['kernel']} (MoeWNA16Method: {case.get('wna16')}), pack {kernel}"
    if name == "MarlinExperts" and kernel.endswith("tile-padded)") != case["tile_padded"]:
        return f"Marlin MoE tile padding: vLLM {case['tile_padded']}, pack {kernel}"
    return None


def mxfp4_disagreement(case: dict, kernel: str) -> str | None:
    """The MXFP4 backend vLLM took (the OAI Triton classes are the pack's one Triton kernel)
    and whether its ``maybe_roundup_sizes`` zero-padded the width per rank."""
    family = "OAI Triton" if case["kernel"].startswith("OAITriton") else case["kernel"]
    moe_tp = 1 if case["ep"] > 1 else case["tp"]
    padded = case["padded_shard"] != case["width"] // moe_tp
    if not kernel.startswith(family) or kernel.endswith("padded by vLLM)") != padded:
        return (f"vLLM {case['kernel']} ({case['backend']}, width per rank "
                f"{case['width'] // moe_tp} -> {case['padded_shard']}), pack {kernel}")
    return None


def disagreement(case: dict, pack: dict) -> str | None:
    if case["kind"] == "moe" and not case["refused"] and not pack["refused"]:
        return moe_disagreement(case, pack)
    refused = vllm_refuses(case)
    if refused != pack["refused"]:
        return f"vLLM {'refuses' if refused else 'loads'}, the pack says {pack}"
    if case["kind"] == "vocab" or refused:
        return None
    if case["kind"] == "w8a8":
        return w8a8_disagreement(case, pack["kernel"] or "")
    kernel = pack["kernel"] or ""
    if case["kind"] == "attention":
        return None if kernel == case["kernel"] else f"vLLM {case['kernel']}, pack {kernel}"
    padded = kernel.endswith("(tile-padded)")
    name = VLLM_NAME.get(kernel.removesuffix(" (tile-padded)"))
    if name != case["kernel"]:
        return f"vLLM {case['kernel']}, pack {kernel}"
    if name == "MarlinLinearKernel" and padded != case["tile_padded"]:
        return f"Marlin tile padding: vLLM {case['tile_padded']}, pack {kernel}"
    return None


def w8a8_disagreement(case: dict, kernel: str) -> str | None:
    """The pack's scaled-mm kernel against the one vLLM chose and what it did with the layer:
    CUTLASS FP8 padding the weight (reshaped) is the pack's padded CUTLASS; CUTLASS INT8 is
    CUTLASS where ``ops.cutlass_scaled_mm`` ran CUTLASS, else Triton. Block FP8's kernel is
    not in the pack (it judges loading only)."""
    if PACK_QUANT[case["scheme"]] in ("fp8_block", "ct_fp8_block"):
        return None
    chosen = case["kernel"]
    if chosen == "CutlassFP8ScaledMMLinearKernel":
        want = "cutlass_scaled_mm (pads K, N to 16)" if case["reshaped"] else "cutlass_scaled_mm"
    elif chosen == "CutlassInt8ScaledMMLinearKernel":  # the GEMM that ran: azp, Triton, CUTLASS
        want = (case["gemm"] if case["gemm"] in ("cutlass_scaled_mm_azp", "triton_scaled_mm")
                else "cutlass_scaled_mm")
    elif chosen in ("MarlinFP8ScaledMMLinearKernel", "HummingFP8ScaledMMLinearKernel"):
        want = "fp8 weight-only (humming; marlin for quant_method fp8)"
    else:
        want = chosen
    return None if kernel == want else f"vLLM {chosen} ({want}), pack {kernel}"


def drawn(seed: int, per_cap: int = 40) -> list[dict]:
    """The random draw (issue 39): on every capability of :data:`SM_ALL`, head sizes 1-576;
    GPTQ, AWQ and compressed-tensors W4A16 linears with groups -1/32/64/128 and act-order on
    and off (widths per rank any multiple of 8: partial and straddled groups included); the
    W8A8/W8A16 schemes (FP8 per tensor, per channel, 128x128 blocks; INT8); fused-MoE layers
    (unquantized, GPTQ/AWQ/compressed-tensors W4A16, FP8 and INT8) under TP and EP with the
    route's own ``create_weights`` on drawn hidden sizes; vocabularies under TP."""
    rnd = random.Random(seed)
    cases: list[dict] = []
    for cap in SM_ALL:
        for hd in rnd.sample(range(1, 577), per_cap // 3):
            cases.append({"cap": cap, "kind": "attention", "head_dim": hd,
                          "dtype": rnd.choice(("bfloat16", "float16"))})
        for _ in range(per_cap):
            tp = rnd.choice((1, 2, 4, 8))
            k = rnd.choice((8, 64, 128)) * rnd.randint(1, 96)
            n = rnd.choice((8, 64, 128)) * rnd.randint(1, 96)
            row = rnd.random() < 0.5
            quant = rnd.choice(("gptq", "awq", "wna16"))
            cases.append({"cap": cap, "kind": "linear", "quant": quant,
                          "act_order": quant != "awq" and rnd.random() < 0.25,
                          "in": k * tp if row else k, "out": n if row else n * tp,
                          "shard_in": k, "shard_out": n, "tp": tp,
                          "group": rnd.choice((-1, 32, 64, 128)),
                          "dtype": rnd.choice(("bfloat16", "float16"))})
        for _ in range(per_cap // 3):
            tp = rnd.choice((1, 2, 4, 8))
            shard = rnd.choice((1, 8, 16, 32, 64, 128)) * rnd.randint(1, 96)
            cases.append({"cap": cap, "kind": "w8a8", "scheme": rnd.choice(sorted(PACK_QUANT)),
                          "use": rnd.choice(("gate_up_proj", "down_proj")), "hidden": 4096,
                          "width": shard * tp, "tp": tp, "dtype": "bfloat16"})
        for _ in range(per_cap // 2):
            tp = rnd.choice((1, 2, 4, 8))
            ep = rnd.choice((1, 1, tp, 2 * tp))
            width = rnd.choice((8, 32, 64, 128)) * rnd.randint(1, 48) * (1 if ep > 1 else tp)
            quant = rnd.choice(("none", "gptq", "awq", "wna16", *FP8_MOE, *INT8_MOE))
            cases.append({"cap": cap, "kind": "moe", "quant": quant, "width": width, "tp": tp,
                          "ep": ep, "experts": rnd.randint(2, 160),
                          "act_order": quant in ("gptq", "wna16") and rnd.random() < 0.2,
                          "group": rnd.choice((-1, 32, 64, 128)),
                          "hidden": rnd.choice((4096, 2880, 2048, 7168)),
                          "dtype": "bfloat16"})
        for _ in range(per_cap // 8):
            cases.append({"cap": cap, "kind": "vocab", "vocab": rnd.randint(1000, 200000),
                          "tp": rnd.randint(1, 8)})
    return cases


#: the cases the pack may answer otherwise than vLLM's code, each named with why (none may be
#: a verdict the pack gets wrong: each is a case vLLM's Python does not decide alone, or one
#: the pack declines to judge and says so)
EXCUSED: dict[str, str] = {
    "not read at this capability": (
        "the pack refuses saying 'not judged' where vLLM's backends for the component were "
        "read for other capabilities only (fused MoE on sm100/sm120: FlashInfer TRT-LLM and "
        "the Blackwell backends come first; issue 39 item 2, branch gpus39, owns the "
        "capability rules): a refusal that says it does not know, never a kernel claimed"),
    "FlashInfer FP8 GEMM from sm100": (
        "FlashInferFP8ScaledMMLinearKernel heads _POSSIBLE_FP8_KERNELS and takes per-tensor "
        "FP8 from compute capability 100 (vllm/model_executor/kernels/linear/scaled_mm/"
        "flashinfer.py, is_supported); the pack names CUTLASS there: a capability rule of "
        "issue 39 item 2 (branch gpus39), not a load verdict (both load)"),
}


def excused(case: dict, pack: dict) -> str | None:
    """The name of the :data:`EXCUSED` entry that covers this disagreement, else None."""
    blackwell = SM_ALL[case["cap"]] >= 100
    if blackwell and pack.get("refused") and "not judged" in pack.get("why", ""):
        return "not read at this capability"
    if (blackwell and case["kind"] == "w8a8" and not vllm_refuses(case)
            and case["kernel"] == "FlashInferFP8ScaledMMLinearKernel"):
        return "FlashInfer FP8 GEMM from sm100"
    return None


def compare(cases: list[dict]) -> tuple[list[str], dict[str, int], int]:
    """vLLM's answers against the pack's: the disagreements, the excused ones by name, and
    how many cases vLLM answered."""
    answers = vllm_answers(cases)
    wrong: list[str] = []
    seen: dict[str, int] = {}
    hidden = ("kernel", "refused", "tile_padded", "padded", "reshaped", "gemm", "local",
              "wna16", "why", "backend", "padded_shard", "padded_hidden", "scale_rows")
    for case in answers:
        pack = pack_answer(case)
        why = disagreement(case, pack)
        if why:
            name = excused(case, pack)
            if name is not None:
                seen[name] = seen.get(name, 0) + 1
                continue
            shown = {k: v for k, v in case.items() if k not in hidden}
            wrong.append(f"{shown}: {why} ({case.get('why', '')})")
    return wrong, seen, len(answers)


def _need_cache() -> None:
    if not (CACHE / "src" / "vllm").is_dir() or not (CACHE / "deps").is_dir():
        message = "vLLM's wheel is not cached: run `make vllm-oracle` (CI does)"
        if os.environ.get("GAC_REQUIRE_ENGINE_SOURCES"):
            pytest.fail(message)
        pytest.skip(message)


def test_the_vllm_pack_agrees_with_vllms_own_selection_code():
    _need_cache()
    cases = grid()
    assert len(cases) >= 500
    wrong, seen, n = compare(cases)
    print(f"fixed grid: {n} cases, {len(wrong)} disagree, excused {seen}")
    assert not wrong, f"{len(wrong)} of {n} disagree:\n" + "\n".join(wrong[:60])


def test_a_random_draw_agrees_with_vllms_own_code():
    """Over every capability and scheme of :func:`drawn`, 0 disagreements where vLLM's
    Python decides. The draw is seeded, so CI is not red by chance: seed 1 by default,
    ``GAC_ORACLE_SEED=N`` draws another and ``GAC_ORACLE_SEED=fresh`` a new one (printed)."""
    _need_cache()
    chosen = os.environ.get("GAC_ORACLE_SEED") or "1"
    seed = random.SystemRandom().randrange(1 << 32) if chosen == "fresh" else int(chosen)
    print(f"vLLM oracle draw: GAC_ORACLE_SEED={seed}")
    wrong, seen, n = compare(drawn(seed))
    print(f"drawn: {n} cases, {len(wrong)} disagree, excused {seen}")
    assert not wrong, (f"GAC_ORACLE_SEED={seed}: {len(wrong)} of {n} disagree:\n"
                       + "\n".join(wrong[:60]))
