"""``vitrine train intent``: generate queries from the catalogue, train the Qwen2 classifier,
keep the epoch that does best on the validation queries (templates kept out of training, see
vitrine/training/intent_queries.py), measure it on the held-out queries, ship it (config.json + model.safetensors).

Reproducible: the generator, the vocabulary split, the initialisation and the batch order all
follow ``seed``; the shipped weights are what ``vitrine train intent`` writes.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.bundled import bundled_dir
from vitrine.errors import InvalidInput
from vitrine.intent import tokenizer as qtok
from vitrine.intent.classifier import LABELS, IntentClassifier
from vitrine.intent.member import IntentMember
from vitrine.training.intent_queries import (
    GENERATOR_VERSION,
    Example,
    QueryGenerator,
    Terms,
    catalogue_terms,
    make_member_splits,
    make_splits,
    heldout_titles,
    make_val,
    held_out as held_out_value,
    template_overlap,
)
from vitrine.intent.model import (
    DEFAULT_CONFIG,
    DEFAULT_WEIGHTS,
    EOS,
    PAD,
    UNK,
    WEIGHTS_DIR,
    Encoded,
    MEMBERS_DIR,
    IntentModel,
    init_from_pretrained,
    load_arch_config,
)
from vitrine.intent.slots import SlotExtractor
from vitrine.training.intent_metrics import classification_metrics, evaluate, leaf_search_rate, title_search_rate
from vitrine.training.recipe import IntentRecipe, save_recipe

log = logging.getLogger(__name__)

#: The training defaults: :class:`~vitrine.training.recipe.IntentRecipe`'s (less the seed, the
#: architecture config and the checkpoint, which are arguments of train_intent).
DEFAULTS: dict[str, Any] = {k: v for k, v in asdict(IntentRecipe()).items() if k not in ("seed", "config", "init_from")}
# Training settings that ``hparams`` may override (the rest are arguments of train_intent).
# distill_weight: an auxiliary loss (weight) that makes the classifier's pooled state predict the
# MiniLM sentence embedding of each English training query (through a linear map used in training
# only): sentence meaning from a pretrained encoder, for phrasings the templates never had.
PARTS_DIR = "parts"  # members trained by separate processes, before assemble_members ships them
HPARAM_KEYS = ("weight_decay", "warmup", "token_dropout", "label_smoothing", "distill_weight")


def default_source() -> Path:
    """The bundled catalogue (``data/fashion-small`` of this checkout)."""
    return bundled_dir()


def heldout_examples(source: Path | None = None, seed: int = 0, per_label: int = DEFAULTS["test_per_label"],
                     train_per_label: int = DEFAULTS["train_per_label"], members: int = 1,
                     train_seed: int | None = None, dropped: Sequence[str] | None = None,
                     ) -> tuple[list[Example], Terms]:
    """The held-out evaluation queries exactly as training made them (same seed, sizes, members).
    ``dropped``: the held-out texts training recorded as also being training texts (then the
    training draws need not be generated again)."""
    terms = catalogue_terms(source or default_source())
    if dropped is not None:
        gone = set(dropped)
        return [e for e in QueryGenerator(terms, "test", seed).generate(per_label) if e.text not in gone], terms
    _, test = make_splits(terms, train_per_label=train_per_label, test_per_label=per_label, seed=seed,
                          members=members, train_seed=train_seed)
    return test, terms


def length_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of similar length (less padding): shuffle, sort within chunks of 50
    batches by length, cut, shuffle the batches."""
    order = rng.permutation(len(lengths))
    chunk = batch_size * 50
    batches = []
    for c in range(0, len(order), chunk):
        part = order[c:c + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


# -- training -----------------------------------------------------------------------------------------------
def _seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_intent(out: Path | None = None, init_from: Path | None = None, seed: int = 0,
                 epochs: int = DEFAULTS["epochs"], *, source: Path | None = None, cache_dir: Path | None = None,
                 config: str = DEFAULT_CONFIG, train_per_label: int = DEFAULTS["train_per_label"],
                 test_per_label: int = DEFAULTS["test_per_label"], batch_size: int = DEFAULTS["batch_size"],
                 lr: float = DEFAULTS["lr"], val_per_label: int = DEFAULTS["val_per_label"],
                 hparams: dict[str, float] | None = None, heldout: bool = True, threads: int = 1,
                 progress: bool = True, members: int = DEFAULTS["members"],
                 extra_titles: Sequence[str] = (), only: Sequence[int] | None = None) -> dict[str, Any]:
    """Train the intent classifier and write it to ``out`` (default: the shipped weights folder).

    The epoch with the best validation macro-F1 (validation templates never trained on) is kept.
    ``hparams`` overrides the settings in :data:`HPARAM_KEYS`; ``heldout=False`` skips the held-out
    measurement (for tuning on validation only).
    ``members``: an ensemble of that many classifiers, each trained on its own draw of the
    generated queries (one seed each); their probabilities are averaged. One small model trained
    from scratch is confidently wrong on phrasings and product names it never saw, and its
    mistakes change from seed to seed: on validation, one member scored 0.89-0.91, three averaged
    0.912 and five ~0.92 (chosen on validation); held-out catalogue titles read as searches rose
    from ~0.9 (one) to ~0.98 (three).
    ``threads``: torch threads while training (1 by default: as fast for a model this small, the
    same result on any machine, and kind to a shared CPU).
    ``extra_titles``: a catalogue's own product titles, added to the training queries as bare
    searches and as the product inside every intent's templates (see :func:`vitrine.training.intent_tuning.tune_intent`).
    ``only``: train just these members into ``out/parts/<i>`` (several processes can share the
    members of one ensemble); :func:`assemble_members` then measures and ships the ensemble."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        return _train(out, init_from, seed, epochs, source=source, cache_dir=cache_dir, config=config,
                      train_per_label=train_per_label, test_per_label=test_per_label, batch_size=batch_size,
                      lr=lr, val_per_label=val_per_label, hparams=hparams or {}, heldout=heldout,
                      progress=progress, members=members, extra_titles=extra_titles, only=only)
    finally:
        torch.set_num_threads(before)


def _train(out: Path | None, init_from: Path | None, seed: int, epochs: int, *, source: Path | None,
           cache_dir: Path | None, config: str, train_per_label: int, test_per_label: int, batch_size: int,
           lr: float, val_per_label: int, hparams: dict[str, float], heldout: bool,
           progress: bool, members: int, extra_titles: Sequence[str] = (),
           only: Sequence[int] | None = None) -> dict[str, Any]:
    t0 = time.time()
    if epochs < 1:
        raise InvalidInput("epochs must be at least 1")
    if not 1 <= members <= 9:
        raise InvalidInput("members must be between 1 and 9")
    unknown = set(hparams) - set(HPARAM_KEYS)
    if unknown:
        raise InvalidInput(f"unknown training settings {sorted(unknown)}; known: {list(HPARAM_KEYS)}")
    hp = {k: hparams.get(k, DEFAULTS[k]) for k in HPARAM_KEYS}
    if template_overlap():
        raise InvalidInput(f"{len(template_overlap())} templates are shared by the train, val and test sets")
    source = Path(source) if source else default_source()
    terms = catalogue_terms(source)
    if extra_titles:
        terms = terms.with_titles(extra_titles)
    trains, test = make_member_splits(terms, train_per_label=train_per_label, test_per_label=test_per_label,
                                      seed=seed, members=members)
    train_texts = {e.text.casefold() for train in trains for e in train}
    val = make_val(terms, per_label=val_per_label, seed=seed, exclude=train_texts)
    log.info("generated %d x %d training, %d validation and %d held-out queries from %d brands, %d article types",
             members, len(trains[0]), len(val), len(test), len(terms.brands), len(terms.types))
    tok = qtok.load_tokenizer(cache_dir)
    arch = load_arch_config(config)
    out = Path(out) if out else WEIGHTS_DIR / DEFAULT_WEIGHTS
    out.mkdir(parents=True, exist_ok=True)
    # Members train into a staging folder and replace the old ones only once all are done: a
    # crash mid-training leaves the shipped ensemble as it was.
    staging = out / f"{MEMBERS_DIR}.new"
    shutil.rmtree(staging, ignore_errors=True)
    todo = sorted(set(only)) if only is not None else list(range(members))
    if any(not 0 <= m < members for m in todo):
        raise InvalidInput(f"members to train must be in 0..{members - 1}")
    run = _Members(seed=seed, epochs=epochs, batch_size=batch_size, lr=lr, hp=hp, members=members, arch=arch,
                   tok=tok, init_from=init_from, val=val, progress=progress, t0=t0,
                   sizes={"train_per_label": train_per_label, "test_per_label": test_per_label,
                          "val_per_label": val_per_label})
    run.prepare([trains[m] for m in todo], todo)
    if only is not None:  # a share of the members: each saved under out/parts/<i>, no ensemble yet
        done = []
        for m in todo:
            mm, mclf, mbest, mhist, _ = run.fit(m, trains[m], out / PARTS_DIR / str(m))
            mv = evaluate(mclf, val)
            mm.config.update(best_epoch=mbest, history=mhist, members=members,
                             val={"accuracy": mv["accuracy"], "macro_f1": mv["macro_f1"]})
            mm.save_pretrained(out / PARTS_DIR / str(m))
            done.append({"member": m, "best_epoch": mbest, "val_accuracy": mv["accuracy"]})
        return {"parts": done, "seconds": round(time.time() - t0, 1)}
    fitted = [run.fit(m, trains[m], out if m == 0 else staging / str(m)) for m in range(members)]
    summary = _ship(out, fitted, terms=terms, val=val, test=test, trains=trains, seed=seed, epochs=epochs,
                    init_from=init_from, heldout=heldout, extra_titles=extra_titles, tok=tok, t0=t0)
    save_recipe(out, IntentRecipe(epochs=epochs, batch_size=batch_size, lr=lr, **hp, train_per_label=train_per_label,
                                  test_per_label=test_per_label, val_per_label=val_per_label, members=members,
                                  seed=seed, config=config, init_from=str(init_from) if init_from else None))
    return summary


@dataclass
class _Members:
    """What every member of one training run shares: the settings, the tokenizer and its ranks,
    frequent English words kept beyond the training queries, the distillation targets (one MiniLM
    pass over all members' queries) and the validation queries."""

    seed: int
    epochs: int
    batch_size: int
    lr: float
    hp: dict[str, float]
    members: int
    arch: dict[str, Any]
    tok: Any
    init_from: Path | None
    val: list[Example]
    progress: bool
    t0: float
    sizes: dict[str, int]
    ranks: dict[bytes, int] = field(default_factory=dict)
    extra_ids: set[int] = field(default_factory=set)
    distills: dict[int, Any] = field(default_factory=dict)

    def prepare(self, trains: list[list[Example]], todo: list[int]) -> None:
        self.ranks = qtok.load_ranks()
        extra_rank = int(self.arch.get("extra_english_max_rank", 0) or 0)
        if extra_rank and self.init_from is None:
            from vitrine.training.embed_init import english_word_ids

            self.extra_ids = set(english_word_ids(self.ranks, extra_rank))
        targets = _distill_targets(trains) if self.hp["distill_weight"] > 0 else [None] * len(todo)
        self.distills = dict(zip(todo, targets))

    def model(self, member: int, train_ids: list[list[int]]) -> tuple[IntentModel, int]:
        """A member's model: its vocabulary (tokens seen often enough, and the kept English words)
        and its initialisation."""
        arch, seed = self.arch, self.seed
        counts = Counter(i for ids in train_ids for i in ids)
        min_count = int(arch.get("min_token_count", 1))
        keep = np.array(sorted({i for i, c in counts.items() if c >= min_count} | self.extra_ids), dtype=np.int64)
        labels = list(LABELS)
        tok_info = {"source_package": qtok.SOURCE_PACKAGE, "source_version": qtok.source_version(),
                    "source_sha256": qtok.SOURCE_SHA256, "converter_version": qtok.CONVERTER_VERSION,
                    "vocab_size": qtok.VOCAB_SIZE, "eos_token": qtok.ENDOFTEXT}
        if self.init_from is not None:
            model = init_from_pretrained(Path(self.init_from), arch, keep, labels)
            model.config["tokenizer"] = tok_info
        else:
            model = IntentModel(dict(arch, labels=labels, tokenizer=tok_info), keep)
        if self.init_from is None and arch.get("embedding_init") == "minilm":
            from vitrine.training.embed_init import init_embeddings

            log.info("initialising %d token embeddings from MiniLM word vectors", len(keep))
            model.config.update(init_embeddings(model.model, keep, self.ranks, n_special=3, pad=PAD, unk=UNK,
                                                eos=EOS, seed=seed, progress=self.progress))
        model.config.update(name="default", seed=seed, member=member, train_per_label=self.sizes["train_per_label"],
                            test_per_label=self.sizes["test_per_label"],
                            training=dict(self.hp, epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                                          val_per_label=self.sizes["val_per_label"]))
        return model, len(keep)

    def fit(self, member: int, train: list[Example], out_m: Path) -> tuple[IntentModel, IntentClassifier, int,
                                                                          list[Any], int]:
        """One member: its vocabulary, model and training; the epoch with the best validation
        macro-F1 is kept."""
        member_seed = self.seed if member == 0 else self.seed * 1000 + member
        _seed_all(member_seed)
        train_ids = [qtok.encode(self.tok, e.text) for e in train]
        model, n_keep = self.model(member, train_ids)
        net = model.model
        clf = IntentClassifier(model, self.tok)
        step = _MemberStep(self, model, train, train_ids, self.distills[member])
        rng = np.random.default_rng(member_seed)
        history = []
        log_path = out_m / "train_log.jsonl"
        out_m.mkdir(parents=True, exist_ok=True)
        log_path.write_text("")
        best: tuple[float, int, dict[str, Any]] | None = None  # (val macro-F1, epoch, weights)
        for epoch in range(self.epochs):
            loss = step.epoch(rng, f"intent {member + 1}/{self.members} epoch {epoch + 1}/{self.epochs}")
            vm = evaluate(clf, self.val)
            rec = {"epoch": epoch + 1, "loss": round(loss, 4), "val_accuracy": vm["accuracy"],
                   "val_macro_f1": vm["macro_f1"], "seconds": round(time.time() - self.t0, 1)}
            history.append(rec)
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            log.info("member %d epoch %d: loss %.4f, val accuracy %.4f, macro-F1 %.4f", member + 1, epoch + 1,
                     rec["loss"], rec["val_accuracy"], rec["val_macro_f1"])
            if best is None or vm["macro_f1"] > best[0]:
                best = (vm["macro_f1"], epoch + 1, {k: v.detach().clone() for k, v in net.state_dict().items()})
        assert best is not None
        net.load_state_dict(best[2])
        net.eval()
        return model, clf, best[1], history, n_keep


class _MemberStep:
    """A member's optimiser, schedule and loss (classification, plus the MiniLM distillation)."""

    def __init__(self, run: _Members, model: IntentModel, train: list[Example], train_ids: list[list[int]],
                 distill: Any) -> None:
        import torch

        self.run, self.model, self.distill = run, model, distill
        net = self.net = model.model
        hp, lr = run.hp, run.lr
        label_idx = {lab: i for i, lab in enumerate(LABELS)}
        self.enc_train = [model.rows(ids) for ids in train_ids]
        self.lengths = np.array([len(e.rows) for e in self.enc_train])
        self.y_train = np.array([label_idx[e.label] for e in train], dtype=np.int64)
        self.head = torch.nn.Linear(net.config.hidden_size, distill[0].shape[1]) if distill is not None else None
        total = math.ceil(len(self.enc_train) / run.batch_size) * run.epochs
        warm = max(1, int(hp["warmup"] * total))
        emb_w = net.get_input_embeddings().weight
        # the embedding table learns slower and without decay: rows no query touches keep their start
        self.opt = torch.optim.AdamW([
            {"params": [p for p in net.parameters() if p.requires_grad and p is not emb_w]
             + (list(self.head.parameters()) if self.head is not None else []), "weight_decay": hp["weight_decay"]},
            {"params": [emb_w] if emb_w.requires_grad else [], "weight_decay": 0.0,
             "lr": lr * float(run.arch.get("embedding_lr_scale", 1.0))},
        ], lr=lr)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
        self.loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=hp["label_smoothing"])

    def epoch(self, rng: np.random.Generator, desc: str) -> float:
        """One pass over the member's queries in length batches; the mean loss."""
        from vitrine.progress import progress_bar

        self.net.train()
        losses: list[float] = []
        bar = progress_bar(length_batches(self.lengths, self.run.batch_size, rng), desc=desc,
                           enabled=self.run.progress, leave=False)
        for step, idx in enumerate(bar):
            losses.append(self.step(idx, rng))
            if step % 20 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
        self.net.eval()
        return float(np.mean(losses))

    def step(self, idx: np.ndarray, rng: np.random.Generator) -> float:
        import torch

        net, hp = self.net, self.run.hp
        batch = []
        for i in idx:
            rows = list(self.enc_train[i].rows)
            drop = rng.random(len(rows) - 1) < hp["token_dropout"]  # never the final EOS
            rows = [UNK if d else r for r, d in zip(rows[:-1], drop)] + [EOS]
            batch.append(Encoded(rows, len(rows), False))
        ids, mask = self.model.batch(batch)
        if self.distill is None:
            logits = net(input_ids=ids, attention_mask=mask).logits
            loss = self.loss_fn(logits, torch.from_numpy(self.y_train[idx]))
        else:
            assert self.head is not None
            # the classifier's own pooling: the last real position (right padding, EOS last)
            hidden = net.model(input_ids=ids, attention_mask=mask).last_hidden_state
            pooled = hidden[torch.arange(len(idx)), mask.sum(1) - 1]
            loss = self.loss_fn(net.score(pooled), torch.from_numpy(self.y_train[idx]))
            targets, has = torch.from_numpy(self.distill[0][idx]), torch.from_numpy(self.distill[1][idx])
            if bool(has.any()):
                cos = torch.nn.functional.cosine_similarity(self.head(pooled[has]), targets[has], dim=-1)
                loss = loss + hp["distill_weight"] * (1 - cos).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in net.parameters() if p.requires_grad], 1.0)
        self.opt.step()
        self.sched.step()
        return float(loss.detach())


def assemble_members(out: Path | None = None, *, source: Path | None = None, cache_dir: Path | None = None,
                     extra_titles: Sequence[str] = (), heldout: bool = True,
                     train_texts: set[str] | None = None) -> dict[str, Any]:
    """Ship the members trained by several ``train_intent(only=...)`` runs into ``out``: measure
    the ensemble exactly as one run would (validation, held-out queries, titles, taxonomy leaves).
    ``train_texts``: the members' casefolded training texts when known (else the training draws
    are generated again to find them)."""
    t0 = time.time()
    out = Path(out) if out else WEIGHTS_DIR / DEFAULT_WEIGHTS
    parts = sorted((d for d in (out / PARTS_DIR).iterdir() if d.is_dir()), key=lambda d: int(d.name))
    models = [IntentModel.from_pretrained(d) for d in parts]
    cfg = models[0].config if models else {}
    seed, members = int(cfg.get("seed", 0)), int(cfg.get("members", 0))
    if not models or [int(m.config["member"]) for m in models] != list(range(members)):
        raise InvalidInput(f"{out / PARTS_DIR} must hold the members 0..{members - 1} of one training")
    tr = cfg["training"]
    terms = catalogue_terms(Path(source) if source else default_source())
    if extra_titles:
        terms = terms.with_titles(extra_titles)
    if train_texts is None:
        tseed = int(cfg.get("train_seed", seed))
        train_texts = {e.text.casefold() for m in range(members)
                       for e in QueryGenerator(terms, "train", tseed, member=m).generate(int(cfg["train_per_label"]))}
    full = QueryGenerator(terms, "test", seed).generate(int(cfg["test_per_label"]))
    test = [e for e in full if e.text.casefold() not in train_texts]
    # the held-out texts that are also training texts: recorded, so that measuring again needs no
    # replay of the training draws (heldout_examples)
    models[0].config["heldout_dropped"] = sorted({e.text for e in full if e.text.casefold() in train_texts})
    trains: list[list[Example]] = [[] for _ in range(members)]
    models[0].config["train_queries"] = int(cfg["train_per_label"]) * len(LABELS)
    val = make_val(terms, per_label=int(tr["val_per_label"]), seed=seed, exclude=train_texts)
    tok = qtok.load_tokenizer(cache_dir)
    fitted = [(m, IntentClassifier(m, tok), int(m.config["best_epoch"]), m.config.pop("history", []),
               len(m.keep_ids)) for m in models]
    member_val = [{"member": i, "best_epoch": int(m.config["best_epoch"]),  # measured when each was trained
                   "val_accuracy": m.config.get("val", {}).get("accuracy"),
                   "val_macro_f1": m.config.get("val", {}).get("macro_f1")} for i, m in enumerate(models)]
    staging = out / f"{MEMBERS_DIR}.new"
    shutil.rmtree(staging, ignore_errors=True)
    summary = _ship(out, fitted, terms=terms, val=val, test=test, trains=trains, seed=seed,
                    epochs=int(tr["epochs"]), init_from=None, heldout=heldout, extra_titles=extra_titles,
                    tok=tok, t0=t0, member_val=member_val)
    shutil.rmtree(out / PARTS_DIR, ignore_errors=True)
    return summary


def _ship(out: Path, fitted: list[Any], *, terms: Terms, val: list[Example], test: list[Example],
          trains: list[list[Example]], seed: int, epochs: int, init_from: Path | None, heldout: bool,
          extra_titles: Sequence[str], tok: Any, t0: float,
          member_val: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Measure the ensemble of the fitted members and write it to ``out`` (the first member at
    ``out``, the others under ``out/members/<i>``) with its summary. ``member_val``: each member's
    own validation figures when already measured."""
    members = len(fitted)
    staging = out / f"{MEMBERS_DIR}.new"
    if member_val is None:
        member_val = []
        for m, (_, mclf, mbest, _, _) in enumerate(fitted):
            mv = evaluate(mclf, val)  # each member alone, for the record
            member_val.append({"member": m, "best_epoch": mbest, "val_accuracy": mv["accuracy"],
                               "val_macro_f1": mv["macro_f1"]})
    model, clf, best_epoch, history, n_keep = fitted[0]
    # probabilities averaged over the members
    clf.members = [IntentMember(mclf.model, mclf.tokenizer) for _, mclf, _, _, _ in fitted[1:]]
    extractor = SlotExtractor(terms.vocabulary())
    val_m = evaluate(clf, val, extractor)
    model.config["members"] = members
    model.config["generator_version"] = GENERATOR_VERSION
    model.config["ensemble"] = [f"{MEMBERS_DIR}/{m}" for m in range(1, members)]
    model.config["best_epoch"] = best_epoch
    model.config["val"] = {"accuracy": val_m["accuracy"], "macro_f1": val_m["macro_f1"],
                           "slot_exact_match": val_m["slot_exact_match"], "n": val_m["n"]}
    held: dict[str, Any] = {}
    if heldout:
        held = evaluate(clf, test, extractor)
        model.config["heldout"] = {"accuracy": held["accuracy"], "macro_f1": held["macro_f1"],
                                   "slot_exact_match": held["slot_exact_match"], "n": held["n"]}
    titles = title_search_rate(clf, heldout_titles(terms, seed=seed))
    model.config["heldout_titles"] = {k: titles[k] for k in ("n", "search_rate")}
    log.info("held-out catalogue titles sent to search: %.4f of %d", titles["search_rate"], titles["n"])
    leaves = leaf_search_rate(clf, seed)
    model.config["heldout_taxonomy_leaves"] = {k: leaves[k] for k in ("n", "search_rate")}
    model.config["extra_titles"] = len(extra_titles)
    log.info("held-out taxonomy leaves sent to search: %.4f of %d", leaves["search_rate"], leaves["n"])
    for m, (mm, _, mbest, _, _) in enumerate(fitted[1:], start=1):
        mm.config["val"] = {"accuracy": member_val[m]["val_accuracy"], "macro_f1": member_val[m]["val_macro_f1"]}
        mm.config["best_epoch"] = mbest
        mm.save_pretrained(staging / str(m))
    shutil.rmtree(out / MEMBERS_DIR, ignore_errors=True)
    if members > 1:
        staging.rename(out / MEMBERS_DIR)
    model.save_pretrained(out)
    summary = {
        "out": _display(out), "seed": seed, "epochs": epochs, "init_from": str(init_from) if init_from else None,
        "config": model.config.get("config_name"), "members": members, "parameters": model.n_parameters(),
        "kept_token_ids": n_keep, "train_queries": len(trains[0]) or model.config.get("train_queries"),
        "val_queries": len(val),
        "heldout_queries": len(test),
        "heldout_brands": sum(1 for b in terms.brands if held_out_value(b)),
        "heldout_article_types": sum(1 for t in terms.types if held_out_value(t)),
        "training": model.config["training"], "best_epoch": best_epoch, "history": history,
        "member_val": member_val,
        "val": {k: v for k, v in val_m.items() if k != "errors_sample"}, "val_errors_sample": val_m["errors_sample"],
        "heldout": {k: v for k, v in held.items() if k != "errors_sample"} if heldout else None,
        "heldout_titles": titles,
        "heldout_taxonomy_leaves": leaves,
        "weights_bytes": sum(f.stat().st_size for f in [out / "model.safetensors",
                                                          *(out / MEMBERS_DIR).glob("*/model.safetensors")]),
        "seconds": round(time.time() - t0, 1),
    }
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary

def _distill_targets(trains: Sequence[Sequence[Example]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per member given: MiniLM sentence embeddings of its English training queries (zero rows and
    ``False`` for the others: MiniLM is an English model). One MiniLM pass over the distinct texts."""
    from vitrine.training.embed_init import minilm_vectors

    texts = sorted({e.text for train in trains for e in train if e.lang == "en"})
    vecs = minilm_vectors(texts, max_length=64)
    row = {t: i for i, t in enumerate(texts)}
    out = []
    for train in trains:
        has = np.array([e.lang == "en" for e in train])
        targets = np.zeros((len(train), vecs.shape[1] if len(vecs) else 384), dtype=np.float32)
        if has.any():
            targets[has] = vecs[[row[e.text] for e in train if e.lang == "en"]]
        out.append((targets, has))
    log.info("distillation targets: MiniLM embeddings of %d distinct English training queries", len(texts))
    return out


def evaluate_heldout(weights: str | Path = DEFAULT_WEIGHTS, *, cache_dir: Path | None = None,
                     source: Path | None = None, min_confidence: float = 0.6) -> dict[str, Any]:
    """Re-generate the held-out queries the classifier was trained beside (its config records the
    seed and sizes) and measure it: accuracy, macro-F1, slot exact-match, and the accuracy of the
    deployed rule (predictions under ``min_confidence`` fall back to search)."""
    clf = IntentClassifier.load(weights, cache_dir=cache_dir, min_confidence=min_confidence)
    cfg = clf.model.config
    test, terms = heldout_examples(source, seed=int(cfg.get("seed", 0)),
                                   per_label=int(cfg.get("test_per_label", DEFAULTS["test_per_label"])),
                                   train_per_label=int(cfg.get("train_per_label", DEFAULTS["train_per_label"])),
                                   members=int(cfg.get("members", 1)), train_seed=cfg.get("train_seed"),
                                   dropped=cfg.get("heldout_dropped"))
    t0 = time.perf_counter()
    result = evaluate(clf, test, SlotExtractor(terms.vocabulary()))
    results = clf.predict_batch([e.text for e in test])
    eff = classification_metrics([e.label for e in test], [r.label for r in results])
    result["deployed_rule"] = {"min_confidence": min_confidence, "accuracy": eff["accuracy"],
                               "macro_f1": eff["macro_f1"], "rule": clf.rule.to_json(),
                               "fallbacks": sum(not r.confident for r in results),
                               "no_cue_word": sum(bool(r.extra.get("no_cue_word")) for r in results)}
    result["heldout_titles"] = title_search_rate(clf, heldout_titles(terms, seed=int(cfg.get("seed", 0))))
    result["heldout_taxonomy_leaves"] = leaf_search_rate(clf, seed=int(cfg.get("seed", 0)))
    if clf.cues is not None:  # the same measures without the lexical prior (the confidence floor alone)
        bare = clf.predict_batch([e.text for e in test], prior=False)
        result["without_lexical_prior"] = {
            "accuracy": classification_metrics([e.label for e in test], [r.label for r in bare])["accuracy"],
            "heldout_taxonomy_leaves_search_rate":
                leaf_search_rate(clf, seed=int(cfg.get("seed", 0)), prior=False)["search_rate"]}
    result["seconds"] = round(time.perf_counter() - t0, 2)
    result["weights"] = str(weights)
    result["heldout"] = {"templates": "test set of data/templates.json", "brands_held_out":
                         sum(1 for b in terms.brands if held_out_value(b)),
                         "article_types_held_out": sum(1 for t in terms.types if held_out_value(t))}
    return result


def _display(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)
