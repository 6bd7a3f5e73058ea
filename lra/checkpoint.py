"""Checkpoints: the last training state (for resuming) and the best weights (for testing).

Two orbax managers under `<workdir>/checkpoints/`:
  last/<step>/  {state: params + rest + optimizer + step, loop: JSON (data iterator,
                best-so-far, timing, config)}; written every `checkpoint_freq` steps, at each
                evaluation and on SIGTERM; the newest one only is kept.
  best/<step>/  {weights: params + rest, info: JSON (step, eval accuracy)}; written when
                the validation accuracy improves.
orbax writes into a temporary folder and renames it when complete, so a run killed while
saving leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


def _manager(path: str) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=1, create=True, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(path, options=options)


def abstract(tree: Any) -> Any:
    """Shapes, dtypes and shardings of `tree`, the template orbax restores into."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class Checkpoints:
    def __init__(self, workdir: str):
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        self._last = _manager(os.path.join(self.directory, "last"))
        self._best = _manager(os.path.join(self.directory, "best"))

    def last_step(self) -> int | None:
        return self._last.latest_step()

    def save_last(self, step: int, state: Any, loop: dict) -> None:
        if step in self._last.all_steps():  # e.g. a finished run started again
            return
        self._last.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), loop=ocp.args.JsonSave(loop)))
        self._last.wait_until_finished()

    def last_loop(self) -> dict:
        """The JSON part of the last checkpoint (cheap: no arrays are read)."""
        step = self._last.latest_step()
        return self._last.restore(step, args=ocp.args.Composite(loop=ocp.args.JsonRestore()))["loop"]

    def restore_last(self, template: Any) -> tuple[Any, dict]:
        step = self._last.latest_step()
        restored = self._last.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract(template)), loop=ocp.args.JsonRestore()))
        return restored["state"], restored["loop"]

    def save_best(self, step: int, weights: Any, info: dict) -> None:
        # A resumed run re-evaluates steps after its last checkpoint and may reach a step
        # whose best weights were already written: the new ones are the same, rewrite them.
        if step in self._best.all_steps():
            self._best.delete(step)
        self._best.save(step, args=ocp.args.Composite(
            weights=ocp.args.StandardSave(weights), info=ocp.args.JsonSave(info)))
        self._best.wait_until_finished()

    def restore_best(self, template: Any) -> tuple[Any, dict]:
        step = self._best.latest_step()
        if step is None:
            raise FileNotFoundError(f"no best checkpoint under {self.directory}/best")
        restored = self._best.restore(step, args=ocp.args.Composite(
            weights=ocp.args.StandardRestore(abstract(template)), info=ocp.args.JsonRestore()))
        return restored["weights"], restored["info"]

    def close(self) -> None:
        self._last.close()
        self._best.close()
