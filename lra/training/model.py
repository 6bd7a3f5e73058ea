"""The model a run trains, built from its config: the classifier, a pretraining objective's
per-position head, MAD compression's autoencoder (lra/train.py builds it abstractly,
then shard by shard; lra.generate, lra.benchmark and the tests build it the same way)."""
from __future__ import annotations

import ml_collections
from flax import nnx

import lra.tasks
from lra.errors import ConfigError
from lra.runs.spec import RunSpec, resolve
from models import init_schemes
from models.autoencoder import SequenceAutoEncoder
from models.encoder import Classifier, DualClassifier
from models.pretrain import TokenPredictor


def build_model(config: ml_collections.ConfigDict, task: lra.tasks.Task,
                spec: RunSpec | None = None) -> Classifier:
    """The classifier, or for a pretraining objective (mlm, causal_lm) the same encoder
    with a per-position head (models/pretrain.py); retrieval's two documents go through
    that one encoder in turn. config.start_token adds one id, vocab_size, to the
    embedding table (and the head, whose logit for it the losses drop:
    lra/training/objectives.py). `spec`: the config's RunSpec (lra/runs/spec.py; its
    layer list), resolved here when not given."""
    vocab_size = task.vocab_size
    tie_head = bool(config.get("tie_head", False))
    if config.objective == "sequence_labels" and task.autoencoder:
        model_class, head = SequenceAutoEncoder, {}  # MAD's compression
    elif config.objective != "classify":
        model_class, head = TokenPredictor, {"objective": config.objective,
                                              "lm_loss": config.lm_loss, "tie_head": tie_head}
        vocab_size += int(bool(config.get("start_token", False)))
    else:
        model_class = DualClassifier if task.dual_input else Classifier
        head = {"num_classes": task.num_classes}
    if tie_head and "tie_head" not in head:
        raise ConfigError(f"config.tie_head=True ties a vocabulary head to the token "
                          f"embedding; this {model_class.__name__} has none (objective "
                          f"{config.objective!r}{', an autoencoder' if not head else ''})")
    spec = spec or resolve(config)
    model = model_class(
        vocab_size=vocab_size, **head, max_len=config.max_length,
        model=config.model, model_hparams=config.model_hparams.to_dict(),
        emb_dim=config.emb_dim, num_heads=config.num_heads, num_layers=config.num_layers,
        qkv_dim=config.qkv_dim, mlp_dim=config.mlp_dim, dropout_rate=config.dropout_rate,
        attention_dropout_rate=config.attention_dropout_rate,
        attention_impl=config.attention_impl, pooling=config.pooling,
        pos_emb=config.pos_emb, causal=config.causal,
        block=config.block.to_dict() if "block" in config else None,
        # A hybrid stack's layers (configs/hybrid.py); None: config.model in every layer.
        layers=spec.layer_list(),
        rngs=nnx.Rngs(params=config.random_seed, dropout=config.random_seed + 1),
    )
    # The benchmark's own redraw of the built parameters (config.init_scheme, set by the
    # scaffold: models/init_schemes.py); `own` leaves each variant's.
    init_schemes.apply(model, config.get("init_scheme", "own"), seed=config.random_seed,
                       base_model=config.model, layer_models=spec.names,
                       autoencoder=model_class is SequenceAutoEncoder)
    return model
