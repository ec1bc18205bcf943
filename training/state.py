"""A replicated model's training state by name (Wide & Deep, SIM): each variable under its
checkpoint name and each optimizer slot as `<name>/<slot>`, for checkpoint.save_arrays /
assign_arrays. Every rank holds the same replica, so any world size resumes it."""
from __future__ import annotations


def with_slots(variables: dict, optimizer, slot_key=lambda name: name) -> dict:
    """variables plus optimizer.slots(slot_key(name)) of each, named `<name>/<slot>`."""
    out = dict(variables)
    for name in variables:
        for slot, slot_var in optimizer.slots(slot_key(name)).items():
            out[f"{name}/{slot}"] = slot_var
    return out


def arrays(named: dict) -> dict:
    return {name: var.numpy() for name, var in named.items()}
