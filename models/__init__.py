"""Flax NNX models: token mixers (registry + variants), blocks, encoder and heads.

Importing the package registers every token mixer, so
`from models import registry; registry.available()` lists them all.

The public entry points for using a mixer in one's own Flax NNX model (example:
notebooks/mixers_in_your_model.ipynb, executed by the test suite):
  registry.available(), registry.capabilities(name), registry.accepted_hparams(name)
  registry.build(name, dim=, num_heads=, max_len=, causal=, rngs=, **hparams) -> a module
      called as mixer(x_BxLxD, padding_mask=mask_BxL_or_None, deterministic=True)
  decoding.init_cache(mixer, form, batch=, max_len=, dim=), decoding.prefill(mixer, form,
      cache, x_BxLxD, mask_BxL), decoding.step(mixer, form, cache, x_BxD) -> (y_BxD, cache),
      form = registry.capabilities(name).decode
  encoder.Encoder(vocab_size=, max_len=, model=, model_hparams=, layers=, ...): embeddings,
      blocks and stacks as the lab trains them (a hybrid by `layers`);
      pretrain.TokenPredictor adds a per-token head and whole-model decoding
  configs.presets.model_hparams(name, task, max_length=): the lab's per-task hparams
"""
from models import registry  # noqa: F401
from models import attention  # noqa: F401  (registers the attention variants)
