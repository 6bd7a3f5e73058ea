"""What the fixed feature-redraw order (6d9c53d) reports for a performer run made before
it, computed from the old run's checkpoints, and why the old run's last validation fell.

Until 6d9c53d a training call redrew performer's (and rfa's) random features AFTER using
them, so a run of N x redraw_interval steps (the MAD minis: 1,000 steps, interval 1,000)
validated and saved its last step with a draw it never trained with. Steps 1..N are the
same under both orders (every call uses the first draw; the RNG stream advances alike),
so the fixed run's step-N state is the old run's step-N weights with the features of
its previous checkpoint; its step-N validation joins the logged earlier ones and the best
is tested, as lra.train does. A run of the fixed code reproduced this bit for bit
(performer, MAD memorization mini, seed 0: test 0.894580078125 both ways).

  PYTHONPATH=. python scripts/performer_redraw_refinish.py \
      workdirs/mad_grid/*/mad/performer/seed*        # one JSON line per run

Prints the last validation as logged (redrawn features), with the trained-on features,
with another fresh draw, and the test accuracy (micro, MAD's macro) before and after.
Needs the run's `last` checkpoints of steps N - eval_frequency and N (the loop keeps two).
"""
import json
import sys

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

import lra.tasks
from lra import train
from lra.training import checkpoint, input_pipeline
from lra.training.objectives import label_slots, macro_accuracy, make_steps
from lra.training.optim import learning_rate_schedule, make_optimizer
from models.attention import features


def refinish(workdir: str) -> dict:
    res = json.load(open(f"{workdir}/results.json"))
    config = ml_collections.ConfigDict(res["config"])
    task = lra.tasks.get(config.task)
    data = input_pipeline.load_data(config, task)
    graphdef, params, rest = nnx.split(train.build_model(config, task), nnx.Param, ...)
    schedule = learning_rate_schedule(config)
    tx = make_optimizer(config, schedule)
    _, eval_step = make_steps(graphdef, tx, schedule, task.num_classes, config,
                              task.vocab_size, label_slots=label_slots(data, config))
    eval_step = jax.jit(eval_step)
    ckpts = checkpoint.Checkpoints(workdir)
    template = {"step": jnp.int32(0), "params": params, "rest": rest,
                "opt_state": tx.init(params)}
    before, last = sorted(ckpts.last_steps())[-2:]
    interval = config.model_hparams.redraw_interval
    if last != config.num_train_steps or last % interval or before % interval == 0 \
            or last - before > interval:
        # `before` must hold the draw that steps before+1..last trained with
        raise SystemExit(f"{workdir}: checkpoints {before}, {last} do not fit (interval "
                         f"{interval}): the last must be a redraw step, the one before not")
    old, _ = ckpts.restore_last(template, before)
    new, _ = ckpts.restore_last(template, last)

    def with_features(state, feature_state):
        module = nnx.merge(graphdef, state["params"], state["rest"], copy=True)
        nnx.update(module, feature_state)
        _, p, r = nnx.split(module, nnx.Param, ...)
        return {"params": p, "rest": r}

    trained_on = nnx.state(nnx.merge(graphdef, old["params"], old["rest"], copy=True),
                           features.RandomFeatures)
    fresh = jax.tree.map(lambda w: features.orthogonal_gaussian(jax.random.key(100),
                                                                *w.shape), trained_on)
    fixed = with_features(new, trained_on)

    def evaluate(weights, split, num_batches):
        sums = None
        for batch in input_pipeline.eval_batches(
                data[split], global_batch_size=config.eval_batch_size or config.batch_size,
                num_batches=num_batches):
            out = eval_step(weights, {k: jnp.asarray(v) for k, v in batch.items()})
            sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
        sums = jax.device_get(sums)
        return (float(sums["correct"]) / float(sums["count"]),
                macro_accuracy(sums["class_tp"], sums["class_target"], sums["class_predicted"]))

    val_fixed, _ = evaluate(fixed, "val", config.num_eval_steps)
    val_fresh, _ = evaluate(with_features(new, fresh), "val", config.num_eval_steps)
    logged = {e["step"]: e["accuracy"] for e in res["eval_history"]}
    earlier = max((a, s) for s, a in logged.items() if s < last)
    if val_fixed > earlier[0]:
        best_step, (micro, macro) = last, evaluate(fixed, "test", -1)
    else:
        best_step, micro, macro = earlier[1], res["test_accuracy"], res["test_macro_accuracy"]
    return {"workdir": workdir, "val_last_logged": logged[last], "val_last_trained_on": val_fixed,
            "val_last_fresh_draw": val_fresh, "best_step_old": res["best_step"],
            "test_micro_old": res["test_accuracy"], "test_macro_old": res["test_macro_accuracy"],
            "best_step_fixed": best_step, "test_micro_fixed": micro, "test_macro_fixed": macro}


if __name__ == "__main__":
    for run in sys.argv[1:]:
        print(json.dumps(refinish(run)), flush=True)
