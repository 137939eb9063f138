"""The session decider (vitrine/conversation/followups.py) fitted with scikit-learn: the fit is
the optimum of the objective it names (the gradient of the mean log loss plus the L2 term is zero,
checked by hand), on turns generated from the bundled catalogue's train split; its JSON has the
shipped file's form; serving never imports scikit-learn."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the `train` extra (scikit-learn) fits the decider")


@pytest.fixture(scope="module")
def turns():
    from vitrine.evals import sessions as S

    train = S.Catalogue.load("train")
    return S.turn_matrix(train, S.generate_turns(train, refine_templates=S.REFINE_TRAIN,
                                                 new_templates=S.NEW_TRAIN, n=600, seed=0))


def test_fit_is_the_regularised_log_loss_optimum(turns):
    from vitrine.conversation.followups import Decider

    X, y = turns
    assert 0 < y.mean() < 1
    l2 = 1e-3
    dec = Decider.fit(X, y, l2=l2)
    p = 1.0 / (1.0 + np.exp(-(X @ dec.w + dec.bias)))
    grad_w = X.T @ (p - y) / len(y) + l2 * dec.w  # by hand: d/dw of mean log loss + l2/2 |w|^2
    grad_b = float((p - y).mean())
    assert np.abs(grad_w).max() < 1e-5 and abs(grad_b) < 1e-5

    def objective(w: np.ndarray, b: float) -> float:
        z = X @ w + b
        return float(np.mean(np.logaddexp(0, z) - y * z) + l2 / 2 * w @ w)

    rng = np.random.default_rng(0)  # no nearby point does better
    best = objective(dec.w, dec.bias)
    for _ in range(50):
        assert objective(dec.w + rng.normal(0, 1e-2, dec.w.shape), dec.bias + rng.normal(0, 1e-2)) >= best - 1e-12
    # it separates the generated turns as a decider should
    assert float(((p >= 0.5) == (y == 1)).mean()) > 0.9


def test_fitted_json_has_the_shipped_form(turns, tmp_path):
    from vitrine.conversation.followups import DECIDER_PATH, Decider

    X, y = turns
    dec = Decider.fit(X, y, meta={"trained_on": "test"})
    shipped = json.loads(DECIDER_PATH.read_text(encoding="utf-8"))
    got = dec.to_json()
    assert got["kind"] == shipped["kind"] and got["features"] == shipped["features"]
    assert set(got["weights"]) == set(shipped["weights"]) and isinstance(got["bias"], float)
    path = tmp_path / "decider.json"
    path.write_text(json.dumps(got), encoding="utf-8")
    again = Decider.load(path)
    row = dict(zip(again.names, X[0]))
    assert again.p_refine(row) == pytest.approx(dec.p_refine(row), abs=1e-5)


def test_serving_does_not_import_sklearn():
    code = ("import sys, vitrine.conversation.followups as f, vitrine.conversation.sessions; "
            "f.decider(str(f.DECIDER_PATH)); print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
