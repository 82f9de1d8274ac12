"""SGLang's own attention-backend choice and vocabulary padding, run on a CPU: the oracle of
tests/test_targets_sglang_oracle.py.

Run as a program (``python tests/sglang_oracle.py SRC < cases.json``; ``--setup CACHE`` fills
the cache once) so that SGLang's code never enters the test process. Importing SGLang whole
needs torchvision and trips transformers' version check, so the functions that decide are
taken from the released wheel's modules by name (their syntax trees, run alone) and given
what they read of the rest of SGLang:

* ``get_default_attn_backend`` and the views it reads the server arguments through
  (``resolving_view``, ``resolved_view``), from sglang/srt/arg_groups/model_override_base.py,
  with ``is_no_spec_infer_or_topk_one`` and ``is_mps`` from sglang/srt/utils/common.py;
* the platform facts it asks ``get_platform()`` for: SGLang's own ``PlatformContext``
  (sglang/srt/runtime_context.py) over SGLang's own probes in utils/common.py
  (``_check_cuda_device_version`` and the ``is_sm*_supported`` / ``is_hopper_with_cuda_12_3``
  / ``is_blackwell_supported`` partials built on it). Stood in: ``is_cuda`` (True),
  ``get_device_sm`` (the case's capability), ``torch.version`` (CUDA "13.0": the wheel
  requires ``flashinfer_python[cu13]``; no HIP) and ``has_flashinfer`` (True: flashinfer_python is a
  hard dependency of the wheel; set through SGLang's own ``override_platform`` mechanism);
* ``VocabParallelEmbedding.__init__`` (sglang/srt/layers/vocab_parallel_embedding.py: the
  padding to 64, times tp where the padded size does not divide, and the shard indices with
  their ``__post_init__`` checks) on every TP rank, with ``divide`` from
  sglang/srt/distributed/utils.py. Stood in: the TP group (``get_parallel``: size and rank)
  and the unquantized embedding method's ``create_weights`` (records the shard's shape).

The model a case describes is a plain MHA decoder (no speculative decoding, page size 1,
equal K and V head sizes, no attention sinks, not Whisper): the cases the test draws.
Prints one JSON answer per case.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

#: the SGLang release the sglang pack was read at (gac_check/targets/packs/sglang.json)
WHEEL = "sglang==0.5.23"
#: the wheel's modules the oracle takes functions from (nothing else is unpacked)
FILES = ("sglang/srt/arg_groups/model_override_base.py", "sglang/srt/utils/common.py",
         "sglang/srt/runtime_context.py", "sglang/srt/layers/vocab_parallel_embedding.py",
         "sglang/srt/distributed/utils.py")
#: the CUDA version the stand-in torch reports (the wheel's flashinfer_python[cu13])
CUDA = "13.0"


def setup(cache: Path) -> None:
    """Once: the wheel's :data:`FILES` into ``cache/src`` (``make sglang-oracle``)."""
    if all((cache / "src" / f).is_file() for f in FILES):
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary", ":all:", "-d", tmp, WHEEL], check=True, timeout=1800)
        (wheel,) = Path(tmp).glob("sglang-*.whl")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(cache / "src", FILES)
    (cache / "src" / "VERSION").write_text(WHEEL + "\n")


def take(src: Path, file: str, names: set[str], scope: dict) -> dict:
    """Run the top-level definitions and assignments of ``file`` named ``names`` in
    ``scope`` (in the file's order), failing loudly if the release no longer has one."""
    path = src / file
    tree = ast.parse(path.read_text(), str(path))
    body, found = [], set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            body.append(node)
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            hit = {t.id for t in targets if isinstance(t, ast.Name)} & names
            if hit:
                body.append(node)
                found |= hit
    assert found == names, f"{path} no longer defines {sorted(names - found)}"
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), scope)
    return scope


def _module(name: str, scope: dict) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(scope)
    sys.modules[name] = module
    return module


def platform(src: Path, sm: int):
    """SGLang's ``get_platform()`` on a GPU of capability ``sm``, and ``override_platform``."""
    import functools
    import typing

    fake_torch = types.SimpleNamespace(version=types.SimpleNamespace(cuda=CUDA, hip=None))
    common = take(src, "sglang/srt/utils/common.py", {
        "_check_cuda_device_version", "is_hopper_with_cuda_12_3", "is_blackwell_supported",
        "is_sm120_supported", "is_sm100_supported", "is_sm100_or_sm110_supported",
        "is_sm110_supported", "is_sm90_supported", "is_hip", "is_mps",
        "is_no_spec_infer_or_topk_one",
    }, {"torch": fake_torch, "lru_cache": functools.lru_cache, "partial": functools.partial,
        "List": list, "Tuple": tuple,
        "is_cuda": lambda: True, "get_device_sm": lambda: sm})
    for name in ("sglang", "sglang.srt", "sglang.srt.utils"):
        _module(name, {})
    _module("sglang.srt.utils.common", common)
    context = take(src, "sglang/srt/runtime_context.py", {
        "_PLATFORM_PROBES", "_PLATFORM_VALUES", "PlatformContext", "_PLATFORM", "get_platform",
        "_PlatformOverride", "override_platform"}, {"Any": typing.Any, "Dict": dict})
    context["override_platform"](has_flashinfer=True).install()
    return context["get_platform"], common


def attention_backend(src: Path, sm: int):
    """SGLang's ``get_default_attn_backend`` for a plain MHA model on capability ``sm``."""
    import typing

    get_platform, common = platform(src, sm)
    scope = take(src, "sglang/srt/arg_groups/model_override_base.py", {
        "ResolvedView", "ResolvingConfig", "resolving_view", "_declaration_overlay",
        "resolved_view", "_forces_eagle_topk_one", "get_default_attn_backend"},
        {"Any": typing.Any, "Optional": typing.Optional, "Dict": dict,
         "current_platform": types.SimpleNamespace(is_out_of_tree=lambda: False),
         "get_platform": get_platform, "is_mps": common["is_mps"],
         "is_no_spec_infer_or_topk_one": common["is_no_spec_infer_or_topk_one"]})
    server_args = types.SimpleNamespace(speculative_eagle_topk=None, speculative_algorithm=None,
                                        page_size=1, tp_size=1, _resolved_overrides=())
    model = types.SimpleNamespace(hf_config=types.SimpleNamespace(
        architectures=["LlamaForCausalLM"]), has_asymmetric_kv=False, has_attention_sinks=False)
    return scope["get_default_attn_backend"](server_args, False, model)


def vocab_layer(src: Path):
    """SGLang's ``VocabParallelEmbedding`` with a stand-in TP group; returns a function of
    (vocab, tp, rank) giving the padded vocabulary and the rank's rows."""
    import dataclasses
    import typing

    import torch

    divide = take(src, "sglang/srt/distributed/utils.py", {"ensure_divisibility", "divide"},
                  {})["divide"]
    group = types.SimpleNamespace(tp_rank=0, tp_size=1)

    class Unquantized:  # what create_weights is asked for: the rank's rows
        def create_weights(self, layer, dim, partitions, *args, **kwargs):
            layer.rows = partitions[0]

    scope = take(src, "sglang/srt/layers/vocab_parallel_embedding.py", {
        "DEFAULT_VOCAB_PADDING_SIZE", "pad_vocab_size",
        "vocab_range_from_per_partition_vocab_size", "vocab_range_from_global_vocab_size",
        "VocabParallelEmbeddingShardIndices", "VocabParallelEmbedding"},
        {"torch": torch, "dataclass": dataclasses.dataclass, "Optional": typing.Optional,
         "Sequence": typing.Sequence, "Tuple": tuple, "divide": divide,
         "get_parallel": lambda: group, "_resolve_linear_group": lambda name: None,
         "UnquantizedEmbeddingMethod": Unquantized,
         "method_has_implemented_embedding": lambda cls: True,
         "QuantizationConfig": object, "QuantizeMethodBase": object})

    def build(vocab: int, tp: int, rank: int) -> tuple[int, int]:
        group.tp_rank, group.tp_size = rank, tp
        layer = scope["VocabParallelEmbedding"](vocab, 8, params_dtype=torch.float32)
        return layer.num_embeddings_padded, layer.rows

    return build


def main() -> None:
    if sys.argv[1] == "--setup":
        setup(Path(sys.argv[2]))
        return
    src, cap = Path(sys.argv[1]), sys.argv[2]
    sm = int(cap.replace(".", ""))
    cases = json.load(sys.stdin)
    backend = attention_backend(src, sm) if any(c["kind"] == "attention" for c in cases) else None
    build = vocab_layer(src)
    for case in cases:
        if case["kind"] == "attention":
            answer = {"backend": backend}
        else:
            try:
                shards = [build(case["vocab"], case["tp"], r) for r in range(case["tp"])]
                answer = {"refused": False, "padded": shards[0][0],
                          "rows": sorted({rows for _, rows in shards})}
            except (AssertionError, ValueError, ZeroDivisionError) as e:
                answer = {"refused": True, "why": f"{type(e).__name__}: {e}"[:300]}
        print(json.dumps({**case, **answer}), flush=True)


if __name__ == "__main__":
    main()
