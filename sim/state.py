"""SIM checkpoints through the core array checkpoint: every variable, its optimizer slots,
the optimizer's step and the training position; a checkpoint of another model shape is an
error naming the differing field."""
from __future__ import annotations

import dataclasses

from checkpoint import CheckpointError, assign_arrays, load_arrays, save_arrays


def _shape(config) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v)
            for k, v in dataclasses.asdict(config).items()
            if k not in ("seed", "dropout_rate")}


def _slot_variables(trainer) -> dict:
    out = {}
    for name, var in trainer.variables().items():
        for slot, slot_var in trainer.optimizer.slots(name.split("/", 1)[1]).items():
            out[f"{name}/{slot}"] = slot_var
    return out


def save(path: str, trainer, position: dict) -> None:
    variables = {**trainer.variables(), **_slot_variables(trainer)}
    iterations = getattr(trainer.optimizer, "iterations", None)
    meta = {"model": _shape(trainer.model.config), "position": position,
            "optimizer": type(trainer.optimizer).__name__,
            "optimizer_iterations": int(iterations.numpy()) if iterations is not None else 0}
    save_arrays(path, {k: v.numpy() for k, v in variables.items()}, meta, trainer.comm)


def restore(path: str, trainer) -> dict:
    """Load every variable (and slots of the same optimizer); return the saved position."""
    arrays, meta = load_arrays(path)
    expected = _shape(trainer.model.config)
    odd = [f"{k}: checkpoint {meta['model'].get(k)}, now {v}" for k, v in expected.items()
           if meta["model"].get(k) != v]
    if odd:
        raise CheckpointError(f"checkpoint {path} is another model: {'; '.join(odd)}")
    variables = dict(trainer.variables())
    if meta["optimizer"] == type(trainer.optimizer).__name__:
        variables.update(_slot_variables(trainer))
        iterations = getattr(trainer.optimizer, "iterations", None)
        if iterations is not None:
            iterations.assign(meta["optimizer_iterations"])
    assign_arrays(variables, arrays, path)
    return meta["position"]
