"""The settings compared: (MAD task, changes over its yml baseline)."""
CASES = [  # (task, changes over the yml baseline)
    ("in-context-recall", {}), ("in-context-recall", {"vocab_size": 64}),
    ("fuzzy-in-context-recall", {}), ("fuzzy-in-context-recall", {"seq_len": 256, "num_train_examples": 3200}),
    ("noisy-in-context-recall", {}), ("noisy-in-context-recall", {"frac_noise": 0.6}),
    ("selective-copying", {}), ("selective-copying", {"num_tokens_to_copy": 32}),
    ("compression", {}), ("compression", {"vocab_size": 64}),
    ("memorization", {}), ("memorization", {"vocab_size": 1024}),
]
