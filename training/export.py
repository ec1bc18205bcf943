"""SavedModel export for every family: the family gives its model, a function from the serving
inputs to click probabilities (or to a dict of outputs holding them) and the inputs'
TensorSpecs; the SavedModel (signature `serving_default`, output `probabilities`, plus the
family's other outputs such as `out_of_range_ids`) is written into a staged directory renamed
into place, so a crash never leaves half an export."""
from __future__ import annotations

import os

import tensorflow as tf

from core.dynamic import DynamicTable
from core.files import FileError, StagedDirectory, write_error


class ServingModel(tf.Module):
    def __init__(self, model, probabilities, signature: list, name: str):
        super().__init__(name=name)
        self.model = model  # tracked: its variables are saved with the signature
        self._probabilities = probabilities
        self.serve = tf.function(self._serve, input_signature=signature, autograph=False)

    def _serve(self, *inputs):
        out = self._probabilities(*inputs)
        return out if isinstance(out, dict) else {"probabilities": out}


OUT_OF_RANGE_ROW = 0  # the row an id outside its table reads at serving time


def ids_in_range(ids, highest: int, counted=None) -> tuple:
    """(ids with every id outside [0, highest] replaced by OUT_OF_RANGE_ROW, how many were
    outside), so one unknown id does not fail a whole serving batch. counted: a boolean mask
    of the positions that hold ids (a multi-hot row's first `length`); None: all."""
    outside = (ids < 0) | (ids > highest)
    tallied = outside if counted is None else outside & counted
    return (tf.where(outside, tf.constant(OUT_OF_RANGE_ROW, ids.dtype), ids),
            tf.reduce_sum(tf.cast(tallied, tf.int64)))


def export_saved_model(model, probabilities, signature: list, output_path: str,
                       name: str = "serving") -> None:
    """A failed write (a full disk: TensorFlow's ResourceExhaustedError, or an OSError) is
    one FileError naming output_path; the previous export stays."""
    for module in model.submodules:
        if isinstance(module, DynamicTable):  # the id -> row map travels with the model
            module.freeze()
    serving = ServingModel(model, probabilities, signature, name)
    try:
        with StagedDirectory(output_path, overwrite=True) as staged:
            tf.saved_model.save(serving, staged.tmp_dir,
                                signatures={"serving_default": serving.serve})
    except tf.errors.OpError as e:
        raise export_error(output_path, e.message) from None
    except OSError as e:
        raise write_error(os.path.abspath(output_path), e) from None


def export_error(output_path: str, reason: str) -> FileError:
    """write_error's line for a failure TensorFlow reports (its message may span lines)."""
    output_path = os.path.abspath(output_path)
    return FileError(f"cannot write {output_path}: {' '.join(reason.split())}; nothing was "
                     f"left half-written; the previous {os.path.basename(output_path)}, if "
                     f"any, is kept")
