"""vLLM's own selection code, run on a CPU: the oracle of tests/test_targets_vllm_oracle.py.

Run as a program (``python tests/vllm_oracle.py SRC DEPS CAP < cases.json``; ``--setup
CACHE`` fills the cache once) so that vLLM's
modules never enter the test process. SRC is vLLM's release wheel unpacked without its
compiled extensions, DEPS its pure-Python dependencies (``make vllm-oracle`` caches both).
What a CPU cannot provide is stood in for, here and nowhere in vLLM's code: the compiled
extension modules (``vllm._C*``, FlashAttention's ``_vllm_fa2_C``/``_vllm_fa3_C``), the GPU
packages vLLM depends on (flashinfer, humming: present in every vLLM install) and a handful of
server-side imports the selection code never calls, and a platform that reports compute
capability CAP (8.0 or 9.0). Then vLLM's own code answers: ``CudaPlatformBase.get_valid_backends``
for the attention backend (``validate_configuration`` of each backend), the AWQ route
(``check_marlin_supports_layer``, then ``choose_mp_linear_kernel``; a layer it sends to
``AutoAWQLinearMethod`` is checked as ``BaseAWQLinearMethod.create_weights`` checks it),
``choose_mp_linear_kernel`` with every WNA16 kernel's ``can_implement`` for GPTQ,
``marlin_padded_nk`` for Marlin's tile padding and ``pad_vocab_size`` for the vocabulary.
Prints one JSON answer per case.
"""
from __future__ import annotations

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
    "triton_kernels.matmul",
}


#: the capability queries vllm._C registers as torch ops (csrc/quantization/w8a8/cutlass):
#: FP8 from sm89, block FP8 from sm90, FP4 from sm100
COMPILED_QUERIES = {"cutlass_scaled_mm_supports_fp8": 89,
                    "cutlass_scaled_mm_supports_block_fp8": 90,
                    "cutlass_scaled_mm_supports_fp4": 100}


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


def main() -> None:
    if sys.argv[1] == "--setup":
        setup(Path(sys.argv[2]))
        return
    src, deps, cap = sys.argv[1], sys.argv[2], sys.argv[3]
    import torch  # the test environment's own CPU torch, before vLLM's path goes in

    sys.path.insert(0, src)
    sys.path.append(deps)
    sys.meta_path.insert(0, _StandIns())
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
        config = MPLinearLayerConfig(
            full_weight_shape=(case["in"], case["out"]), partition_weight_shape=(k, n),
            weight_type=scalar_types.uint4 if awq else scalar_types.uint4b8,
            act_type=dtypes[case["dtype"]], group_size=g, zero_points=awq)
        try:
            kernel = choose_mp_linear_kernel(config, capability.to_int()).__name__
        except ValueError:
            return {"kernel": None, "refused": True}
        padded = marlin_padded_nk(n, k, g) != (n, k) if kernel == "MarlinLinearKernel" else False
        return {"kernel": kernel, "refused": False, "tile_padded": padded}

    def vocab(case: dict) -> dict:
        padded = pad_vocab_size(case["vocab"])
        return {"padded": padded, "refused": padded % case["tp"] != 0}

    answer = {"attention": attention, "linear": linear, "vocab": vocab}
    for case in json.load(sys.stdin):
        print(json.dumps({**case, **answer[case["kind"]](case)}), flush=True)


if __name__ == "__main__":
    main()
