"""The equivalence suite a team runs on its own checkpoint, shipped in the package.

A compressor's repository has no equivalence tests of its own model on day one; this module
is one, collected by pytest from the installed package::

    pytest --pyargs gac_check.testing.model_suite --gac-model build/model --gpu h100 \\
        --gac-dtype float16

For every ``--gac-model`` it repairs the checkpoint to the session's contract into a temporary
directory (the checkpoint itself is never written) and asserts that the repaired model's
logits equal the original's within float32 tolerance: the ``--repair`` the gate proposes is
proven exact on the team's weights, not on gac-check's examples. A model with nothing to
repair is skipped with that reason; no ``--gac-model``, or one that is not a model, fails.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gac_check.errors import BadInput
from gac_check.testing.equivalence import check_checkpoint


def test_the_repair_keeps_every_model_output(gac_models: list[Path], gac_profile: str,
                                             gac_dtype: str | None, tmp_path: Path) -> None:
    if not gac_models:
        pytest.fail("no --gac-model given: the model suite has no checkpoint to check",
                    pytrace=False)
    contract = f"{gac_profile} {gac_dtype or 'in its own dtype'}"
    proved = []
    for i, model in enumerate(gac_models):
        try:
            result = check_checkpoint(model, tmp_path / f"repaired-{i}", gac_profile,
                                      gac_dtype)
        except BadInput as exc:  # not a model, or one the repair refuses: a gate fails
            raise pytest.fail.Exception(str(exc), pytrace=False) from None
        except OSError as exc:  # no such directory: the step that writes it failed upstream
            raise pytest.fail.Exception(f"{exc.filename or model}: {exc.strerror or exc}",
                                        pytrace=False) from None
        if result.repairs:
            proved.append(model)
            print(f"{model}: {result.repairs} sites padded for {contract}; max abs logit "
                  f"error {result.abs_err:.3g}, relative {result.rel_err:.3g}")
    if not proved:
        pytest.skip(f"nothing to repair for {contract}: "
                    f"{', '.join(map(str, gac_models))} already aligned")
