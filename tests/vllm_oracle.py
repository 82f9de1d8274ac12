"""vLLM's own selection code, run on a CPU: the oracle of tests/test_targets_vllm_oracle.py.

Run as a program (``python tests/vllm_oracle.py SRC DEPS CAP < cases.json``; ``--setup
CACHE`` fills the cache once) so that vLLM's
modules never enter the test process. SRC is vLLM's release wheel unpacked without its
compiled extensions, DEPS its pure-Python dependencies (``make vllm-oracle`` caches both).
What a CPU cannot provide is stood in for, here and nowhere in vLLM's code: the compiled
extension modules (``vllm._C*``, FlashAttention's ``_vllm_fa2_C``/``_vllm_fa3_C``), the GPU
packages vLLM depends on (flashinfer, humming: present in every vLLM install) and a handful of
server-side imports the selection code never calls, and a platform that reports compute
capability CAP (8.0 to 12.0). Then vLLM's own code answers: ``CudaPlatformBase.get_valid_backends``
for the attention backend (``validate_configuration`` of each backend), the AWQ route
(``check_marlin_supports_layer``, then ``choose_mp_linear_kernel``; a layer it sends to
``AutoAWQLinearMethod`` is checked as ``BaseAWQLinearMethod.create_weights`` checks it),
``choose_mp_linear_kernel`` with every WNA16 kernel's ``can_implement`` for GPTQ,
``marlin_padded_nk`` for Marlin's tile padding, ``pad_vocab_size`` for the vocabulary, and
for FP8/INT8 the quantization method vLLM builds for a checkpoint's config, run as at load
(:func:`scaled_mm_answers`), and for a mixture-of-experts layer the MoE layer vLLM builds
(:func:`moe_answers`). Prints one JSON answer per case.
"""
from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import json
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

#: compiled extension modules of the wheel, GPU packages vLLM depends on, and server-side
#: imports the selection code does not call
STAND_INS = {
    "vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch",
    "vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C",
    "flashinfer", "humming", "uvloop", "xgrammar", "fastapi", "llguidance",
    "triton_kernels.matmul", "vllm.third_party.deep_gemm._C",
}

#: the W8A8/W8A16 schemes of the grid as the checkpoints' quantization_config declares them:
#: compressed-tensors (llm-compressor's FP8_DYNAMIC, FP8 static, FP8 weight-only, FP8 block,
#: INT8 W8A8 dynamic/static/asymmetric) and vLLM's own ``fp8`` (per-tensor, 128x128 blocks)
_F8 = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
_I8 = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": False}
SCHEMES = {
    "ct_fp8_dynamic": ({**_F8, "strategy": "channel"},
                       {**_F8, "strategy": "token", "dynamic": True}),
    "ct_fp8_static": ({**_F8, "strategy": "tensor"}, {**_F8, "strategy": "tensor"}),
    "ct_fp8_w8a16": ({**_F8, "strategy": "channel"}, None),
    "ct_fp8_block": ({**_F8, "strategy": "block", "block_structure": [128, 128]},
                     {**_F8, "strategy": "group", "group_size": 128, "dynamic": True}),
    "ct_int8_dynamic": ({**_I8, "strategy": "channel"},
                        {**_I8, "strategy": "token", "dynamic": True}),
    "ct_int8_static": ({**_I8, "strategy": "tensor"}, {**_I8, "strategy": "tensor"}),
    "ct_int8_asym": ({**_I8, "strategy": "channel"},
                     {**_I8, "strategy": "token", "dynamic": True, "symmetric": False}),
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic"},
    "fp8_block": {"quant_method": "fp8", "activation_scheme": "dynamic",
                  "weight_block_size": [128, 128]},
}


def quant_config(scheme: str) -> dict:
    """The checkpoint's ``quantization_config`` for ``scheme``."""
    if not scheme.startswith("ct_"):
        return SCHEMES[scheme]
    weights, acts = SCHEMES[scheme]
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts}
    fmt = "int-quantized" if weights["type"] == "int" else "float-quantized"
    return {"quant_method": "compressed-tensors", "format": fmt,
            "config_groups": {"group_0": group}, "ignore": ["lm_head"]}


#: the capability queries vllm._C registers as torch ops (csrc/quantization/w8a8/cutlass):
#: FP8 from sm89, block FP8 from sm90, FP4 from sm100
COMPILED_QUERIES = {"cutlass_scaled_mm_supports_fp8": 89,
                    "cutlass_scaled_mm_supports_block_fp8": 90,
                    "cutlass_scaled_mm_supports_fp4": 100}


#: humming-kernels 0.1.19's ``humming/config/enum.py`` ``GemmType`` (the release vLLM 0.33.0
#: installs): HummingExperts' ``is_supported_config`` compares its ``.value`` with the gemm type
#: vLLM prefers (``get_humming_moe_gemm_type``), so the stand-in package carries the real enum
HUMMING_GEMM_TYPE = enum.Enum("GemmType", {"DENSE": "dense", "INDEXED": "indexed",
                                           "GROUPED_CONTIGUOUS": "grouped_contiguous",
                                           "GROUPED_MASKED": "grouped_masked"})


class _Anything:
    """Whatever a stood-in module is asked for: callable, indexable, subclassable."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: object, **kwargs: object) -> _Anything:
        return _Anything(self._name + "()")

    def __getattr__(self, name: str) -> _Anything:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self._name}.{name}")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def __or__(self, other: object) -> _Anything:
        return self

    __ror__ = __or__

    def __getitem__(self, key: object) -> _Anything:
        return self

    def __iter__(self):
        return iter(())


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Anything:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self.__name__}.{name}")


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name in STAND_INS or name.split(".")[0] in STAND_INS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


#: the newest vLLM release the pack was read at, and the pure-Python dependencies its
#: selection code imports (compressed-tensors without its own torch requirement)
WHEEL = "vllm==0.33.0"
DEPS = ["pyzmq", "cbor2", "aiohttp", "oss-harmony", "openai", "pillow", "pybase64",
        "cachetools", "msgspec", "blake3", "py-cpuinfo", "psutil", "regex", "sentencepiece",
        "partial-json-parser", "pydantic", "prometheus_client", "ijson", "setproctitle",
        "python-json-logger", "cloudpickle", "einops"]
NO_DEPS = ["compressed-tensors==0.17.0"]


def setup(cache: Path) -> None:
    """Once: vLLM's wheel unpacked without its compiled extensions into ``cache/src`` and
    its pure-Python dependencies into ``cache/deps`` (never torch: the test's own CPU torch
    serves). ``make vllm-oracle`` runs this."""
    pip = [sys.executable, "-m", "pip"]
    if not (cache / "src" / "vllm" / "__init__.py").is_file():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([*pip, "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                            "-d", tmp, WHEEL], check=True, timeout=1800)
            (wheel,) = Path(tmp).glob("vllm-*.whl")
            with zipfile.ZipFile(wheel) as z:
                members = [m for m in z.namelist()
                           if m.startswith("vllm/") and not m.endswith(".so")]
                z.extractall(cache / "src.part", members)
        (cache / "src.part").rename(cache / "src")
    if not (cache / "deps" / ".complete").is_file():
        subprocess.run([*pip, "install", "--quiet", "--target", str(cache / "deps"), *DEPS],
                       check=True, timeout=1800)
        subprocess.run([*pip, "install", "--quiet", "--no-deps", "--target",
                        str(cache / "deps"), *NO_DEPS], check=True, timeout=1800)
        (cache / "deps" / ".complete").write_text(WHEEL + "\n")


def ffn_widths(src: Path) -> None:
    """vLLM's own ``_ffn_mult_to_intermediate_size`` (and the ``_find_multiple`` it calls)
    from vllm/model_executor/models/nemotron_nas.py, on each ``{"ffn_mult", "hidden"}`` case:
    the two functions are pure Python, so they are taken from the module's syntax tree and
    run alone (the module's imports need a GPU build); prints one JSON answer per case."""
    import ast

    path = src / "vllm" / "model_executor" / "models" / "nemotron_nas.py"
    tree = ast.parse(path.read_text(), str(path))
    wanted = {"_ffn_mult_to_intermediate_size", "_find_multiple"}
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {n.name for n in body} == wanted, f"{path} no longer defines {sorted(wanted)}"
    scope: dict = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), scope)
    for case in json.load(sys.stdin):
        width = scope["_ffn_mult_to_intermediate_size"](case["ffn_mult"], case["hidden"])
        print(json.dumps({**case, "width": width}), flush=True)


def main() -> None:
    if sys.argv[1] == "--setup":
        setup(Path(sys.argv[2]))
        return
    if sys.argv[1] == "--ffn-widths":
        ffn_widths(Path(sys.argv[2]))
        return
    src, deps, cap = sys.argv[1], sys.argv[2], sys.argv[3]
    import torch  # the test environment's own CPU torch, before vLLM's path goes in

    sys.path.insert(0, src)
    sys.path.append(deps)
    sys.meta_path.insert(0, _StandIns())
    import humming.config  # the stand-in: its GemmType is the one value vLLM compares
    humming.config.GemmType = HUMMING_GEMM_TYPE
    for op, needs in COMPILED_QUERIES.items():  # what vllm._C registers, by capability
        setattr(torch.ops._C, op, lambda capability, needs=needs: capability >= needs)
    import vllm.platforms as platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    capability = DeviceCapability(*map(int, cap.split(".")))

    class StandInGPU(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return capability

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"stand-in sm{capability.to_int()}"

    platforms._current_platform = StandInGPU()
    from vllm.model_executor.kernels.linear import choose_mp_linear_kernel
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import (
        MPLinearLayerConfig,
    )
    from vllm.model_executor.layers.quantization.utils.marlin_utils import (
        check_marlin_supported,
        check_marlin_supports_layer,
        marlin_padded_nk,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import pad_vocab_size
    from vllm.scalar_type import scalar_types
    from vllm.v1.attention.selector import AttentionSelectorConfig

    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16}

    def attention(case: dict) -> dict:
        cfg = AttentionSelectorConfig(head_size=case["head_dim"], dtype=dtypes[case["dtype"]],
                                      kv_cache_dtype="auto", block_size=None)
        valid, _ = StandInGPU.get_valid_backends(capability, cfg, num_heads=32)
        best = min(valid, key=lambda c: c.priority).backend.name if valid else None
        return {"kernel": best, "refused": best is None}

    def linear(case: dict) -> dict:
        awq = case["quant"] == "awq"
        k, n, g = case["shard_in"], case["shard_out"], case["group"]
        if awq:  # AutoAWQConfig.get_quant_method on CUDA
            layer = types.SimpleNamespace(input_size=case["in"], output_size=case["out"],
                                          input_size_per_partition=k,
                                          output_size_per_partition=n)
            marlin = check_marlin_supported(scalar_types.uint4, g, True)
            if not marlin or not check_marlin_supports_layer(layer, g, allow_tile_padding=True):
                gs = case["in"] if g == -1 else g  # AutoAWQLinearMethod: create_weights checks
                ok = k % gs == 0 and n % 8 == 0
                return {"kernel": "AutoAWQLinearMethod" if ok else None, "refused": not ok}
        if not awq:  # GPTQ and compressed-tensors WNA16: their own create_weights
            return wna16(case)
        config = MPLinearLayerConfig(
            full_weight_shape=(case["in"], case["out"]), partition_weight_shape=(k, n),
            weight_type=scalar_types.uint4, act_type=dtypes[case["dtype"]], group_size=g,
            zero_points=True)
        try:
            kernel = choose_mp_linear_kernel(config, capability.to_int()).__name__
        except ValueError:
            return {"kernel": None, "refused": True}
        padded = marlin_padded_nk(n, k, g) != (n, k) if kernel == "MarlinLinearKernel" else False
        return {"kernel": kernel, "refused": False, "tile_padded": padded}

    def vocab(case: dict) -> dict:
        padded = pad_vocab_size(case["vocab"])
        return {"padded": padded, "refused": padded % case["tp"] != 0}

    wna16 = wna16_answers(torch, dtypes, marlin_padded_nk)
    w8a8 = scaled_mm_answers(torch, dtypes)
    moe = moe_answers(torch, dtypes)
    answer = {"attention": attention, "linear": linear, "vocab": vocab, "w8a8": w8a8,
              "moe": moe}
    for case in json.load(sys.stdin):
        print(json.dumps({**case, **answer[case["kind"]](case)}), flush=True)


def wna16_config(quant: str, group: int, act_order: bool) -> dict:
    """A 4-bit symmetric weight-only checkpoint's ``quantization_config``: GPTQ (``desc_act``)
    or llm-compressor's compressed-tensors ``pack-quantized`` (``actorder: group``)."""
    if quant == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order,
                "sym": True}
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "dynamic": False,
               "strategy": "group" if group > 0 else "channel",
               "group_size": group if group > 0 else None,
               "actorder": "group" if act_order else None}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
            "ignore": ["lm_head"]}


def wna16_answers(torch, dtypes: dict, marlin_padded_nk):
    """GPTQ and compressed-tensors W4A16 linears as vLLM builds them: the config as parsed
    (``AutoGPTQConfig`` refuses group activation ordering in ``normalize_and_validate_gptq_
    desc_act``, ``CompressedTensorsConfig`` its ``actorder: group``), then the layer's own
    ``create_weights`` for the rank's shard (``AutoGPTQLinearMethod``: ``choose_mp_linear_kernel``
    and ``in_per_rank // group`` scale rows; ``CompressedTensorsWNA16``: the same kernel choice,
    then ``verify_group_size_divides_partition``). Answers the kernel and the scale rows vLLM
    allocated per rank: where they do not cover the rank's inputs exactly, the loader narrows
    the file's scales to them and the layer computes wrong outputs (the test calls that
    refused)."""
    import vllm.distributed.parallel_state as parallel_state
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.quantization.auto_gptq import (
        AutoGPTQConfig,
        AutoGPTQLinearMethod,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    class Linear(torch.nn.Module):
        """What compressed-tensors' ``targets: ["Linear"]`` matches by class name."""

    def answer(case: dict) -> dict:
        k, n, g, tp = case["shard_in"], case["shard_out"], case["group"], case["tp"]
        dtype = dtypes[case["dtype"]]
        config = wna16_config(case["quant"], g, case.get("act_order", False))
        parallel_state._TP = types.SimpleNamespace(rank_in_group=0, world_size=tp)
        layer = Linear()
        try:
            with set_current_vllm_config(VllmConfig()):
                if case["quant"] == "gptq":
                    method = AutoGPTQLinearMethod(AutoGPTQConfig.from_config(config))
                    method.input_dtype = None
                    method.create_weights(layer, k, [n], case["in"], case["out"], dtype,
                                          weight_loader=lambda *a: None)
                    rows = layer.scales.shape[0]
                else:
                    scheme = CompressedTensorsConfig.from_config(config).get_scheme(
                        layer, "model.layers.0.mlp.down_proj")
                    scheme.create_weights(layer, output_size=case["out"],
                                          input_size=case["in"], output_partition_sizes=[n],
                                          input_size_per_partition=k, params_dtype=dtype,
                                          weight_loader=lambda *a: None)
                    method = scheme
                    rows = layer.weight_scale.shape[1]
        except (ValueError, AssertionError) as e:
            return {"kernel": None, "refused": True, "why": f"{type(e).__name__}: {e}"[:300]}
        kernel = type(method.kernel).__name__
        padded = marlin_padded_nk(n, k, g) != (n, k) if kernel == "MarlinLinearKernel" else False
        return {"kernel": kernel, "refused": False, "tile_padded": padded, "scale_rows": rows}

    return answer


def scaled_mm_answers(torch, dtypes: dict):
    """The W8A8/W8A16 answer: the quantization method vLLM builds for the checkpoint's config
    (``CompressedTensorsConfig.get_scheme``, or ``Fp8LinearMethod``) creates the layer's
    weights for its TP shard (``create_weights``: ``validate_fp8_block_shape``, then
    ``init_fp8_linear_kernel``/``init_wfp8_a16_linear_kernel``/``init_int8_linear_kernel``,
    i.e. ``choose_scaled_mm_linear_kernel`` over every kernel's ``is_supported`` and
    ``can_implement``), processes them as after loading (where CUTLASS FP8 pads K and N to 16
    and Humming views the weight as int32), and, for INT8, runs one forward through the
    chosen kernel so that ``ops.cutlass_scaled_mm`` routes it (CUTLASS, or Triton where the
    weight is not 16-aligned; ``cutlass_scaled_mm_azp`` asserts 16-alignment). Stood in: the
    TP group (a world size, rank 0), the model config's dtype, and the GEMM and
    quantization ops themselves (each records that it ran)."""
    import vllm.distributed.parallel_state as parallel_state
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.quantization.compressed_tensors import triton_scaled_mm
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod

    ran: list[str] = []

    def gemm(name: str):
        def run(*args, **kwargs):
            ran.append(name)
        return run

    for op in ("cutlass_scaled_mm", "cutlass_scaled_mm_azp", "static_scaled_int8_quant",
               "dynamic_scaled_int8_quant"):
        setattr(torch.ops._C, op, gemm(op))

    def triton(a, b, scale_a, scale_b, out_dtype, bias=None, *args, **kwargs):
        ran.append("triton_scaled_mm")
        return torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype)

    triton_scaled_mm.triton_scaled_mm = triton

    class Linear(torch.nn.Module):
        """What compressed-tensors' ``targets: ["Linear"]`` matches by class name."""

    def method(scheme: str, layer: torch.nn.Module, name: str):
        config = quant_config(scheme)
        if config["quant_method"] == "fp8":
            return Fp8LinearMethod(Fp8Config.from_config(config))
        return CompressedTensorsConfig.from_config(config).get_scheme(layer, name)

    def answer(case: dict) -> dict:
        tp, hidden, width = case["tp"], case["hidden"], case["width"]
        if case["use"] == "gate_up_proj":  # MergedColumnParallelLinear: N split, gate + up
            dims = dict(input_size=hidden, input_size_per_partition=hidden,
                        output_partition_sizes=[width // tp] * 2, output_size=2 * width)
        else:  # down_proj, RowParallelLinear: K split
            dims = dict(input_size=width, input_size_per_partition=width // tp,
                        output_partition_sizes=[hidden], output_size=hidden)
        parallel_state._TP = types.SimpleNamespace(rank_in_group=0, world_size=tp)
        vllm_config = VllmConfig()
        vllm_config.model_config = types.SimpleNamespace(dtype=dtypes[case["dtype"]])
        layer = Linear()  # what LinearBase and its parallel subclasses set on themselves
        for attr, value in dims.items():
            setattr(layer, attr, value)
        layer.output_size_per_partition = sum(dims["output_partition_sizes"])
        layer.tp_size, layer.params_dtype = tp, dtypes[case["dtype"]]
        ran.clear()
        try:
            with set_current_vllm_config(vllm_config):
                quant = method(case["scheme"], layer, f"model.layers.0.mlp.{case['use']}")
                quant.create_weights(layer, params_dtype=dtypes[case["dtype"]],
                                     weight_loader=lambda *a: None, **dims)
                kernel = next(getattr(quant, a) for a in ("fp8_linear", "linear_kernel",
                                                         "kernel") if hasattr(quant, a))
                logical = (dims["input_size_per_partition"],
                           sum(dims["output_partition_sizes"]))
                try:
                    quant.process_weights_after_loading(layer)
                except (ValueError, AttributeError) as e:  # a stand-in reached: a GPU
                    # package's repack (Humming) or a compiled op (Marlin's): loads, as far
                    # as vLLM's Python goes
                    return {"kernel": type(kernel).__name__, "refused": False,
                            "reshaped": None, "stand_in": f"{type(e).__name__}: {e}"[:200]}
                weight = tuple(layer.weight.shape)
                if type(kernel).__name__.endswith("Int8ScaledMMLinearKernel"):
                    x = torch.zeros(2, logical[0], dtype=dtypes[case["dtype"]])
                    kernel.apply_weights(layer, x)
        except (ValueError, RuntimeError, AssertionError, NotImplementedError) as e:
            return {"kernel": None, "refused": True, "why": f"{type(e).__name__}: {e}"[:300]}
        # the processed weight's shape against the shard's (K, N), either way round (what
        # CUTLASS FP8's padding changes; a repacking kernel's layout changes it too)
        return {"kernel": type(kernel).__name__, "refused": False,
                "reshaped": weight not in (logical, logical[::-1]),
                "gemm": next((r for r in ran if "mm" in r), None)}

    return answer


def moe_answers(torch, dtypes: dict):
    """A fused-MoE layer as vLLM builds it: ``FusedMoEParallelConfig.make`` for the TP size
    and expert parallelism (``ep`` ranks: tp x the data-parallel size), ``determine_expert_map``
    on every EP rank, ``FusedMoEConfig`` (whose ``__post_init__`` asserts the TP split), then
    the layer's quantization method: ``select_unquantized_moe_backend`` unquantized, else
    ``AutoGPTQConfig`` / ``AutoAWQConfig.get_quant_method`` for the experts (the Marlin MoE
    route, or ``MoeWNA16Method``, whose ``create_weights`` runs for the rank's shard) and the
    experts class its ``select_wna16_moe_backend`` chose; for FP8, ``Fp8Config`` or
    ``CompressedTensorsConfig.get_quant_method`` (``Fp8MoEMethod``, or compressed-tensors'
    W8A8 FP8 MoE method: ``select_fp8_moe_backend``, the block shape's refinement) and its
    ``create_weights`` (``validate_fp8_block_shape_moe``). Stood in: the TP and DP groups (a
    world size, rank 0) and the parallel config's three fields the MoE layer reads."""
    import vllm.distributed.parallel_state as parallel_state
    from vllm.config import VllmConfig, get_current_vllm_config, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import (
        select_unquantized_moe_backend,
    )
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig
    from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Method
    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config
    from vllm.model_executor.layers.quantization.utils.marlin_utils import (
        marlin_moe_padded_intermediate,
    )

    configs = {
        "gptq": lambda g, act_order=False: AutoGPTQConfig.from_config(
            wna16_config("gptq", g, act_order)),
        "wna16": lambda g, act_order=False: CompressedTensorsConfig.from_config(
            wna16_config("wna16", g, act_order)),
        "awq": lambda g, act_order=False: AutoAWQConfig.from_config(
            {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": True}),
    }
    configs.update({scheme: lambda g, act_order=False, scheme=scheme: fp8_config(scheme)
                    for scheme in SCHEMES if scheme != "ct_fp8_w8a16"})

    def fp8_config(scheme: str):  # FP8 and INT8 W8A8
        config = quant_config(scheme)
        if config["quant_method"] == "fp8":
            return Fp8Config.from_config(config)
        return CompressedTensorsConfig.from_config(config)

    def mxfp4(moe, par, local: list[int], dtype, hidden: int) -> dict:
        """gpt-oss's MXFP4 experts: the backend ``select_mxfp4_moe_backend`` takes and the
        widths ``maybe_roundup_sizes`` gives the layer (vLLM's own zero padding)."""
        # the server's model config stood in by what the selection reads of it: no
        # user override of the MoE activation (--quantization-config)
        get_current_vllm_config().model_config = types.SimpleNamespace(
            quantization_config=None)
        method = GptOssMxfp4Config()._make_moe_method(moe)
        padded_hidden, padded = method.maybe_roundup_sizes(
            hidden, moe.intermediate_size_per_partition, dtype, par)
        return {"refused": False, "kernel": method.experts_cls.__name__,
                "backend": method.mxfp4_backend.name, "padded_shard": padded,
                "padded_hidden": padded_hidden, "local": local, "ep_size": par.ep_size}

    def answer(case: dict) -> dict:
        tp, ep, experts = case["tp"], case["ep"], case["experts"]
        dp = ep // tp if ep > 1 else 1
        parallel_state._TP = types.SimpleNamespace(rank_in_group=0, world_size=tp)
        parallel_state._DP = types.SimpleNamespace(rank_in_group=0, world_size=dp)
        parallel = types.SimpleNamespace(enable_expert_parallel=ep > 1, enable_eplb=False,
                                         all2all_backend="allgather_reducescatter")
        par = FusedMoEParallelConfig.make(tp, 1, dp, 1, parallel)
        local = [determine_expert_map(par.ep_size, r, experts)[0] for r in range(par.ep_size)]
        dtype = dtypes[case["dtype"]]
        try:
            with set_current_vllm_config(VllmConfig()):
                moe = FusedMoEConfig(
                    num_experts=experts, experts_per_token=2, hidden_dim=case["hidden"],
                    intermediate_size=case["width"], num_local_experts=local[0],
                    num_logical_experts=experts,
                    activation=MoEActivation.SWIGLUOAI if case["quant"] == "mxfp4"
                    else MoEActivation.SILU, has_bias=case["quant"] == "mxfp4",
                    device="cuda", routing_method=RoutingMethodType.Renormalize,
                    moe_parallel_config=par, in_dtype=dtype)
                shard = moe.intermediate_size_per_partition
                if case["quant"] == "mxfp4":
                    return mxfp4(moe, par, local, dtype, case["hidden"])
                if case["quant"] == "none":
                    _, cls = select_unquantized_moe_backend(moe)
                    return {"refused": False, "kernel": cls.__name__, "local": local,
                            "ep_size": par.ep_size}
                layer = RoutedExperts.__new__(RoutedExperts)
                torch.nn.Module.__init__(layer)
                layer.moe_config = moe
                layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name = "gate_proj", "up_proj"
                layer.ckpt_down_proj_name = "down_proj"
                config = configs[case["quant"]](case["group"], case.get("act_order", False))
                method = config.get_quant_method(layer, "model.layers.0.mlp.experts")
                wna16 = isinstance(method, MoeWNA16Method)
                method.create_weights(layer, local[0], case["hidden"], shard, dtype,
                                      weight_loader=lambda *a, **k: None)
                kernel = method.experts_cls.__name__
                group = case["group"]
                if "fp8" in case["quant"]:  # Marlin's FP8 group: the block's K, else none
                    group = (getattr(method, "weight_block_size", None) or [-1, -1])[1]
                padded = (not wna16 and "Marlin" in kernel
                          and marlin_moe_padded_intermediate(shard, group) != shard)
        except (AssertionError, ValueError, NotImplementedError, RuntimeError) as e:
            return {"refused": True, "kernel": None, "local": local, "ep_size": par.ep_size,
                    "why": f"{type(e).__name__}: {e}"[:300]}
        return {"refused": False, "kernel": kernel, "wna16": wna16, "tile_padded": padded,
                "local": local, "ep_size": par.ep_size}

    return answer


if __name__ == "__main__":
    main()
