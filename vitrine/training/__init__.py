"""The training layer, beside the runtime: recipes, training pairs, the training loops of the
aligner (adapters / MoE gate, tower LoRA) and of the intent classifier, its query generator and
the decision rule's chooser (docs/design.md, "Training"). The runtime (encoders, intent, index,
search) never imports it; the CLI does (tests/test_layering.py)."""
