"""The training state as named arrays (weights, both optimizers' slots) for
checkpoint.save_arrays / load_arrays: full replicas, so any world size can resume it."""
from __future__ import annotations

from checkpoint import assign_arrays


def named_variables(model, trainer) -> dict:
    out = {}
    for part, optimizer in trainer.optimizers().items():
        variables = model.wide_variables() if part == "wide" else model.deep_variables()
        for name, var in variables.items():
            out[name] = var
            for slot, slot_var in optimizer.slots(name).items():
                out[f"{name}/{slot}"] = slot_var
    return out


def state_arrays(model, trainer) -> dict:
    return {name: var.numpy() for name, var in named_variables(model, trainer).items()}


def restore_state(model, trainer, arrays: dict, path: str) -> None:
    assign_arrays(named_variables(model, trainer), arrays, path)
