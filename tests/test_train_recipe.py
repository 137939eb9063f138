"""The training recipes (vitrine/training/recipe.py): the shipped gate's recipe.json is exactly
what trained it, and ``vitrine train gate``'s defaults are that recipe."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from vitrine.errors import InvalidInput
from vitrine.training.recipe import GateRecipe, IntentRecipe, load_recipe, save_recipe

MOE = Path(__file__).resolve().parents[1] / "vitrine" / "encoders" / "weights" / "moe"


def test_the_shipped_gate_recipe_is_what_trained_it_and_the_cli_defaults() -> None:
    recipe = load_recipe(MOE)
    cfg = json.loads((MOE / "config.json").read_text())
    summary = json.loads((MOE / "train_summary.json").read_text())
    assert recipe == replace(GateRecipe().resolved(), model=cfg["model"])
    trained = cfg["train"]["config"]
    assert (recipe.epochs, recipe.patience, recipe.lr, recipe.batch_size, recipe.seed, recipe.view_prob,
            recipe.ema) == (trained["epochs"], trained["patience"], trained["lr"], trained["batch_size"],
                            trained["seed"], trained["view_prob"], trained["ema_decay"])
    assert (recipe.kind, recipe.dim, recipe.hidden, recipe.experts, recipe.top_k, recipe.balance,
            recipe.balance_weight, recipe.bias_rate, recipe.dynamic_k) == (
        cfg["kind"], cfg["dim"], cfg["hidden"], cfg["experts"], cfg["top_k"], cfg["balance"],
        cfg["balance_weight"], cfg["bias_rate"], cfg["dynamic_k"])
    assert list(recipe.views) == summary["photo_views"] and recipe.degraded_share == summary["degraded_share"]
    assert recipe.queries == (summary["pseudo_queries"] > 0) and recipe.lora is None


def test_recipes_round_trip_and_resolve_by_kind_and_run(tmp_path: Path) -> None:
    r = GateRecipe(kind="mlp", overrides={"dropout": 0.3}, lora_text_layers=None, views=("flip",))
    save_recipe(tmp_path, r)
    assert load_recipe(tmp_path) == r
    assert r.resolved().hidden == 512 and GateRecipe().resolved().hidden == 1024
    data = GateRecipe().resolved(data=True)
    assert (data.epochs, data.patience, data.lr) == (12, 4, None)
    with pytest.raises(InvalidInput):
        GateRecipe(kind="mlp", lora="text")
    save_recipe(tmp_path, IntentRecipe(members=3, init_from="/x"))
    assert load_recipe(tmp_path, IntentRecipe) == IntentRecipe(members=3, init_from="/x")
    (tmp_path / "recipe.json").write_text('{"epochs": 3, "nope": 1}')
    with pytest.raises(InvalidInput, match="nope"):
        load_recipe(tmp_path)


def test_train_gate_options_default_to_the_recipe() -> None:
    """Every option of ``vitrine train gate`` named like a recipe field defaults to that field."""
    from vitrine.cli.train import train_gate

    recipe = GateRecipe()
    checked = 0
    for param in train_gate.params:
        if not hasattr(recipe, param.name or "") or param.name == "overrides":  # --set: parsed KEY=VALUEs
            continue
        want = getattr(recipe, param.name)
        got = False if getattr(param, "is_flag", False) and param.default in (None, False) or \
            type(param.default).__name__ == "Sentinel" else param.default
        if param.name == "views":
            want = ",".join(want)
        elif param.name == "lora_text_layers":
            want = ",".join(map(str, want))
        assert got == want, param.name
        checked += 1
    assert checked >= 25


def test_the_intent_training_defaults_are_the_intent_recipe() -> None:
    from vitrine.training.intent import DEFAULTS, HPARAM_KEYS

    r = IntentRecipe()
    assert DEFAULTS == {k: getattr(r, k) for k in DEFAULTS} and set(HPARAM_KEYS) <= set(DEFAULTS)
    assert (DEFAULTS["epochs"], DEFAULTS["train_per_label"], DEFAULTS["members"]) == (6, 4000, 5)


def test_train_gate_parses_options_into_the_recipe_and_calls_the_training_layer(monkeypatch, tmp_path: Path) -> None:
    """The command only parses: options become recipe fields, then the training layer is called."""
    from click.testing import CliRunner

    from vitrine.cli.app import main
    from vitrine.training import gate, gate_data

    calls: list[tuple[str, GateRecipe, dict]] = []
    monkeypatch.setattr(gate, "train_gate", lambda settings, recipe, out: calls.append(("bundled", recipe, {"out": out}))
                        or {"ok": 1})
    monkeypatch.setattr(gate_data, "train_gate_on_data",
                        lambda settings, recipe, out, install: calls.append(("data", recipe, {"install": install})) or {})
    r = CliRunner().invoke(main, ["train", "gate"])
    assert r.exit_code == 0, r.output
    assert calls[-1][0] == "bundled" and calls[-1][1] == GateRecipe()
    r = CliRunner().invoke(main, ["train", "gate", "--kind", "mlp", "--epochs", "3", "--views", "flip", "--set",
                                  "dropout=0.3", "--lora-text-layers", "all", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert calls[-1][1] == GateRecipe(kind="mlp", epochs=3, views=("flip",), overrides={"dropout": 0.3},
                                      lora_text_layers=None) and calls[-1][2]["out"] == tmp_path
    r = CliRunner().invoke(main, ["train", "gate", "--data", str(tmp_path), "--no-install", "--init", "live"])
    assert r.exit_code == 0, r.output
    assert calls[-1][0] == "data" and calls[-1][1] == GateRecipe(init="live") and not calls[-1][2]["install"]
    r = CliRunner().invoke(main, ["train", "gate", "--kind", "mlp", "--lora", "text"])
    assert r.exit_code != 0 and "MoE gate only" in r.output and len(calls) == 3
