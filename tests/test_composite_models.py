"""Issue 38: composite classes, a language model under ``text_config`` (or at the top level)
with encoder towers beside it (Gemma-3, GOT-OCR2, MOSS-transcribe, Fuyu, GIT, Phi-4
multimodal), read from the class table (gac_check/formats/derive_composite.py,
derived_towers.py).

Each is built tiny by the zoo (gac_check/testing/zoo.py: the text model in the variant, the
towers small and aligned), saved with save_pretrained and checked as a user would: every
tensor read, the variant's misaligned width found on the text model's site under the text
config's key, a tied output head not asked for, each tower's widths judged as the tower's
and never padded; --repair pads the text model under ``text_config`` and its own class loads
OUT strictly with equal logits.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gac_check.api import check
from gac_check.checkpoint.index import open_checkpoint
from gac_check.contract.select import for_hardware
from gac_check.errors import BadInput
from gac_check.formats import derive_composite
from gac_check.formats.derive_table import VARIANTS, _labels
from gac_check.formats.reading import read_sites
from gac_check.padding.plan import plan
from gac_check.sites import Role
from gac_check.testing.zoo import build_tiny
from tests import family_models
from tests.helpers import gac

TYPES = ("gemma3", "got_ocr2", "moss_transcribe_diarize", "fuyu", "git", "phi4_multimodal")
#: where each type's config.json records its text model's widths
TEXT = {"git": (), "phi4_multimodal": ()}


def _built(tmp_path: Path, model_type: str, variant: str) -> Path:
    build_tiny(model_type, variant, tmp_path / model_type)
    return tmp_path / model_type


@pytest.mark.parametrize("model_type", TYPES)
def test_the_text_models_mlp_width_is_found_with_every_tensor_read(tmp_path: Path,
                                                                   model_type: str) -> None:
    result = check(_built(tmp_path, model_type, "mlp173"), gpu="h100", dtype="bfloat16")
    assert result.accounting is not None and not result.accounting.unknown
    mlp = [s for s in result.sites if s.role is Role.INTERMEDIATE and s.value == 173]
    assert {s.layer for s in mlp} == {0, 1}, [s.name for s in result.sites]  # both text layers
    path = TEXT.get(model_type, ("text_config",))
    assert all(s.config_field == (*path, "intermediate_size") for s in mlp), mlp
    assert result.verdict() != "pass"


@pytest.mark.parametrize("model_type", TYPES)
def test_the_text_models_head_dim_20_is_found(tmp_path: Path, model_type: str) -> None:
    result = check(_built(tmp_path, model_type, "hd20"), gpu="h100", dtype="bfloat16")
    assert result.accounting is not None and not result.accounting.unknown
    heads = [s for s in result.sites if s.role is Role.HEAD_DIM and "tower" not in s.attrs]
    assert heads and {s.value for s in heads} == {20}, [(s.name, s.value) for s in heads]


def test_a_tied_head_is_read_from_config_json_and_an_untied_missing_one_refused(
        tmp_path: Path) -> None:
    """Gemma-3 saves no lm_head (tie_word_embeddings): judged; the same tensors under a
    config.json that unties the head are a torn checkpoint its class would not load."""
    path = _built(tmp_path, "gemma3", "aligned")
    assert "language_model.lm_head.weight" not in load_file(path / "model.safetensors")
    assert check(path, gpu="h100", dtype="bfloat16").verdict() == "pass"
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    with pytest.raises(BadInput, match=re.escape("language_model.lm_head.weight is missing")):
        check(path, gpu="h100", dtype="bfloat16")


def _gemma3(tmp_path: Path, **vision: object) -> Path:
    """A tiny Gemma-3, its vision tower's config overridden with ``vision``."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "vocab_size": 512}
    tower = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
             "num_attention_heads": 4, **vision}
    torch.manual_seed(0)
    Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=tower,
                                                 image_token_index=0, boi_token_index=1,
                                                 eoi_token_index=2)).save_pretrained(tmp_path)
    return tmp_path


def test_a_tower_part_its_config_turns_off_is_not_asked_for(tmp_path: Path) -> None:
    """Gemma-3's checkpoints turn SigLIP's pooling head off (``vision_use_head: false``):
    the class builds no head, so none is missing; with the head on, a head torn in half is."""
    path = _gemma3(tmp_path / "off", vision_use_head=False)
    result = check(path, gpu="h100", dtype="bfloat16")
    assert result.accounting is not None and not result.accounting.unknown
    _refused_torn(_gemma3(tmp_path / "on", vision_use_head=True), "vision_tower.head.probe")


def test_a_layer_part_its_config_turns_off_is_not_asked_for(tmp_path: Path) -> None:
    """GOT-OCR2's ViT without relative positions (``use_rel_pos: false``): its layers build
    no rel_pos tables, so none is missing from any layer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from gac_check.testing.zoo import VARIANTS as ZOO
    from gac_check.testing.zoo import _kwargs

    config_cls = type(AutoConfig.for_model("got_ocr2"))
    kwargs = _kwargs(config_cls, ZOO["aligned"], text=True)
    kwargs["vision_config"].use_rel_pos = False
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config_cls(**kwargs)).save_pretrained(tmp_path)
    assert not any("rel_pos" in n for n in load_file(tmp_path / "model.safetensors"))
    result = check(tmp_path, gpu="h100", dtype="bfloat16")
    assert result.accounting is not None and not result.accounting.unknown


def test_a_torn_tower_is_refused(tmp_path: Path) -> None:
    """A tower layer with its MLP deleted is not judged by what is left of it."""
    _refused_torn(_built(tmp_path, "gemma3", "aligned"),
                  "vision_tower.encoder.layers.1.mlp.fc2.weight")


def _refused_torn(path: Path, tensor: str) -> None:
    """``tensor`` deleted from the checkpoint at ``path``: the check refuses, naming it."""
    weights = load_file(path / "model.safetensors")
    del weights[tensor]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BadInput, match=re.escape(f"{tensor} is missing")):
        check(path, gpu="h100", dtype="bfloat16")


def test_a_misaligned_tower_is_a_finding_repair_never_pads(tmp_path: Path) -> None:
    """A vision tower whose MLP is 173 wide: judged on the tower's own site (a GEMM width
    like the text model's) under vision_config's key, and refused by --repair with why. Its
    one layer is not asked for the text model's second (each stack's layers its own)."""
    ckpt = open_checkpoint(_gemma3(tmp_path, intermediate_size=173))
    _, sites, _ = read_sites(ckpt)
    tower = [s for s in sites if s.value == 173]
    assert {s.name for s in tower} == {"vision_tower.encoder.layers.0.mlp:mlp",
                                       "vision_tower.head.mlp:mlp"}  # SigLIP's pooling head
    assert all(s.config_field == ("vision_config", "intermediate_size") for s in tower)
    repair_plan = plan(sites, for_hardware("h100", "bfloat16"), shapes=ckpt.shapes,
                       config=ckpt.config)
    refused = {r.site.name: r.reason for r in repair_plan.refused}
    assert all("encoder tower" in refused[s.name] for s in tower), refused
    assert not any(r.site.value == 173 for r in repair_plan.repairs)


def test_repair_pads_the_text_model_under_text_config_exactly(tmp_path: Path) -> None:
    """The CLI's --repair on Gemma-3 at MLP 173: text_config.intermediate_size is rewritten,
    and Gemma3ForConditionalGeneration loads OUT strictly with equal fp32 logits (the rest
    of the composites in tests/test_repair_derived.py's slow zoo proof)."""
    path = _built(tmp_path, "gemma3", "mlp173")
    run = gac(path, "--gpu", "h100", "--dtype", "bfloat16", "--repair", tmp_path / "out")
    assert run.returncode == 0, run.stdout + run.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["text_config"]["intermediate_size"] == 176
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 64], [4, 4, 100, 8, 0, 17, 3, 127]])
    with torch.no_grad():
        before = family_models.load(path)(input_ids=ids).logits
        after = family_models.load(tmp_path / "out")(input_ids=ids).logits
    assert (after - before).abs().max().item() <= 1e-5  # zero rows add exact zeros


def test_tower_widths_never_alias_a_text_width() -> None:
    """The deriver tells an axis's role by its sizes in two builds: a tower's (hidden, MLP,
    head_dim, ...) must never equal a text label's in both, and no tower head width may be
    one the text model builds (20 or 24), since the text head_dim is told apart by value."""
    text = [_labels({**v, "kv_heads": v["kv_heads"]}) for v in VARIANTS]
    text_pairs = {(text[0][k], text[1][k]) for k in text[0]}
    for index in range(len(derive_composite.TOWER_VARIANTS)):
        a, b = (derive_composite.tower_labels("t", derive_composite.tower_values(index, n))
                for n in (0, 1))
        pairs = [(a[k], b[k]) for k in a]
        assert not set(pairs) & text_pairs and len(set(pairs)) == len(pairs)
        assert all(x != y for x, y in pairs)
        for n in (0, 1):
            assert derive_composite.tower_values(index, n)["head_dim"] not in (20, 24)
