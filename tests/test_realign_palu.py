"""--realign on PaLU's own save: each head group's latent re-truncated from the group's own
factors in the basis PaLU built them in, grouping kept, OUT in PaLU's layout (VT + U.{g},
head_wise_ranks) loaded with PaLU's from_pretrained, aligned and within the budget.

The checkpoint is built as PaLU's default ``--decompose_method whiten`` builds it (per group,
SVD-LLM's whitened factors: tests/compressors.py ``build_palu(scaling=...)``), so the stored
factors are not the weight-space SVD of their product: the weight-space re-truncation (the
product's SVD) is not PaLU's own lower-rank result, and the first test tells the two apart.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests import compressors as C
from tests import helpers

RANKS = (19, 10)  # per group of 2 heads (group 32 x 64): misaligned for float16's 8
GPU = ("--gpu", "gpu", "--dtype", "float16")
Groups = dict[str, tuple[torch.Tensor, torch.Tensor]]


@pytest.fixture(scope="module")
def built(tmp_path_factory, scaling) -> C.Built:
    return C.build_palu(tmp_path_factory.mktemp("palu") / "model", RANKS, scaling=scaling)


def groups(root: Path) -> Groups:
    """Each group's (U_g, VT_g) as saved, by site name, sliced by head_wise_ranks."""
    state = load_file(str(root / "model.safetensors"))
    declared = json.loads((root / "config.json").read_text())["head_wise_ranks"]
    out = {}
    for module, ranks in declared.items():
        start = 0
        for g, r in enumerate(ranks):
            out[f"{module}:group{g}"] = (state[f"{module}.U.{g}.weight"].double(),
                                         state[f"{module}.VT.weight"][start:start + r].double())
            start += r
        assert start == state[f"{module}.VT.weight"].shape[0]
    return out


def best(product: torch.Tensor, rank: int) -> torch.Tensor:
    """Eckart-Young from first principles: the full SVD of the product, truncated."""
    u, s, vh = torch.linalg.svd(product, full_matrices=False)
    return (u[:, :rank] * s[:rank]) @ vh[:rank]


def realign(built: C.Built, out: Path, *args: str) -> dict:
    return helpers.realign_json(built.path, out, *GPU, *args)


@pytest.fixture(scope="module")
def scaling() -> dict[int, torch.Tensor]:
    return C.whitening([helpers.LLAMA["hidden_size"]])


def palus_own(module: str, group: int, rank: int, scaling: dict[int, torch.Tensor]
              ) -> torch.Tensor:
    """PaLU's own rank-``rank`` whitened result for one group, from the dense weights the test
    model was built from (``from_linear_whiten`` at that rank, as :func:`C.whitened` does)."""
    w = C.tiny_llama(8).get_submodule(module).weight.data
    rows = w.shape[0] // len(RANKS)
    left, right = C.whitened(w[group * rows:(group + 1) * rows], rank, scaling[w.shape[1]])
    return left.double() @ right.double()


def test_retruncation_is_palus_own_lower_rank_result(built, scaling, tmp_path):
    """A group whose rank went down holds PaLU's own whitened rank-r' factors of the dense
    group (its whitening matrix is not saved; the stored components are its singular vectors,
    so none is needed), not the weight-space best approximation of the stored product; one
    that went up holds the input's own factors, zero-padded, bit for bit."""
    doc = realign(built, tmp_path / "out")
    ranks = helpers.plan_ranks(doc)
    src, out = groups(built.path), groups(tmp_path / "out")
    assert set(out) == set(src) == set(ranks)
    assert {ranks[g] < u.shape[1] for g, (u, _) in src.items()} == {True, False}, ranks
    for name, (u, vt) in src.items():
        new_u, new_vt = out[name]
        rank = ranks[name]
        assert new_u.shape == (u.shape[0], rank) and new_vt.shape == (rank, vt.shape[1])
        if rank >= u.shape[1]:
            r = u.shape[1]
            assert torch.equal(new_u[:, :r], u) and torch.equal(new_vt[:r], vt), name
            assert not new_u[:, r:].any() and not new_vt[r:].any(), name
            continue
        module, _, group = name.rpartition(":group")
        want = palus_own(module, int(group), rank, scaling)
        torch.testing.assert_close(new_u @ new_vt, want, rtol=0, atol=1e-4)
        weight_space = best(u @ vt, rank)  # another cut: closer to the product in weight
        assert (new_u @ new_vt - u @ vt).norm() > (weight_space - u @ vt).norm() * 1.01, name
    assert any("the basis PaLU built it in" in n for n in doc["notes"])


def test_rotated_factors_are_re_truncated_in_weight_space(built, tmp_path):
    """One group whose U_g columns are not orthogonal (a rotation folded into U_g and VT_g, as
    PaLU's fused_hadamard_matrix does: the product unchanged) has no stored singular vectors;
    every group is then cut as the best approximation of its own product, and the output
    says why."""
    src = tmp_path / "rotated"
    src.mkdir()
    for f in built.path.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    state = load_file(str(src / "model.safetensors"))
    module = "model.layers.0.self_attn.k_proj"
    r = RANKS[0]
    q, _ = torch.linalg.qr(torch.randn(r, r, generator=torch.Generator().manual_seed(1),
                                       dtype=torch.float64))
    state[f"{module}.U.0.weight"] = (state[f"{module}.U.0.weight"].double() @ q).float()
    vt = state[f"{module}.VT.weight"].clone()
    vt[:r] = (q.T @ vt[:r].double()).float()
    state[f"{module}.VT.weight"] = vt
    save_file(state, str(src / "model.safetensors"), metadata={"format": "pt"})
    doc = helpers.realign_json(src, tmp_path / "out", *GPU)
    ranks = helpers.plan_ranks(doc)
    out = groups(tmp_path / "out")
    down = 0
    for name, (u, vt) in groups(src).items():
        if ranks[name] < u.shape[1]:
            down += 1
            new_u, new_vt = out[name]
            torch.testing.assert_close(new_u @ new_vt, best(u @ vt, ranks[name]), rtol=0,
                                       atol=1e-5)
    assert down
    assert any(f"{module}.U.0.weight: columns not orthogonal" in n and "weight space" in n
               for n in doc["notes"]), doc["notes"]


def reference(built: C.Built, ranks: dict[str, int]) -> torch.nn.Module:
    """The dense Llama the input was compressed from, every K/V projection replaced by its
    groups' products re-truncated here (the leading r' stored components of each, or the
    product itself where the rank went up): what OUT must compute."""
    dense = C.tiny_llama(8)
    for module, per in _by_module(groups(built.path)).items():
        rows = [u[:, :ranks[name]] @ vt[:ranks[name]] for name, (u, vt) in per]
        dense.get_submodule(module).weight.data = torch.cat(rows).float()
    return dense.eval()


def _by_module(gs: Groups) -> dict[str, list[tuple[str, tuple[torch.Tensor, torch.Tensor]]]]:
    out: dict[str, list] = {}
    for name, pair in gs.items():
        out.setdefault(name.rpartition(":group")[0], []).append((name, pair))
    return out


def test_out_loads_in_palus_loader_and_rechecks_aligned_within_budget(built, tmp_path):
    before = helpers.tree_digest(built.path)
    out = tmp_path / "out"
    doc = realign(built, out)
    assert helpers.tree_digest(built.path) == before
    ranks = helpers.plan_ranks(doc)
    model = C.load_palu(out)  # import palu.model; AutoModelForCausalLM.from_pretrained(OUT)
    for module, per in _by_module(groups(out)).items():
        assert model.get_submodule(module).ranks == [ranks[name] for name, _ in per]
    err = C.max_relative_error(C.logits(reference(built, ranks), 96), C.logits(model, 96))
    assert err <= 1e-4, err
    plan = doc["plan"]
    assert plan["total_params"] <= doc["old_params"] == plan["budget"]
    recheck = helpers.gac(out, *GPU, "--format", "json")
    assert recheck.returncode == 0, recheck.stdout
    latents = [s for s in json.loads(recheck.stdout)["sites"] if s["role"] == "kv_latent"]
    assert len(latents) == len(ranks) and all(s["value"] % 8 == 0 for s in latents)
    assert sum(s["value"] * 96 for s in latents) <= plan["budget"]
    saved = json.loads((out / "gac-realign.json").read_text())
    assert {m["module"]: m["after"] for m in saved["matrices"]} == ranks


def _round_down(ranks: dict[str, int], align: int, scale: float = 1.0) -> dict[str, int]:
    return {g: max(align, int(r * scale) // align * align) for g, r in ranks.items()}


def sigma(u: torch.Tensor) -> torch.Tensor:
    """Each stored component's value, ||U_g[:, i]||^2 (whitened for this model), descending."""
    return u.square().sum(0).sort(descending=True).values


def kept(gs: Groups) -> float:
    """The whitened energy each group's factors keep: the sum of their sigma_i^2."""
    return sum(float(sigma(u).square().sum()) for u, _ in gs.values())


@pytest.mark.parametrize("budget", ["same", "0.5"])
def test_knapsack_keeps_at_least_rounding_down(built, tmp_path, budget):
    """The whitened energy OUT keeps is at least that of rounding every r_g down to the
    alignment (scaled down uniformly first where the budget is below the input's), each
    rounded group keeping its leading components."""
    doc = realign(built, tmp_path / "out", "--budget", budget)
    plan = doc["plan"]
    src = groups(built.path)
    size = {g: u.shape[0] + vt.shape[1] for g, (u, vt) in src.items()}
    old = {g: u.shape[1] for g, (u, _) in src.items()}
    scale = next(s / 100 for s in range(100, 0, -1)
                 if sum(r * size[g] for g, r in _round_down(old, 8, s / 100).items())
                 <= plan["budget"])
    rounded = _round_down(old, 8, scale)
    baseline = sum(float(sigma(u)[:rounded[g]].square().sum()) for g, (u, _) in src.items())
    got = kept(groups(tmp_path / "out"))
    assert got >= baseline * (1 - 1e-9), (got, baseline)
    assert plan["total_params"] <= plan["budget"]
    assert got > baseline * 1.001, (got, baseline)  # the budget rounding wastes is spent


@pytest.mark.parametrize("budget", ["same", "0.5"])
def test_knapsack_keeps_the_most_energy(built, tmp_path, budget):
    """OUT keeps as much of the groups' whitened energy as the best plan HiGHS finds from the
    stored components' values computed here (||U_g[:, i]||^2), over every aligned rank up to
    the next one above each r_g: the objective is PaLU's own, no choice left off."""
    from gac_check.ranks.knapsack import Matrix
    from gac_check.testing.knapsack import solve_milp

    doc = realign(built, tmp_path / "out", "--budget", budget)
    mats, menus = [], {}
    for name, (u, vt) in groups(built.path).items():
        mats.append(Matrix(name, u.shape[0], vt.shape[1], sv=sigma(u).numpy()))
        menus[name] = list(range(8, -(-u.shape[1] // 8) * 8 + 1, 8))
    best_plan = solve_milp(mats, doc["plan"]["budget"], 8, menus, allow_dense=False)
    optimum = sum(float((m.sv[: best_plan.ranks[m.name]] ** 2).sum()) for m in mats)
    assert kept(groups(tmp_path / "out")) == pytest.approx(optimum, rel=1e-6)


def test_summary_names_each_group(built, tmp_path):
    run = helpers.gac(built.path, "--realign", tmp_path / "out", *GPU)
    assert run.returncode == 0, run.stderr
    assert "PaLU's own truncation loss in the basis it built each group in" in run.stdout
    assert "model.layers.0.self_attn.k_proj:group0: rank 19 -> " in run.stdout
    assert "the knapsack's choice among the ranks aligned" in run.stdout
    assert "--decompose_method whiten" in run.stdout


def test_calib_without_base_is_refused(built, tmp_path):
    """--calib feeds the dense model's activations: without --base it is a usage error, said
    before anything is read (for PaLU, --base and --calib only measure the plans:
    test_realign_base_measured.py)."""
    run = helpers.gac(built.path, "--realign", tmp_path / "out", "--calib",
                      built.path / "config.json", *GPU)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "--calib needs --base" in run.stderr
    assert not (tmp_path / "out").exists()


def test_head_wise_ranks_that_contradict_the_tensors_are_refused(built, tmp_path):
    src = tmp_path / "lying"
    src.mkdir()
    for f in built.path.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    config = json.loads((src / "config.json").read_text())
    config["head_wise_ranks"]["model.layers.1.self_attn.v_proj"] = [16, 13]
    (src / "config.json").write_text(json.dumps(config))
    run = helpers.gac(src, "--realign", tmp_path / "out", *GPU)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "model.layers.1.self_attn.v_proj: head_wise_ranks says 16, tensors have 19" \
        in run.stderr
    assert not (tmp_path / "out").exists()


def test_palu_config_without_group_latents_is_refused(tmp_path):
    """head_wise_ranks in config.json but plain k/v weights: nothing to re-select, said in one
    line (not a solver's error on no matrices)."""
    root = tmp_path / "model"
    C.tiny_llama(8).save_pretrained(root)
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps(config | {"head_wise_ranks": {}}))
    run = helpers.gac(root, "--realign", tmp_path / "out", *GPU)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "has no group latents" in run.stderr
    assert not (tmp_path / "out").exists()
