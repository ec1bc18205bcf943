"""Checkpoints that do not depend on the world size.

Layout of a checkpoint directory:
  meta.json            step, data position, model shape, optimizer, world size at save time,
                       the dynamic float16 loss scale (scale, clean steps) when there is one
  dense.npz            data-parallel variables (and their optimizer slots, '<name>/m', '/v')
  table_<t>.npy        embedding table t, whole ([rows, dim]), one file per table
  table_<t>.m.npy ...  its lazy-Adam moments, when the optimizer is Adam
Each rank writes the column slices it holds into a temporary directory; rank 0 joins slices
of a table into its file in row chunks and renames the directory into place, so an
interrupted save never leaves a half checkpoint. Restoring reads only the columns a rank
holds (memory-mapped). The directory must be visible to every rank (a shared filesystem).
"""
from __future__ import annotations

import json
import os

import numpy as np

from core.files import atomic_write_text, StagedDirectory

FORMAT_VERSION = 1
ROW_CHUNK = 1 << 16


class CheckpointError(ValueError):
    pass


def _model_shape(model) -> dict:
    c = model.config
    return {"num_numerical": c.num_numerical, "cardinalities": list(c.cardinalities),
            "embedding_dim": c.embedding_dim, "bottom_mlp_dims": list(c.bottom_mlp_dims),
            "top_mlp_dims": list(c.top_mlp_dims), "interaction": c.interaction,
            "num_cross_layers": c.num_cross_layers if c.interaction == "cross" else None,
            "cross_layer_projection_dim":
                c.cross_layer_projection_dim if c.interaction == "cross" else None,
            "dynamic": [d.__dict__ if d else None for d in c.dynamic] or None}


def _piece_file(table: int, c0: int, c1: int, slot: str = "") -> str:
    return f"piece_{table}_{c0}_{c1}{'.' + slot if slot else ''}.npy"


def _dynamic_file(table: int) -> str:
    """A dynamic table's id -> row map, pending counts and counters (core/dynamic.py)."""
    return f"dynamic_{table}.npz"


def _table_file(table: int, slot: str = "") -> str:
    return f"table_{table}{'.' + slot if slot else ''}.npy"


def save(path: str, trainer, position: dict) -> None:
    """position: {'step', 'epoch', 'batch_in_epoch'} of the next batch to train on."""
    comm, model, optimizer = trainer.comm, trainer.model, trainer.optimizer
    path = os.path.abspath(path)
    staged = StagedDirectory(path, overwrite=True, shared=True) if comm.rank == 0 else None
    tmp = StagedDirectory.shared_tmp_dir(path)
    comm.barrier()
    plan = model.plan
    table_keys = {var.ref(): f"table/{i}" for i, (_, var) in enumerate(trainer.table_pairs)}
    for piece, var in zip(model.embeddings.local_pieces, model.embeddings.piece_variables):
        slots = optimizer.slots(table_keys.get(var.ref(), ""))
        np.save(os.path.join(tmp, _piece_file(piece.table, piece.col_start, piece.col_stop)),
                var.numpy())
        for slot, slot_var in slots.items():
            np.save(os.path.join(tmp, _piece_file(piece.table, piece.col_start,
                                                  piece.col_stop, slot)), slot_var.numpy())
    if comm.rank == 0:
        for table, var in model.embeddings.replicated_variables.items():
            np.save(os.path.join(tmp, _table_file(table)), var.numpy())
            for slot, slot_var in optimizer.slots(table_keys.get(var.ref(), "")).items():
                np.save(os.path.join(tmp, _table_file(table, slot)), slot_var.numpy())
        dense = {}
        for name, var in model.dense_variables().items():
            dense[name] = var.numpy()
            for slot, slot_var in optimizer.slots(name).items():
                dense[f"{name}/{slot}"] = slot_var.numpy()
        np.savez(os.path.join(tmp, "dense.npz"), **dense)
        for table, dynamic in model.embeddings.dynamic.items():
            np.savez(os.path.join(tmp, _dynamic_file(table)), **dynamic.state())
        iterations = getattr(optimizer, "iterations", None)
        meta = {"format_version": FORMAT_VERSION, "position": position,
                "model": _model_shape(model), "optimizer": type(optimizer).__name__.lower(),
                "optimizer_iterations": int(iterations.numpy()) if iterations is not None else 0,
                "saved_world_size": comm.size}
        scaler = getattr(trainer, "loss_scale", None)
        if scaler is not None and scaler.dynamic:
            meta["loss_scale"] = {"scale": float(scaler.scale.numpy()),
                                  "clean_steps": int(scaler.clean_steps.numpy())}
        atomic_write_text(os.path.join(tmp, "meta.json"), json.dumps(meta, indent=1))
    comm.barrier()
    if comm.rank == 0:
        slots = [""] + list(optimizer.slot_names)
        for table in range(plan.num_tables):
            if table in plan.replicated:
                continue
            for slot in slots:
                _join_pieces(tmp, plan, table, slot)
        staged.publish()
    comm.barrier()


def _join_pieces(directory: str, plan, table: int, slot: str) -> None:
    pieces = plan.pieces_of(table)
    files = [os.path.join(directory, _piece_file(table, p.col_start, p.col_stop, slot))
             for p in pieces]
    if not all(os.path.exists(f) for f in files):
        return  # this slot does not exist for the table (e.g. SGD, or a frozen table)
    target = os.path.join(directory, _table_file(table, slot))
    if len(files) == 1:
        os.rename(files[0], target)
        return
    sources = [np.load(f, mmap_mode="r") for f in files]
    out = np.lib.format.open_memmap(target, mode="w+", dtype=np.float32,
                                    shape=(plan.cardinalities[table], plan.dim))
    for start in range(0, out.shape[0], ROW_CHUNK):
        stop = min(start + ROW_CHUNK, out.shape[0])
        for p, src in zip(pieces, sources):
            out[start:stop, p.col_start:p.col_stop] = src[start:stop]
    out.flush()
    del out, sources
    for f in files:
        os.unlink(f)


def read_meta(path: str) -> dict:
    meta_path = os.path.join(path, "meta.json")
    if not os.path.isfile(meta_path):
        raise CheckpointError(f"no checkpoint at {path} (missing meta.json)")
    with open(meta_path) as f:
        return json.load(f)


def restore(path: str, trainer) -> dict:
    """Load weights (and matching optimizer slots) into the trainer; return the position."""
    model, optimizer = trainer.model, trainer.optimizer
    meta = read_meta(path)
    expected = _model_shape(model)
    mismatched = [f"{k}: checkpoint has {meta['model'].get(k)}, flags give {v}"
                  for k, v in expected.items() if meta["model"].get(k) != v]
    if mismatched:
        raise CheckpointError(f"checkpoint {path} does not match the model: "
                              + "; ".join(mismatched))
    same_optimizer = meta["optimizer"] == type(optimizer).__name__.lower()
    with np.load(os.path.join(path, "dense.npz")) as dense:
        for name, var in model.dense_variables().items():
            var.assign(dense[name])
            if same_optimizer:
                for slot, slot_var in optimizer.slots(name).items():
                    slot_var.assign(dense[f"{name}/{slot}"])
    table_keys = {var.ref(): f"table/{i}" for i, (_, var) in enumerate(trainer.table_pairs)}
    for piece, var in model.embeddings.all_variables():
        if isinstance(piece, int):  # replicated table: whole
            table, c0, c1 = piece, 0, model.plan.dim
        else:
            table, c0, c1 = piece.table, piece.col_start, piece.col_stop
        var.assign(_read_columns(os.path.join(path, _table_file(table)), c0, c1))
        if same_optimizer:
            for slot, slot_var in optimizer.slots(table_keys.get(var.ref(), "")).items():
                slot_var.assign(_read_columns(os.path.join(path, _table_file(table, slot)),
                                              c0, c1))
    for table, dynamic in model.embeddings.dynamic.items():
        with np.load(os.path.join(path, _dynamic_file(table))) as state:
            dynamic.load(dict(state))
    iterations = getattr(optimizer, "iterations", None)
    if iterations is not None and same_optimizer:
        iterations.assign(meta["optimizer_iterations"])
    _restore_loss_scale(getattr(trainer, "loss_scale", None), meta)
    return meta["position"]


def _restore_loss_scale(scaler, meta: dict) -> None:
    """A dynamic float16 loss scale continues where it was saved; a checkpoint without one
    (saved by a float32 / bfloat16 run) leaves the initial scale."""
    if scaler is None or not scaler.dynamic or "loss_scale" not in meta:
        return
    scaler.scale.assign(meta["loss_scale"]["scale"])
    scaler.clean_steps.assign(meta["loss_scale"]["clean_steps"])


def _read_columns(file: str, c0: int, c1: int) -> np.ndarray:
    if not os.path.isfile(file):
        raise CheckpointError(f"checkpoint file missing: {file}")
    table = np.load(file, mmap_mode="r")
    return np.ascontiguousarray(table[:, c0:c1])


# ---- whole-model checkpoints of data-parallel families (Wide & Deep, SIM) ----------------
ARRAYS_FILE = "arrays.npz"


def save_arrays(path: str, arrays: dict, meta: dict, comm) -> None:
    """Rank 0 writes {name: array} and meta into a staged directory, then swaps it in for the
    previous checkpoint, which stays until the new one is complete. Every rank holds the
    same replica, so the checkpoint does not depend on the world size."""
    path = os.path.abspath(path)
    if comm.rank == 0:
        with StagedDirectory(path, overwrite=True, shared=True) as staged:
            np.savez(os.path.join(staged.tmp_dir, ARRAYS_FILE), **arrays)
            atomic_write_text(os.path.join(staged.tmp_dir, "meta.json"),
                              json.dumps(dict(meta, format_version=FORMAT_VERSION,
                                              saved_world_size=comm.size), indent=1))
    comm.barrier()


def load_arrays(path: str) -> tuple:
    """({name: array}, meta) of a checkpoint written by save_arrays."""
    meta = read_meta(path)
    file = os.path.join(path, ARRAYS_FILE)
    if not os.path.isfile(file):
        raise CheckpointError(f"checkpoint file missing: {file}")
    with np.load(file) as data:
        return {name: data[name] for name in data.files}, meta


def assign_arrays(variables: dict, arrays: dict, path: str) -> None:
    """Assign {name: array} of a checkpoint to {name: variable}; a missing array or a shape
    the model does not have is an error naming it (a checkpoint of another model)."""
    missing = sorted(set(variables) - set(arrays))
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {missing[:3]} ({len(missing)} arrays); "
                              f"was it written by another model?")
    for name, var in variables.items():
        if tuple(arrays[name].shape) != tuple(var.shape):
            raise CheckpointError(f"checkpoint {path}: '{name}' has shape "
                                  f"{tuple(arrays[name].shape)}, the model needs "
                                  f"{tuple(var.shape)}")
        var.assign(np.asarray(arrays[name], dtype=var.dtype.as_numpy_dtype))


# A replicated model's training state by name (Wide & Deep, SIM): each variable under its
# checkpoint name and each optimizer slot as `<name>/<slot>`, for save_arrays / assign_arrays.
# Every rank holds the same replica, so any world size resumes it.
def with_slots(variables: dict, optimizer, slot_key=lambda name: name) -> dict:
    """variables plus optimizer.slots(slot_key(name)) of each, named `<name>/<slot>`."""
    out = dict(variables)
    for name in variables:
        for slot, slot_var in optimizer.slots(slot_key(name)).items():
            out[f"{name}/{slot}"] = slot_var
    return out


def arrays(named: dict) -> dict:
    return {name: var.numpy() for name, var in named.items()}


def save_replica(path: str, named_state: dict, comm, position: dict, model: dict = None,
                 optimizer=None, dynamic_tables: dict = None) -> None:
    """A replicated model's checkpoint: named_state (variables and slots by name), the training
    position, the fields that decide the variables (model) and which optimizer wrote the
    slots, so a restore can refuse another model and skip another optimizer's slots;
    dynamic_tables: {name: DynamicTable}, whose maps are saved beside the weights."""
    meta = {"position": position}
    if model is not None:
        meta["model"] = model
    if optimizer is not None:
        iterations = getattr(optimizer, "iterations", None)
        meta.update(optimizer=type(optimizer).__name__,
                    optimizer_iterations=int(iterations.numpy()) if iterations is not None else 0)
    saved = arrays(named_state)
    for name, table in (dynamic_tables or {}).items():
        saved.update({f"{DYNAMIC_PREFIX}{name}/{k}": v for k, v in table.state().items()})
    save_arrays(path, saved, meta, comm)


DYNAMIC_PREFIX = "dynamic_map/"


def restore_replica(path: str, variables: dict, named_state: dict, model: dict = None,
                    optimizer=None, model_defaults: dict = None,
                    dynamic_tables: dict = None) -> dict:
    """Load a save_replica checkpoint into variables, and the slots of named_state when the
    same optimizer wrote them; return the saved position. A checkpoint of another model (a
    field of `model` that differs; model_defaults: fields older checkpoints lack) is an error
    naming the fields."""
    saved, meta = load_arrays(path)
    if model is not None:
        found = {**(model_defaults or {}), **meta.get("model", {})}
        odd = [f"{k}: checkpoint {found.get(k)}, now {v}" for k, v in model.items()
               if found.get(k) != v]
        if odd:
            raise CheckpointError(f"checkpoint {path} is another model: {'; '.join(odd)}")
    state = named_state
    if optimizer is not None and meta.get("optimizer") != type(optimizer).__name__:
        state = variables
    elif optimizer is not None and getattr(optimizer, "iterations", None) is not None:
        optimizer.iterations.assign(meta["optimizer_iterations"])
    assign_arrays(state, saved, path)
    for name, table in (dynamic_tables or {}).items():
        prefix = f"{DYNAMIC_PREFIX}{name}/"
        found = {k[len(prefix):]: v for k, v in saved.items() if k.startswith(prefix)}
        if not found:
            raise CheckpointError(f"checkpoint {path} holds no map of dynamic table '{name}'")
        table.load(found)
    return meta.get("position", meta)  # Wide & Deep's first checkpoints: meta is the position
