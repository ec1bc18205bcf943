"""Checkpoints that do not depend on the world size.

Layout of a checkpoint directory:
  meta.json            step, data position, model shape, optimizer, world size at save time,
                       the dynamic float16 loss scale (scale, clean steps) when there is one,
                       every other file's size and CRC-32 (checked at restore); written last
  dense.npz            data-parallel variables (and their optimizer slots, '<name>/m', '/v')
  table_<t>.npy        embedding table t, whole ([rows, dim]), one file per table
  table_<t>.m.npy ...  its lazy-Adam moments, when the optimizer is Adam
Each rank writes the column slices and row ranges it holds into a temporary directory; rank 0
joins the pieces of a table into its file in row chunks and renames the directory into place,
so an interrupted save never leaves a half checkpoint (a kill between the renames of the swap
is recovered from the complete copy beside the path: open_checkpoint); each save stages in a
directory of its own (`.<name>.tmp-<token>`). A state holding NaN or inf is never saved, and
a failed write (a full disk) leaves the previous checkpoint; both are one CheckpointError on
every rank. Restoring reads only the rows and columns a rank holds (memory-mapped). The
directory must be visible to every rank (a shared filesystem).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import zipfile
import zlib

import numpy as np

from core.files import StagedDirectory, atomic_write_text, write_error
from core.parallel.comm import Communicator
from core.parallel.placement import TablePiece

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


def _piece_file(piece, slot: str = "") -> str:
    return (f"piece_{piece.table}_{piece.col_start}_{piece.col_stop}_{piece.row_start}"
            f"{'.' + slot if slot else ''}.npy")


def _dynamic_file(table: int) -> str:
    """A dynamic table's id -> row map, pending counts and counters (core/dynamic.py), its
    rows those of table_<t>.npy (a rank's share is saved as its rows of the whole table)."""
    return f"dynamic_{table}.npz"


def _share_file(table: int, rank: int) -> str:
    return f"dynamic_{table}_share_{rank}.npz"


def _table_file(table: int, slot: str = "") -> str:
    return f"table_{table}{'.' + slot if slot else ''}.npy"


def save(path: str, trainer, position: dict) -> None:
    """position: {'step', 'epoch', 'batch_in_epoch'} of the next batch to train on. Every
    rank agrees after each stage, so a fault on one rank (non-finite weights, a full disk)
    stops all of them with the same CheckpointError and leaves the previous checkpoint."""
    comm = trainer.comm
    path = os.path.abspath(path)
    token = _staging_token(comm)
    staged = _agreed(comm, path, None,
                     lambda: _stage(path, token) if comm.rank == 0 else None)
    tmp = StagedDirectory.staging_dir(path, token)
    _agreed(comm, path, staged, lambda: _save_own_arrays(tmp, path, trainer))
    meta = _meta(trainer, position)
    _agreed(comm, path, staged, lambda: _finish(staged, trainer.model.plan,
                                                trainer.optimizer, meta)
            if comm.rank == 0 else None)


def _staging_token(comm) -> str:
    """A name for this save's staging directory, rank 0's, on every rank: unique, so that
    two writers of one path never stage in the same directory."""
    return f"{int(comm.broadcast_from_root(np.int64(secrets.randbits(62)))):016x}"


def _stage(path: str, token: str = None) -> StagedDirectory:
    _recover_in_place(path)
    return StagedDirectory(path, overwrite=True, token=token)


def _agreed(comm, path: str, staged, stage):
    """Run one stage of a save on every rank; when it fails on any rank (a CheckpointError,
    or an OSError such as a full disk), discard the staged directory and raise on all."""
    import tensorflow as tf
    problem = None
    try:
        result = stage()
    except CheckpointError as e:
        problem, result = str(e), None
    except OSError as e:
        problem, result = str(write_error(path, e)), None
    failures = comm.allreduce_sum(tf.constant(float(problem is not None)),
                                  name="checkpoint_stage_failures")
    if float(failures) == 0:
        return result
    if staged is not None:
        staged.discard()
    raise CheckpointError(problem or f"checkpoint {path} not saved: another rank failed to "
                                     f"write it (its error is on its output)")


def _finite(name: str, values: np.ndarray, path: str) -> np.ndarray:
    """values, after checking that none is NaN or inf: a poisoned state is never saved."""
    bad = values.size - int(np.count_nonzero(np.isfinite(values)))
    if bad:
        raise CheckpointError(f"refusing to save checkpoint {path}: '{name}' holds {bad} "
                              f"NaN/inf value(s) (the run diverged?); {path} is left as it "
                              f"was")
    return values


def _save_own_arrays(tmp: str, path: str, trainer) -> None:
    """This rank's table slices and slots; rank 0 adds the replicated tables and dense.npz."""
    comm, model, optimizer = trainer.comm, trainer.model, trainer.optimizer
    table_keys = {var.ref(): f"table/{i}" for i, (_, var) in enumerate(trainer.table_pairs)}
    for piece, var in zip(model.embeddings.local_pieces, model.embeddings.piece_variables):
        named = {"": var, **optimizer.slots(table_keys.get(var.ref(), ""))}
        for slot, v in named.items():
            np.save(os.path.join(tmp, _piece_file(piece, slot)),
                    _finite(f"table {piece.table}{' ' + slot if slot else ''}", v.numpy(), path))
    for table, dynamic in model.embeddings.dynamic.items():
        state = dynamic.state()
        row_start = next((p.row_start for p in model.embeddings.local_pieces
                          if p.table == table), 0)
        state["rows"] = state["rows"] + row_start
        np.savez(os.path.join(tmp, _share_file(table, comm.rank)), **state)
    if comm.rank != 0:
        return
    for table, var in model.embeddings.replicated_variables.items():
        named = {"": var, **optimizer.slots(table_keys.get(var.ref(), ""))}
        for slot, v in named.items():
            np.save(os.path.join(tmp, _table_file(table, slot)),
                    _finite(f"table {table}{' ' + slot if slot else ''}", v.numpy(), path))
    dense = {}
    for name, var in model.dense_variables().items():
        dense[name] = _finite(name, var.numpy(), path)
        for slot, slot_var in optimizer.slots(name).items():
            dense[f"{name}/{slot}"] = _finite(f"{name}/{slot}", slot_var.numpy(), path)
    np.savez(os.path.join(tmp, "dense.npz"), **dense)


def _meta(trainer, position: dict) -> dict:
    model, optimizer = trainer.model, trainer.optimizer
    iterations = getattr(optimizer, "iterations", None)
    meta = {"format_version": FORMAT_VERSION, "position": position,
            "model": _model_shape(model), "optimizer": type(optimizer).__name__.lower(),
            "optimizer_iterations": int(iterations.numpy()) if iterations is not None else 0,
            "saved_world_size": trainer.comm.size}
    scaler = getattr(trainer, "loss_scale", None)
    if scaler is not None and scaler.dynamic:
        meta["loss_scale"] = {"scale": float(scaler.scale.numpy()),
                              "clean_steps": int(scaler.clean_steps.numpy())}
    return meta


def _finish(staged: StagedDirectory, plan, optimizer, meta: dict) -> None:
    """Rank 0: join the slices of each table, then write meta.json (with every file's
    checksum) last, then publish."""
    for table in range(plan.num_tables):
        if table in plan.replicated:
            continue
        for slot in [""] + list(optimizer.slot_names):
            _join_pieces(staged.tmp_dir, plan, table, slot)
    for table, dynamic in enumerate(meta["model"]["dynamic"] or ()):
        if dynamic:
            _join_shares(staged.tmp_dir, table, meta["saved_world_size"])
    _write_meta(staged.tmp_dir, meta)
    staged.publish()


def _join_pieces(directory: str, plan, table: int, slot: str) -> None:
    pieces = plan.pieces_of(table)
    files = [os.path.join(directory, _piece_file(p, slot)) for p in pieces]
    if not all(os.path.exists(f) for f in files):
        return  # this slot does not exist for the table (e.g. SGD, or a frozen table)
    target = os.path.join(directory, _table_file(table, slot))
    if len(files) == 1:
        os.rename(files[0], target)
        return
    sources = [np.load(f, mmap_mode="r") for f in files]
    out = np.lib.format.open_memmap(target, mode="w+", dtype=np.float32,
                                    shape=(plan.cardinalities[table], plan.dim))
    for p, src in zip(pieces, sources):  # column slices and row ranges alike
        for start in range(0, p.row_count, ROW_CHUNK):
            stop = min(start + ROW_CHUNK, p.row_count)
            out[p.row_start + start:p.row_start + stop, p.col_start:p.col_stop] = \
                src[start:stop]
    out.flush()
    del out, sources
    for f in files:
        os.unlink(f)


def _join_shares(directory: str, table: int, world_size: int) -> None:
    """dynamic_<t>.npz from every rank's share file (joined_shares)."""
    files = [os.path.join(directory, _share_file(table, r)) for r in range(world_size)]
    np.savez(os.path.join(directory, _dynamic_file(table)),
             **joined_shares([dict(np.load(f)) for f in files]))
    for f in files:
        os.unlink(f)


_MAP_ARRAYS = ("keys", "rows", "pending_keys", "pending_counts", "row_ids", "last_used")


def joined_shares(shares: list) -> dict:
    """One map of a dynamic table from every rank's share (DynamicTable.state() with its rows
    already those of the whole table; each share's row -> id and last use fill its rows, in
    rank order): the map a checkpoint holds, whatever the world size that saved it."""
    joined = {key: np.concatenate([s[key] for s in shares]) for key in _MAP_ARRAYS}
    joined["counters"] = _joined_counters(np.array([s["counters"] for s in shares]))
    return joined


def _joined_counters(counters: np.ndarray) -> np.ndarray:
    """[ranks, 4] counters of the shares -> the table's: allocated rows, clock (the same on
    every rank), admissions, evictions."""
    return np.array([counters[:, 0].sum(), counters[:, 1].max(), counters[:, 2].sum(),
                     counters[:, 3].sum()])


def gathered_map(dynamic, row_start: int, comm) -> dict:
    """A dynamic table's one map (joined_shares of every rank's share, whose rows start at
    row_start of the whole table) on rank 0, None elsewhere: a collective every rank calls
    alike (gather_to_root concatenates in rank order, as joined_shares)."""
    state = dynamic.state()
    state["rows"] = state["rows"] + row_start
    joined = {key: comm.gather_to_root(state[key]) for key in _MAP_ARRAYS}
    counters = comm.gather_to_root(state["counters"])
    if comm.rank != 0:
        return None
    joined["counters"] = _joined_counters(np.asarray(counters).reshape(-1, 4))
    return joined


def gathered_maps(dynamic_tables: dict, row_ranges: dict, comm) -> dict:
    """{name: one map} (gathered_map) of dynamic_tables (see load_maps) on rank 0, a share's
    first row that of the row range of the first variable its map indexes."""
    return {name: gathered_map(table, row_ranges.get(entries[0], (0,))[0], comm)
            for name, (table, entries) in dynamic_tables.items()}


def load_maps(maps: dict, dynamic_tables: dict, arrays, variables: dict, rank: int,
              world_size: int, path: str) -> None:
    """Each dynamic table of dynamic_tables ({name: (DynamicTable, names of the variables
    whose rows its map indexes)}) takes rank's share of its saved map (maps[name]), and
    those of `variables` take the share's rows of the saved whole arrays."""
    for name, (table, entries) in dynamic_tables.items():
        state, taken = dealt_share(maps[name], table.capacity, rank, world_size,
                                   f"checkpoint {path}: dynamic table '{name}'")
        for entry in (e for e in entries if e in variables):
            values = variables[entry].numpy()
            values[:len(taken)] = np.asarray(arrays[entry])[taken]
            variables[entry].assign(values)
        table.load(state)


def dealt_share(saved: dict, capacity: int, rank: int, world_size: int, what: str) -> tuple:
    """(the map of rank's share, its rows in the saved table) of a checkpoint's one map
    (joined_shares) dealt to `world_size` ranks: the ids rank owns
    (core.parallel.rows.hash_owner), in the order of their saved rows, take rows 1, 2, ...
    (so least-recently-used ties break as before); row 0, the rare row, is saved row 0. The
    share's rows i are the saved rows taken[i] of every table (and slot) the map indexes."""
    from core.parallel.rows import hash_owner  # TensorFlow: only when restoring
    owner_of = hash_owner(world_size)
    mine = owner_of(saved["keys"]).numpy() == rank
    keys, rows = saved["keys"][mine], saved["rows"][mine]
    order = np.argsort(rows, kind="stable")
    keys, rows = keys[order], rows[order]
    if len(keys) > capacity - 1:
        raise CheckpointError(f"{what} holds {len(keys):,d} ids for rank {rank} of "
                              f"{world_size}, more than its share of {capacity - 1:,d} rows: "
                              f"resume on more processes")
    taken = np.concatenate([[0], rows])
    pending = owner_of(saved["pending_keys"]).numpy() == rank
    row_ids = np.zeros(capacity, np.int64)
    row_ids[1:len(taken)] = keys
    last_used = np.full(capacity, -1, np.int64)
    last_used[:len(taken)] = saved["last_used"][taken]
    _, clock, admissions, evictions = saved["counters"]
    counters = [len(keys), clock] + ([admissions, evictions] if rank == 0 else [0, 0])
    return {"keys": keys, "rows": np.arange(1, len(taken), dtype=np.int64),
            "pending_keys": saved["pending_keys"][pending],
            "pending_counts": saved["pending_counts"][pending],
            "row_ids": row_ids, "last_used": last_used,
            "counters": np.array(counters)}, taken


META_FILE = "meta.json"
_CHUNK = 1 << 22


def _crc32(file: str) -> int:
    crc = 0
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            crc = zlib.crc32(block, crc)
    return crc


def _write_meta(directory: str, meta: dict) -> None:
    """meta.json, written last: it lists every file of the checkpoint with its size and
    CRC-32, so a restore can tell a complete, intact checkpoint from a damaged one."""
    files = sorted(f for f in os.listdir(directory) if f != META_FILE)
    meta = dict(meta, files={f: {"bytes": os.path.getsize(os.path.join(directory, f)),
                                 "crc32": _crc32(os.path.join(directory, f))} for f in files})
    atomic_write_text(os.path.join(directory, META_FILE), json.dumps(meta, indent=1))


def _verified_meta(path: str) -> dict:
    """meta.json of a checkpoint, after checking every file it lists (checkpoints written
    before checksums list none)."""
    meta_path = os.path.join(path, META_FILE)
    if not os.path.isfile(meta_path):
        raise CheckpointError(f"no checkpoint at {path} (missing {META_FILE})")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except ValueError as e:
        raise CheckpointError(f"checkpoint file {meta_path} is corrupt ({e})") from None
    for name, saved in meta.get("files", {}).items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise CheckpointError(f"checkpoint file missing: {file}")
        size = os.path.getsize(file)
        if size != saved["bytes"]:
            raise CheckpointError(f"checkpoint file {file} has {size} bytes, {saved['bytes']} "
                                  f"were saved (truncated or overwritten)")
        if _crc32(file) != saved["crc32"]:
            raise CheckpointError(f"checkpoint file {file} is corrupt (its CRC-32 differs "
                                  f"from the one saved in {META_FILE})")
    return meta


def _complete_copy(path: str):
    """(directory, meta) of the newest complete, intact copy a save killed between its
    renames left beside path (StagedDirectory.interrupted_copies), or None."""
    complete = []
    for copy in StagedDirectory.interrupted_copies(path):
        try:
            complete.append((os.path.getmtime(os.path.join(copy, META_FILE)), copy,
                             _verified_meta(copy)))
        except (CheckpointError, OSError):
            continue
    return max(complete)[1:] if complete else None


def open_checkpoint(path: str, announce: bool = True) -> tuple:
    """(directory to read, verified meta) of the checkpoint at path. When path holds none
    but a save was killed between its renames, the newest complete copy beside it is used,
    with a line saying so (announce: this process prints it)."""
    path = os.path.abspath(path)
    if not os.path.isfile(os.path.join(path, META_FILE)):
        found = _complete_copy(path)
        if found is not None:
            if announce:
                print(f"checkpoint: {path} is missing (a save was interrupted); restoring "
                      f"its complete copy {found[0]}", flush=True)
            return found
    return path, _verified_meta(path)


def _recover_in_place(path: str) -> None:
    """Before a save stages beside it: the complete copy an interrupted save left is moved
    to path, so the save that replaces it never destroys the newest checkpoint."""
    moved = StagedDirectory.recover(path)
    if moved:
        print(f"checkpoint: moved the complete copy {moved} of an interrupted save back to "
              f"{path}", flush=True)


def restore(path: str, trainer) -> dict:
    """Load weights (and matching optimizer slots) into the trainer; return the position."""
    model, optimizer = trainer.model, trainer.optimizer
    path, meta = open_checkpoint(path, announce=trainer.comm.rank == 0)
    expected = _model_shape(model)
    mismatched = [f"{k}: checkpoint has {meta['model'].get(k)}, flags give {v}"
                  for k, v in expected.items() if meta["model"].get(k) != v]
    if mismatched:
        raise CheckpointError(f"checkpoint {path} does not match the model: "
                              + "; ".join(mismatched))
    same_optimizer = meta["optimizer"] == type(optimizer).__name__.lower()
    dense_file = os.path.join(path, "dense.npz")
    with _unreadable_as_error(dense_file), np.load(dense_file) as dense:
        for name, var in model.dense_variables().items():
            var.assign(dense[name])
            if same_optimizer:
                for slot, slot_var in optimizer.slots(name).items():
                    slot_var.assign(dense[f"{name}/{slot}"])
    table_keys = {var.ref(): f"table/{i}" for i, (_, var) in enumerate(trainer.table_pairs)}
    embeddings = model.embeddings
    for piece, var in embeddings.all_variables():
        if isinstance(piece, int):  # replicated table: whole
            piece = TablePiece(piece, model.plan.cardinalities[piece], 0, model.plan.dim, 0)
        slots = optimizer.slots(table_keys.get(var.ref(), "")) if same_optimizer else {}
        if piece.table in embeddings.dynamic:
            _restore_share(path, piece.table, embeddings.dynamic[piece.table], var, slots,
                           embeddings.comm)
            continue
        var.assign(_read_piece(os.path.join(path, _table_file(piece.table)), piece))
        for slot, slot_var in slots.items():
            slot_var.assign(_read_piece(os.path.join(path, _table_file(piece.table, slot)),
                                        piece))
    iterations = getattr(optimizer, "iterations", None)
    if iterations is not None and same_optimizer:
        iterations.assign(meta["optimizer_iterations"])
    _restore_loss_scale(getattr(trainer, "loss_scale", None), meta)
    return meta["position"]


def _restore_share(path: str, table: int, dynamic, var, slots: dict, comm) -> None:
    """This rank's share of a dynamic table from the checkpoint's one map (dealt_share)."""
    dynamic_file = os.path.join(path, _dynamic_file(table))
    with _unreadable_as_error(dynamic_file), np.load(dynamic_file) as saved:
        saved = dict(saved)
    state, taken = dealt_share(saved, dynamic.capacity, comm.rank, comm.size,
                               f"checkpoint {path}: dynamic table {table}")
    for name, target in {"": var, **slots}.items():
        values = target.numpy()
        values[:len(taken)] = _read_rows(os.path.join(path, _table_file(table, name)), taken)
        target.assign(values)
    dynamic.load(state)


def _read_rows(file: str, rows: np.ndarray) -> np.ndarray:
    if not os.path.isfile(file):
        raise CheckpointError(f"checkpoint file missing: {file}")
    with _unreadable_as_error(file):
        return np.asarray(np.load(file, mmap_mode="r")[rows])


def _restore_loss_scale(scaler, meta: dict) -> None:
    """A dynamic float16 loss scale continues where it was saved; a checkpoint without one
    (saved by a float32 / bfloat16 run) leaves the initial scale."""
    if scaler is None or not scaler.dynamic or "loss_scale" not in meta:
        return
    scaler.scale.assign(meta["loss_scale"]["scale"])
    scaler.clean_steps.assign(meta["loss_scale"]["clean_steps"])


def _read_piece(file: str, piece) -> np.ndarray:
    """The rows and columns of a piece, read from the whole table's file memory-mapped."""
    if not os.path.isfile(file):
        raise CheckpointError(f"checkpoint file missing: {file}")
    with _unreadable_as_error(file):
        table = np.load(file, mmap_mode="r")
        return np.ascontiguousarray(table[piece.row_start:piece.row_stop,
                                          piece.col_start:piece.col_stop])


@contextlib.contextmanager
def _unreadable_as_error(file: str):
    """A checkpoint file numpy cannot read (one saved before checksums, damaged) as one
    line naming it."""
    try:
        yield
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint file {file} is unreadable ({e})") from None


# ---- whole-model checkpoints of Wide & Deep and SIM -----------------------------------------
# Every array is whole in the checkpoint, so any world size resumes it. Tables split by rows
# over the ranks (row_ranges: {name: (row_start, row_stop, rows)} of the state entries that
# hold rows row_start..row_stop of a `rows`-row array, the ranks' ranges contiguous in rank
# order) are gathered to rank 0 when saved, and each rank reads its rows back at restore.
ARRAYS_FILE = "arrays.npz"


def save_arrays(path: str, arrays: dict, meta: dict, comm) -> None:
    """Rank 0 writes {name: array} and meta into a staged directory, then swaps it in for the
    previous checkpoint, which stays until the new one is complete. Every rank checks the
    arrays it is given (a CheckpointError on all when one holds NaN or inf; nothing
    written); only rank 0's are written."""
    path = os.path.abspath(path)
    meta = dict(meta, format_version=FORMAT_VERSION, saved_world_size=comm.size)
    staged = _agreed(comm, path, None, lambda: _checked_then_staged(path, arrays, comm))
    _agreed(comm, path, staged, lambda: _write_arrays(staged, arrays, meta)
            if comm.rank == 0 else None)


def _checked_then_staged(path: str, arrays: dict, comm):
    for name, values in arrays.items():
        _finite(name, values, path)
    return _stage(path) if comm.rank == 0 else None


def _write_arrays(staged: StagedDirectory, arrays: dict, meta: dict) -> None:
    np.savez(os.path.join(staged.tmp_dir, ARRAYS_FILE), **arrays)
    _write_meta(staged.tmp_dir, meta)
    staged.publish()


def _arrays_file(path: str) -> tuple:
    """(the arrays file, verified meta) of a checkpoint written by save_arrays."""
    path, meta = open_checkpoint(path)
    file = os.path.join(path, ARRAYS_FILE)
    if not os.path.isfile(file):
        raise CheckpointError(f"checkpoint file missing: {file}")
    return file, meta


def load_arrays(path: str) -> tuple:
    """({name: array}, meta) of a checkpoint written by save_arrays."""
    file, meta = _arrays_file(path)
    with _unreadable_as_error(file), np.load(file) as data:
        return {name: data[name] for name in data.files}, meta


def assign_arrays(variables: dict, arrays, path: str, row_ranges: dict = None) -> None:
    """Assign {name: array} of a checkpoint (a mapping, read by name) to {name: variable},
    the rows of row_ranges only; a missing array or a shape the model does not have is an
    error naming it (a checkpoint of another model)."""
    missing = sorted(set(variables) - set(arrays))
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {missing[:3]} ({len(missing)} arrays); "
                              f"was it written by another model?")
    row_ranges = row_ranges or {}
    for name, var in variables.items():
        values, whole = arrays[name], tuple(var.shape)
        if name in row_ranges:
            start, stop, rows = row_ranges[name]
            whole = (rows, *whole[1:])
        if tuple(values.shape) != whole:
            raise CheckpointError(f"checkpoint {path}: '{name}' has shape "
                                  f"{tuple(values.shape)}, the model needs {whole}")
        if name in row_ranges:
            values = values[start:stop]
        var.assign(np.asarray(values, dtype=var.dtype.as_numpy_dtype))


# A model's training state by name (Wide & Deep, SIM): each variable under its checkpoint
# name and each optimizer slot as `<name>/<slot>`, for save_arrays / assign_arrays.
def with_slots(variables: dict, optimizer, slot_key=lambda name: name) -> dict:
    """variables plus optimizer.slots(slot_key(name)) of each, named `<name>/<slot>`."""
    out = dict(variables)
    for name in variables:
        for slot, slot_var in optimizer.slots(slot_key(name)).items():
            out[f"{name}/{slot}"] = slot_var
    return out


def slot_row_ranges(row_ranges: dict, optimizer, slot_key=lambda name: name) -> dict:
    """row_ranges of variables and of their optimizer slots (a slot holds its variable's
    rows), named as with_slots names them."""
    out = dict(row_ranges)
    for name, held in row_ranges.items():
        out.update({f"{name}/{slot}": held for slot in optimizer.slots(slot_key(name))})
    return out


def arrays(named: dict) -> dict:
    return {name: var.numpy() for name, var in named.items()}


def gathered_arrays(named: dict, row_ranges: dict, comm) -> dict:
    """{name: array} of named variables, whole on rank 0: the entries of row_ranges gathered
    from every rank in rank order (a collective: every rank calls it alike); elsewhere only
    the entries held whole."""
    out = {}
    for name, var in named.items():
        values = var.numpy()
        if name not in row_ranges:
            out[name] = values
            continue
        whole = comm.gather_to_root(values.reshape(-1))
        if comm.rank == 0:
            out[name] = np.asarray(whole).reshape(row_ranges[name][2], *values.shape[1:])
    return out


def save_replica(path: str, named_state: dict, comm, position: dict, model: dict = None,
                 optimizer=None, dynamic_tables: dict = None, row_ranges: dict = None,
                 maps_replicated: bool = False) -> None:
    """A model's checkpoint: named_state (variables and slots by name; row_ranges: the
    entries holding row ranges, see above), the training position, the fields that decide
    the variables (model) and which optimizer wrote the slots, so a restore can refuse
    another model and skip another optimizer's slots; dynamic_tables: {name: (DynamicTable, the
    named_state entries whose rows its map indexes)}, whose maps are saved beside the
    weights, every rank's share joined into one (gathered_map), or rank 0's whole map when
    every rank holds the same one (maps_replicated)."""
    meta = {"position": position}
    if model is not None:
        meta["model"] = model
    if optimizer is not None:
        iterations = getattr(optimizer, "iterations", None)
        meta.update(optimizer=type(optimizer).__name__,
                    optimizer_iterations=int(iterations.numpy()) if iterations is not None else 0)
    if row_ranges:
        # every rank checks its own rows before they travel: a NaN on any rank stops all
        path = os.path.abspath(path)
        _agreed(comm, path, None, lambda: [_finite(name, var.numpy(), path)
                                           for name, var in named_state.items()])
        saved = gathered_arrays(named_state, row_ranges, comm)
    else:
        saved = arrays(named_state)
    map_comm = Communicator() if maps_replicated else comm
    for name, joined in gathered_maps(dynamic_tables or {}, row_ranges or {}, map_comm).items():
        saved.update({f"{DYNAMIC_PREFIX}{name}/{k}": v for k, v in (joined or {}).items()})
    save_arrays(path, saved, meta, comm)


DYNAMIC_PREFIX = "dynamic_map/"


def restore_replica(path: str, variables: dict, named_state: dict, model: dict = None,
                    optimizer=None, model_defaults: dict = None,
                    dynamic_tables: dict = None, row_ranges: dict = None, comm=None,
                    maps_replicated: bool = False) -> dict:
    """Load a save_replica checkpoint into variables, and the slots of named_state when the
    same optimizer wrote them (the entries of row_ranges: their rows only, each array read
    from the file when assigned); a dynamic table (see save_replica) takes this rank's (of
    `comm`; None or maps_replicated: one process's, the whole map) share of its map and the
    share's rows (load_maps); return the
    saved position. A checkpoint of another model (a field of `model` that differs;
    model_defaults: fields older checkpoints lack) is an error naming the fields."""
    file, meta = _arrays_file(path)
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
    with _unreadable_as_error(file):
        saved = np.load(file)
    with saved:
        assign_arrays(state, saved, path, row_ranges)
        maps = {}
        for name in dynamic_tables or {}:
            prefix = f"{DYNAMIC_PREFIX}{name}/"
            maps[name] = {k[len(prefix):]: saved[k] for k in saved.files
                          if k.startswith(prefix)}
            if not maps[name]:
                raise CheckpointError(f"checkpoint {path} holds no map of dynamic table "
                                      f"'{name}'")
        whole = comm is None or maps_replicated
        load_maps(maps, dynamic_tables or {}, saved, state, 0 if whole else comm.rank,
                  1 if whole else comm.size, path)
    return meta.get("position", meta)  # Wide & Deep's first checkpoints: meta is the position
