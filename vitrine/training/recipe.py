"""Training recipes: every setting of one training run of a model, typed, and saved as JSON
(``recipe.json``) beside the weights it produced, as the towers' model configs are.

:class:`GateRecipe` is the aligner's (the MoE gate, or the MLP / linear heads): its defaults are
the shipped gate's recipe (vitrine/encoders/weights/moe/recipe.json, docs/models.md), and
``vitrine train gate``'s options override its fields. Fields left ``None`` depend on others
(the hidden width on the kind; the schedule on whether it trains on the bundled catalogue or on
an ingested one, ``--data``): :meth:`GateRecipe.resolved` fills them, and what is saved is the
resolved recipe, the parameters that actually trained the weights.

:class:`IntentRecipe` is the intent classifier's (``vitrine train intent``; its defaults are the
training defaults, saved beside the weights a run writes).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from vitrine.atomic import atomic_write_text
from vitrine.errors import InvalidInput
from vitrine.intent.model import DEFAULT_CONFIG

RECIPE_FILE = "recipe.json"

#: Augmented photo views the adapters train on by default (vitrine/encoders/images.py:
#: augment_view): a mirrored photo, five seeded crops and, for half of the photos, the degraded
#: views (grayscale, 32 px, inverted, a tight crop), one of them in place of the photo for 70% of
#: the rows of a batch. Chosen on the val split (docs/models.md).
DEFAULT_VIEWS: tuple[str, ...] = ("flip", "crop1", "crop2", "crop3", "crop4", "crop5", "gray", "tiny", "invert", "tight1")

#: The MoE gate's hidden width (the best on val in the seed study; docs/models.md); the MLP and
#: linear heads' is 512.
DEFAULT_MOE_HIDDEN = 1024
KINDS = ("linear", "mlp", "moe")


@dataclass(frozen=True)
class GateRecipe:
    """One aligner training run. Bundled-catalogue runs (``vitrine train gate``) use every field;
    ``--data`` runs (an ingested catalogue) use the architecture's ``dim``, ``hidden`` and
    ``overrides`` (the MoE's other fields stay the adapter's defaults), the schedule and ``init``."""

    kind: str = "moe"
    model: str | None = None  # tower config (None: the configured one)
    source: str | None = None  # catalogue folder (None: the bundled one)
    epochs: int | None = None  # None: 40 (bundled), 12 (--data)
    batch_size: int = 1024
    lr: float | None = None  # None: 2e-3; --data fine-tuning the served aligner: 5e-4
    dim: int = 256
    hidden: int | None = None  # None: DEFAULT_MOE_HIDDEN for the MoE, 512 otherwise
    experts: int = 16
    top_k: int = 4
    dynamic_k: bool = False
    balance_weight: float = 0.05
    balance: str = "bias"
    bias_rate: float = 0.01
    queries: bool = True  # attribute pseudo-queries (MoE and MLP)
    seed: int = 0
    patience: int | None = None  # None: as many as the epochs (bundled), 4 (--data)
    name: str | None = None
    ema: float = 0.0
    views: tuple[str, ...] = DEFAULT_VIEWS
    view_prob: float = 0.7
    degraded_share: float = 0.5
    overrides: dict[str, Any] = field(default_factory=dict)  # adapter config values (--set)
    gumbel_tau: float = 0.0
    route_kl: float = 0.0
    lora: str | None = None  # text, image, both: LoRA deltas of the towers trained jointly
    lora_rank: int = 8
    lora_text_layers: tuple[int, ...] | None = (4, 5)  # None: every layer
    lora_lr_scale: float = 0.25
    train_limit: int | None = None
    init: str = "auto"  # --data only: fresh, live (fine-tune the served aligner), auto

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidInput(f"kind must be one of {KINDS}, not {self.kind!r}")
        if self.lora is not None and self.kind != "moe":
            raise InvalidInput("tower LoRA trains with the MoE gate only")

    def resolved(self, *, data: bool = False) -> GateRecipe:
        """The recipe with its defaults that depend on other fields filled (``data``: a ``--data``
        run's schedule). ``lr`` stays None for a ``--data`` run: it depends on the resolved init."""
        epochs = self.epochs if self.epochs is not None else (12 if data else 40)
        return replace(
            self, epochs=epochs,
            patience=self.patience if self.patience is not None else (4 if data else epochs),
            lr=self.lr if self.lr is not None or data else 2e-3,
            hidden=self.hidden if self.hidden is not None else (DEFAULT_MOE_HIDDEN if self.kind == "moe" else 512))



@dataclass(frozen=True)
class IntentRecipe:
    """One intent classifier training run (vitrine/training/intent.py): the schedule, the
    regularisation (the settings ``--set`` may override), the generated queries' sizes, the
    ensemble, the architecture config and the checkpoint it starts from (None: from scratch)."""

    epochs: int = 6
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup: float = 0.06
    token_dropout: float = 0.2
    label_smoothing: float = 0.05
    distill_weight: float = 1.0
    train_per_label: int = 4000
    test_per_label: int = 400
    val_per_label: int = 400
    members: int = 5
    seed: int = 0
    config: str = DEFAULT_CONFIG
    init_from: str | None = None


Recipe = GateRecipe | IntentRecipe


def recipe_json(recipe: Recipe) -> dict[str, Any]:
    """A recipe as JSON values (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(recipe).items()}


def save_recipe(folder: Path, recipe: Recipe) -> Path:
    """Write ``recipe`` as ``folder/recipe.json``."""
    path = Path(folder) / RECIPE_FILE
    atomic_write_text(path, json.dumps(recipe_json(recipe), indent=2) + "\n")
    return path


def load_recipe(folder: Path, kind: type[Recipe] = GateRecipe) -> Recipe:
    """The recipe of ``kind`` saved beside the weights in ``folder``."""
    path = Path(folder) / RECIPE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InvalidInput(f"no readable training recipe at {path}: {e}") from e
    names = {f.name: f for f in fields(kind)}
    unknown = set(data) - set(names)
    if unknown:
        raise InvalidInput(f"unknown fields {sorted(unknown)} in the training recipe at {path}")
    tuples = {n for n in names if isinstance(getattr(kind(), n), tuple)} | {"lora_text_layers"}
    values: dict[str, Any] = {k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in data.items()}
    return kind(**values)
