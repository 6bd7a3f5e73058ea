"""Helpers shared by the variant tests: random weights and float64 views for references."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def randomize_params(module: nnx.Module, seed: int = 3, scale: float = 0.5) -> nnx.Module:
    """Redraws every Param of `module` (zero biases and unit scales included) at random, so
    that a reference test cannot pass by a term being zero."""
    rng = np.random.default_rng(seed)
    nnx.update(module, jax.tree.map(
        lambda leaf: jnp.asarray(scale * rng.standard_normal(leaf.shape), leaf.dtype),
        nnx.state(module, nnx.Param)))
    return module


def f64(a) -> np.ndarray:
    """A Param or an array as a float64 numpy array."""
    return np.asarray(a[...] if hasattr(a, "value") else a, np.float64)


def normal(seed: int, shape: tuple[int, ...]) -> jax.Array:
    """Standard-normal float32 inputs. numpy draws: jax.random compiles a program per
    shape, slow on small CPUs."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def project_heads(layer: nnx.Linear, x, num_heads: int) -> np.ndarray:
    """A projection in float64, split into heads: [B, L, F] -> [B, H, L, F / H]."""
    y = f64(x) @ f64(layer.kernel) + f64(layer.bias)
    b, l, f = y.shape
    return y.reshape(b, l, num_heads, f // num_heads).transpose(0, 2, 1, 3)


@functools.partial(jax.jit, static_argnums=0, static_argnames="deterministic")
def _apply(graphdef, state, args, kwargs, deterministic=True):
    return nnx.merge(graphdef, state)(*args, deterministic=deterministic, **kwargs)


def apply(module: nnx.Module, *args, deterministic: bool = True, **kwargs):
    """`module(*args, deterministic=..., **kwargs)`, compiled as one program.

    Run eagerly, a variant's first call compiles every operation on its own (2-8 s a
    variant on 2 CPU cores); jitted, the whole call compiles in 0.3-2 s, and again only for
    a new structure or shape (modules of one graphdef share the program). State that the
    call would change (rng counters) is not written back: for deterministic checks."""
    graphdef, state = nnx.split(module)
    try:
        hash(graphdef)
    except TypeError:  # a module holding a dict or list: one program for this call
        return jax.jit(lambda state, args, kwargs: nnx.merge(graphdef, state)(
            *args, deterministic=deterministic, **kwargs))(state, args, kwargs)
    return _apply(graphdef, state, args, kwargs, deterministic=deterministic)


def check_prefill_and_steps(mixer: nnx.Module, run, x_BxLxD: jax.Array, lens_B: jax.Array,
                            prompt_len: int, **tol) -> None:
    """A mixer's decoding against its parallel causal form: each row's prompt of lens_B[b]
    tokens (right-padded to prompt_len) through `prefill`, then one `step` per position to
    the end, each row at its own position; the outputs equal the parallel form's at every
    position reached. `run(mixer, method, *args)` calls a method under jit."""
    from models import decoding

    length = x_BxLxD.shape[1]
    batch = x_BxLxD.shape[0]
    parallel = np.asarray(run(mixer, "__call__", x_BxLxD))
    cache = mixer.init_cache(batch, length)
    y_prompt, cache = run(mixer, "prefill", cache, x_BxLxD[:, :prompt_len],
                          jnp.arange(prompt_len)[None] < lens_B[:, None])
    outputs = np.zeros(parallel.shape)
    for b, n in enumerate(np.asarray(lens_B)):
        outputs[b, :n] = np.asarray(y_prompt)[b, :n]
    graphdef, state = nnx.split(mixer)
    step = jax.jit(lambda cache, x_BxD: nnx.merge(graphdef, state).step(cache, x_BxD))
    for i in range(length - prompt_len):
        y, cache = step(cache, decoding.row_at(x_BxLxD, lens_B + i))
        for b, n in enumerate(np.asarray(lens_B)):
            outputs[b, n + i] = np.asarray(y)[b]
    reached = np.arange(length)[None] < (np.asarray(lens_B) + length - prompt_len)[:, None]
    np.testing.assert_allclose(outputs[reached], parallel[reached], **tol)


def task_config_train_step(config_arg: str, **hparams) -> tuple[dict, object, nnx.Module]:
    """One jitted training step of `configs/mqar.py:<config_arg>` (batch 4) with
    model_hparams updated by `hparams`: (metrics, each parameter's update, the built
    model). Two forms of one mixer (an `impl` hparam) give the same step through the task
    config. adam_eps is 1 here: the first update is then lr g / (|g| + 1), about lr g, so
    the updates compare the gradients; at the config's 1e-9 Adam's first step is lr
    sign(g), which blows a gradient that is 0 up to rounding (a key bias under softmax)
    up to lr, differently in each form."""
    import lra.tasks
    from configs import mqar
    from lra import benchmark
    from lra.train import build_model
    from lra.training import objectives, optim

    config = mqar.get_config(config_arg)
    for name, value in hparams.items():
        config.model_hparams[name] = value
    config.batch_size = 4
    config.adam_eps = 1.0
    task = lra.tasks.get("mqar")
    schedule = optim.learning_rate_schedule(config)
    assert float(schedule(0)) > 0  # else the updates are 0 and compare nothing
    tx = optim.make_optimizer(config, schedule)
    built = build_model(config, task)
    graphdef, params, rest = nnx.split(built, nnx.Param, ...)
    state = {"step": jnp.int32(0), "params": params, "rest": rest,
             "opt_state": tx.init(params)}
    batch = benchmark.generated_batch(config, task, config.max_length)
    slots = objectives.label_slots({"train": batch}, config)
    train_step, _ = objectives.make_steps(graphdef, tx, schedule, task.num_classes,
                                          config, task.vocab_size, label_slots=slots)
    new_state, metrics = jax.jit(train_step)(state, batch)
    updates = jax.tree.map(lambda new, old: new - old, new_state["params"], params)
    return metrics, updates, built


def _same_train_step(got: tuple, want: tuple) -> None:
    """Two task_config_train_step results agree: loss, gradient norm, accuracy, and every
    parameter's update, to 1e-4 of the largest update of any parameter (a tensor whose
    gradient is 0 up to rounding, a key bias under softmax, moves by 1e-11)."""
    for name in ("loss", "grad_norm", "accuracy"):
        np.testing.assert_allclose(got[0][name], want[0][name], rtol=1e-5, err_msg=name)
    scale = max(float(np.abs(np.asarray(e)).max()) for e in jax.tree.leaves(want[1]))
    assert scale > 0, "no parameter moved"
    for a, e in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-4, atol=1e-4 * scale)


def assert_forms_train_alike(module_type: type, attr: str, forms: dict) -> None:
    """forms: {value: (config argument of configs/mqar.py, model_hparams)}. Each form is
    built through the task config (its `module_type` layers' `attr` checked to be the
    value) and one training step of it agrees with the first form's (_same_train_step)."""
    results = {}
    for value, (config_arg, hparams) in forms.items():
        *results[value], built = task_config_train_step(config_arg, **hparams)
        assert {getattr(m, attr) for _, m in built.iter_modules()
                if isinstance(m, module_type)} == {value}
    first, *others = results
    for value in others:
        _same_train_step(results[value], results[first])


def assert_forms_agree(build, x_BxLxD, mask_BxL, forms: dict, rtol: float = 1e-5) -> None:
    """A mixer built by build(**hparams) for each form (forms: name -> hparams): the
    outputs at the real positions, and the gradients of the parameters and the input of
    a loss over them, agree with the first form's: outputs to rtol and rtol of the largest
    output, gradients to 1e-4 and 1e-4 of the largest one (a key bias's under softmax is 0
    up to rounding)."""
    out, grads = {}, {}
    weights = normal(2, x_BxLxD.shape)
    for name, hparams in forms.items():
        graphdef, params, rest = nnx.split(build(**hparams), nnx.Param, ...)

        def loss(params, x):
            y = nnx.merge(graphdef, params, rest)(x, mask_BxL)
            return jnp.sum(jnp.where(mask_BxL[..., None], y, 0.0) * weights)

        out[name] = np.asarray(nnx.merge(graphdef, params, rest)(x_BxLxD, mask_BxL))
        grads[name] = [np.asarray(g) for g in
                       jax.tree.leaves(jax.grad(loss, argnums=(0, 1))(params, x_BxLxD))]
    real = np.asarray(mask_BxL)
    first, *others = forms
    scale = max(float(np.abs(g).max()) for g in grads[first])
    out_scale = float(np.abs(out[first][real]).max())
    for name in others:
        np.testing.assert_allclose(out[name][real], out[first][real], rtol=rtol,
                                   atol=rtol * out_scale, err_msg=f"{name}: output")
        for got, want in zip(grads[name], grads[first]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale,
                                       err_msg=f"{name}: gradient")
