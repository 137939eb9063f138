"""Fine-tune trained intent members on newly generated queries (new vocabulary, a shop's titles).

Training the ensemble from scratch costs about six core-minutes per member; fine-tuning the
shipped members on a fresh, smaller draw of the generator costs a fraction of it and keeps what
they learned. Each member's embedding table grows by the token ids the new queries use that it
lacked (new rows start at its unknown-token row); everything else continues from the trained
weights, at a lower learning rate with warm-up and cosine decay, with token dropout as in
training. Each fine-tuned member is written to ``out/parts/<i>``;
:func:`vitrine.training.intent.assemble_members` then measures the ensemble on the usual
validation and held-out sets and ships it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.intent import tokenizer as qtok
from vitrine.intent.classifier import IntentClassifier
from vitrine.training.intent_queries import QueryGenerator, catalogue_terms, make_val
from vitrine.intent.model import EOS, MEMBERS_DIR, UNK, Encoded, IntentModel, resolve_weights

log = logging.getLogger(__name__)

FINETUNE_DEFAULTS: dict[str, Any] = {"train_per_label": 2000, "epochs": 2, "lr": 5e-4, "batch_size": 64,
                                     "token_dropout": 0.2, "label_smoothing": 0.05, "warmup": 0.06,
                                     "weight_decay": 0.01}


def grow_vocabulary(model: IntentModel, new_ids: Sequence[int]) -> IntentModel:
    """``model`` with embedding rows added for ``new_ids`` (token ids it had no row for); each new
    row starts as its unknown-token row, every other weight is kept."""
    import torch  # loaded on use, never at import
    have = set(model.keep_ids.tolist())
    add = np.array(sorted(i for i in set(new_ids) if i not in have), dtype=np.int64)
    if not len(add):
        return model
    grown = IntentModel(dict(model.config), np.concatenate([model.keep_ids, add]))
    old = model.model.state_dict()
    new = grown.model.state_dict()
    key = next(k for k in old if k.endswith("embed_tokens.weight"))
    with torch.no_grad():
        emb = new[key]
        emb[: old[key].shape[0]] = old[key]
        emb[old[key].shape[0]:] = old[key][UNK]
        new.update({k: v for k, v in old.items() if k != key})
        new[key] = emb
    grown.model.load_state_dict(new)
    return grown


def finetune_members(base: str | Path, out: Path, *, only: Sequence[int] | None = None, seed: int = 0,
                     source: Path | None = None, cache_dir: Path | None = None, extra_titles: Sequence[str] = (),
                     draw_seed: int | None = None, **overrides: Any) -> list[dict[str, Any]]:
    """Fine-tune the members of the ensemble at ``base`` (all, or those in ``only``) on a fresh
    draw of the generator (its seed offset, so the draw is new) and save them under ``out/parts``."""
    import torch

    from vitrine.training.intent import PARTS_DIR, default_source, length_batches
    from vitrine.training.intent_metrics import evaluate

    hp = dict(FINETUNE_DEFAULTS, **overrides)
    base_dir = resolve_weights(base)
    first = IntentModel.from_pretrained(base_dir)
    dirs = [base_dir] + [base_dir / rel for rel in first.config.get("ensemble", [])]
    members = len(dirs)
    todo = sorted(set(only)) if only is not None else list(range(members))
    terms = catalogue_terms(Path(source) if source else default_source())
    if extra_titles:
        terms = terms.with_titles(extra_titles)
    tok = qtok.load_tokenizer(cache_dir)
    draw_seed = seed + 100 if draw_seed is None else draw_seed  # a draw none of the members was trained on
    done = []
    for m in todo:
        t0 = time.time()
        torch.manual_seed(draw_seed * 1000 + m)
        rng = np.random.default_rng(draw_seed * 1000 + m)
        train = QueryGenerator(terms, "train", draw_seed, member=m).generate(int(hp["train_per_label"]))
        val = make_val(terms, per_label=200, seed=seed, exclude={e.text.casefold() for e in train})
        ids = [qtok.encode(tok, e.text) for e in train]
        model = grow_vocabulary(IntentModel.from_pretrained(dirs[m]), [i for row in ids for i in row])
        net = model.model
        labels = {lab: i for i, lab in enumerate(model.labels)}
        enc = [model.rows(i) for i in ids]
        y = np.array([labels[e.label] for e in train], dtype=np.int64)
        lengths = np.array([len(e.rows) for e in enc])
        steps = math.ceil(len(enc) / hp["batch_size"]) * int(hp["epochs"])
        warm = max(1, int(hp["warmup"] * steps))
        opt = torch.optim.AdamW(net.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
        loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=hp["label_smoothing"])
        history = []
        for epoch in range(int(hp["epochs"])):
            net.train()
            losses = []
            for idx in length_batches(lengths, int(hp["batch_size"]), rng):
                batch = []
                for i in idx:
                    rows = list(enc[i].rows)
                    drop = rng.random(len(rows) - 1) < hp["token_dropout"]
                    rows = [UNK if d else r for r, d in zip(rows[:-1], drop)] + [EOS]
                    batch.append(Encoded(rows, len(rows), False))
                bids, mask = model.batch(batch)
                loss = loss_fn(net(input_ids=bids, attention_mask=mask).logits, torch.from_numpy(y[idx]))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                opt.step()
                sched.step()
                losses.append(float(loss.detach()))
            net.eval()
            history.append({"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 4),
                            "seconds": round(time.time() - t0, 1)})
            log.info("member %d fine-tune epoch %d: loss %.4f", m + 1, epoch + 1, history[-1]["loss"])
        vm = evaluate(IntentClassifier(model, tok), val)
        training = dict(model.config.get("training", {}))
        training["finetune"] = {k: hp[k] for k in sorted(hp)} | {"from": str(base), "draw_seed": draw_seed,
                                                                 "extra_titles": len(extra_titles)}
        model.config.update(member=m, members=members, seed=seed, best_epoch=int(hp["epochs"]), history=history,
                            training=training, train_per_label=int(hp["train_per_label"]), train_seed=draw_seed,
                            val={"accuracy": vm["accuracy"], "macro_f1": vm["macro_f1"]})
        model.save_pretrained(out / PARTS_DIR / str(m))
        done.append({"member": m, "val_accuracy": vm["accuracy"], "new_rows": int(model.config["vocab_rows"]),
                     "seconds": round(time.time() - t0, 1)})
        log.info("member %d fine-tuned: %s", m + 1, json.dumps(done[-1]))
    return done


__all__ = ["FINETUNE_DEFAULTS", "MEMBERS_DIR", "finetune_members", "grow_vocabulary"]
