"""SIM checkpoints through the core array checkpoint: every variable, its optimizer slots,
the optimizer's step and the training position; a checkpoint of another model shape is an
error naming the differing field."""
from __future__ import annotations

import dataclasses

from checkpoint import CheckpointError, assign_arrays, load_arrays, save_arrays
from training.state import arrays, with_slots


def _shape(config) -> dict:
    """The fields that decide the variables; DIEN's attention does not depend on
    item_item_interaction."""
    ignored = ("seed", "dropout_rate") + (("item_item_interaction",)
                                          if config.model_type == "dien" else ())
    return {k: (list(v) if isinstance(v, tuple) else v)
            for k, v in dataclasses.asdict(config).items() if k not in ignored}


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
    # Checkpoints from before the field scored with the activation unit.
    found = {"item_item_interaction": "activation_unit", **meta["model"]}
    odd = [f"{k}: checkpoint {found.get(k)}, now {v}" for k, v in expected.items()
           if found.get(k) != v]
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
