"""Issue 38's repair goal, measured: of the zoo types whose ``mlp173`` variant is judged
misaligned, how many ``--repair`` proves (OUT loads strictly in its own class, fp32 logits
within 1e-5 of the input's) and how many it refuses, with each refusal's one-line reason.

Each type is built tiny by :func:`gac_check.testing.zoo.build_tiny` (every MLP / expert width
173), checked and repaired through :mod:`gac_check.api` as a user would; a repair that writes
an OUT its class cannot load, or with other logits, is counted as ``WRONG`` (the goal: none).

    .venv/bin/python benchmarks/repair_coverage.py [MODEL_TYPE ...]
"""
from __future__ import annotations

import resource
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

ATOL = 1e-5
#: a type whose tiny build, check and repair take longer is skipped, with that said
LIMIT_S = 90
#: and one whose "tiny" build allocates more (a size key the zoo does not set)
LIMIT_BYTES = 6 << 30


class _Late(BaseException):  # not caught as a failure of the type
    pass


def _late(*_: object) -> None:
    raise _Late(f"over {LIMIT_S} s")


def _logits(path: Path):
    import json

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )
    saved = json.loads((path / "config.json").read_text())
    kind, own = saved["model_type"], getattr(transformers, (saved.get("architectures")
                                                            or [""])[0], None)
    auto = (AutoModelForCausalLM if kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            else AutoModelForMaskedLM if kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES
            # a text model saved alone (emu3_text_model): the class config.json names
            else own if isinstance(own, type) and issubclass(own, transformers.PreTrainedModel)
            else AutoModelForMaskedLM)
    model, info = auto.from_pretrained(path, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"does not load strictly: {str(bad)[:200]}"
    if getattr(model, "_can_set_experts_implementation", lambda: False)():
        model.set_experts_implementation("eager")
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 64], [4, 4, 100, 8, 0, 17, 3, 127]])
    with torch.no_grad():
        return model.eval()(ids, use_cache=False).logits  # hybrids' caches


def one(model_type: str, work: Path) -> tuple[str, str]:
    """(outcome, detail): PROVEN (every misaligned site padded, logits equal), PARTIAL (OUT
    loads with equal logits, some sites refused with why), REFUSED (one line, nothing
    written), WRONG (OUT does not load or its logits differ), or SKIP (not built, not judged,
    or judged aligned)."""
    from gac_check.api import check, repair
    from gac_check.errors import BadInput
    from gac_check.testing.zoo import DTYPE, build_tiny

    src, out = work / model_type, work / f"{model_type}-out"
    try:
        build_tiny(model_type, "mlp173", src)
        before = _logits(src)
    except Exception as e:  # not built / does not run tiny: outside the measure
        return "SKIP", f"not built: {str(e).splitlines()[0][:80] if str(e) else type(e)}"
    try:
        result = check(src, gpu="h100", dtype=DTYPE)
    except BadInput as e:
        return "SKIP", f"not judged: {str(e).splitlines()[0][:80]}"
    if result.verdict() == "pass":
        return "SKIP", "judged aligned"
    try:
        fixed = repair(src, out, gpu="h100", dtype=DTYPE, progress=False)
    except BadInput as e:
        return "REFUSED", str(e).splitlines()[0].replace(str(src), "MODEL")
    try:
        diff = (_logits(out) - before).abs().max().item()
    except Exception as e:  # the finding is the outcome
        return "WRONG", repr(e)[:200]
    if diff > ATOL:
        return "WRONG", f"{diff}"
    refused = fixed.report.plan.refused
    if fixed.after.verdict() != "pass" and refused:  # OUT exact, some sites left, with why
        return "PARTIAL", f"{refused[0].site.name}: {refused[0].reason[:120]}"
    return "PROVEN", f"max |dlogit| {diff:.1e}"


def main(argv: list[str]) -> int:
    from gac_check.formats.derive_table import model_types

    warnings.simplefilter("ignore")
    resource.setrlimit(resource.RLIMIT_DATA, (LIMIT_BYTES, LIMIT_BYTES))
    types = argv or model_types()
    counts: Counter[str] = Counter()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        signal.signal(signal.SIGALRM, _late)
        for t in types:
            signal.alarm(LIMIT_S)
            try:
                outcome, detail = one(t, Path(tmp))
            except _Late as e:
                outcome, detail = "SKIP", str(e)
            signal.alarm(0)
            counts[outcome] += 1
            print(f"{outcome:8} {t:28} {detail}", flush=True)
    judged = sum(counts[k] for k in ("PROVEN", "PARTIAL", "REFUSED", "WRONG"))
    print(f"\n{judged} judged misaligned (mlp173): {counts['PROVEN']} proven, "
          f"{counts['PARTIAL']} written exact with sites refused, {counts['REFUSED']} refused, "
          f"{counts['WRONG']} wrong; {counts['SKIP']} skipped; "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if counts["WRONG"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
