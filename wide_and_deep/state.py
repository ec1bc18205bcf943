"""The training state as named arrays (weights, both optimizers' slots) for
checkpoint.save_arrays / load_arrays: full replicas, so any world size can resume it."""
from __future__ import annotations

import numpy as np

from checkpoint import CheckpointError


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
    variables = named_variables(model, trainer)
    missing = sorted(set(variables) - set(arrays))
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {missing[:3]} ({len(missing)} arrays); "
                              f"was it written by another model?")
    for name, var in variables.items():
        if tuple(arrays[name].shape) != tuple(var.shape):
            raise CheckpointError(f"checkpoint {path}: '{name}' has shape "
                                  f"{tuple(arrays[name].shape)}, the model needs "
                                  f"{tuple(var.shape)}")
        var.assign(np.asarray(arrays[name], dtype=np.float32))
