"""SIM checkpoints through the core array checkpoint: every variable, its optimizer slots,
the optimizer's step and the training position; a checkpoint of another model shape is an
error naming the differing field."""
from __future__ import annotations

import dataclasses

from checkpoint import CheckpointError, assign_arrays, load_arrays, save_arrays
from training.state import arrays, with_slots


def _shape(config) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v)
            for k, v in dataclasses.asdict(config).items()
            if k not in ("seed", "dropout_rate")}


def _with_slots(trainer) -> dict:
    """Optimizer slots are keyed by the name without its dense/ or table/ prefix."""
    return with_slots(trainer.variables(), trainer.optimizer, lambda n: n.split("/", 1)[1])


def save(path: str, trainer, position: dict) -> None:
    variables = _with_slots(trainer)
    iterations = getattr(trainer.optimizer, "iterations", None)
    meta = {"model": _shape(trainer.model.config), "position": position,
            "optimizer": type(trainer.optimizer).__name__,
            "optimizer_iterations": int(iterations.numpy()) if iterations is not None else 0}
    save_arrays(path, arrays(variables), meta, trainer.comm)


def restore(path: str, trainer) -> dict:
    """Load every variable (and slots of the same optimizer); return the saved position."""
    saved, meta = load_arrays(path)
    expected = _shape(trainer.model.config)
    odd = [f"{k}: checkpoint {meta['model'].get(k)}, now {v}" for k, v in expected.items()
           if meta["model"].get(k) != v]
    if odd:
        raise CheckpointError(f"checkpoint {path} is another model: {'; '.join(odd)}")
    variables = dict(trainer.variables())
    if meta["optimizer"] == type(trainer.optimizer).__name__:
        variables = _with_slots(trainer)
        iterations = getattr(trainer.optimizer, "iterations", None)
        if iterations is not None:
            iterations.assign(meta["optimizer_iterations"])
    assign_arrays(variables, saved, path)
    return meta["position"]
