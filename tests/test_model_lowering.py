"""Whole-model lowering from this CPU host (issue 42): a classifier built from the ListOps
config with attention_impl=pallas, its training step (forward, backward, optimizer)
lowered for CUDA under an abstract H100 and exported for TPU, embeds the GPU or TPU
kernels, not the interpreter: the kernels pick their form for the platform the program is
lowered for (models/kernels/targets.py), not for the host that traces it. Lowered only:
nothing here runs on a GPU or a TPU."""
import pytest

from configs import listops
from tests.kernels import lowering

LENGTH = 64
BATCH = 2

# model -> the kernel it runs under attention_impl=pallas.
KERNELS = {"retnet": "decayed", "gla": "decayed", "mamba2": "decayed",
           "linear": "linear", "local": "block-sparse", "bigbird": "block-sparse",
           "deltanet": "delta-rule", "gated_deltanet": "delta-rule"}
# kernel -> its custom calls per layer in a training step of the (bidirectional) ListOps
# classifier: kernel calls per layer x passes per call. Linear and block-sparse attention:
# one call, a forward and two backward passes (3). Decayed attention: a scan per
# direction, 3 passes each (6). The delta rule: a scan per direction, a forward and a
# backward pass each (4).
CALLS_PER_LAYER = {"linear": 1 * 3, "block-sparse": 1 * 3, "decayed": 2 * 3,
                   "delta-rule": 2 * 2}
# By default each kernel once and each platform at least once; the rest under slow.
CUDA_DEFAULT, TPU_DEFAULT = {"retnet", "local", "deltanet"}, {"linear", "gated_deltanet"}
# BigBird's random blocks: Mosaic's integer `sign` rule asks the attached TPU for its
# generation, so its predicate cannot be exported from a host without one.
NO_TPU_EXPORT = {"bigbird"}


def _cases(default):
    return [pytest.param(m, id=f"{m}-{k}", marks=[] if m in default else [pytest.mark.slow])
            for m, k in KERNELS.items()]


def _train_step(model: str):
    """The training step and abstract (state, batch) of `model` at LENGTH, as lra.train
    builds them (the parameters never materialise)."""
    config = listops.get_config(f"model={model},runlocal")
    config.max_length = LENGTH
    config.batch_size = BATCH
    config.attention_impl = "pallas"
    return lowering.train_step(config)


def _check(model: str, calls: list[str], kernel_call: str, other: str, num_layers: int):
    """Exactly the model's kernel calls per layer, on every layer, and none of the other
    platform's."""
    assert calls.count(kernel_call) == CALLS_PER_LAYER[KERNELS[model]] * num_layers, calls
    assert other not in calls, calls


@pytest.mark.parametrize("model", _cases(CUDA_DEFAULT))
def test_train_step_lowered_for_cuda_embeds_triton(model):
    train_step, state, batch, num_layers = _train_step(model)
    text = lowering.for_cuda(train_step, state, batch)
    _check(model, lowering.custom_calls(text), lowering.TRITON, lowering.MOSAIC_TPU,
           num_layers)


@pytest.mark.parametrize("model", [c for c in _cases(TPU_DEFAULT)
                                   if c.values[0] not in NO_TPU_EXPORT])
def test_train_step_exported_for_tpu_embeds_mosaic(model):
    train_step, state, batch, num_layers = _train_step(model)
    text = lowering.for_tpu(train_step, state, batch)
    _check(model, lowering.custom_calls(text), lowering.MOSAIC_TPU, lowering.TRITON,
           num_layers)


@pytest.mark.parametrize("model", [pytest.param(m, marks=[] if m in ("gla", "local") else
                                                [pytest.mark.slow])
                                   for m in ("local", "linear", "gla", "gated_deltanet")])
def test_pallas_mosaic_on_a_blackwell_takes_the_triton_form(model, capfd):
    """attention_impl=pallas_mosaic lowered for an abstract B200 (sm_100: tcgen05, no
    wgmma): the Hopper-only Mosaic GPU kernels step aside for the Triton form, every call
    of it, and say why once; the Triton kernels lower for sm_100."""
    config = listops.get_config(f"model={model},runlocal")
    config.max_length, config.batch_size = LENGTH, BATCH
    config.attention_impl, config.dtype = "pallas_mosaic", "bfloat16"
    if model == "gla":
        config.qkv_dim = 128 * config.num_heads  # keys 64 wide: a shape the kernels take
    train_step, state, batch, num_layers = lowering.train_step(config)
    text = lowering.for_cuda(train_step, state, batch, device_kind="NVIDIA B200",
                             num_cores=148)
    calls = lowering.custom_calls(text)
    assert not any(c.startswith(lowering.MOSAIC_GPU) for c in calls), calls
    _check(model, calls, lowering.TRITON, lowering.MOSAIC_TPU, num_layers)
    err = capfd.readouterr().err
    if "lacks the Mosaic GPU API" not in err:
        assert "written for Hopper (wgmma, TMA: sm_90a), not NVIDIA B200" in err, err
