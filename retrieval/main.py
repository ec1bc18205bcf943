"""Next-item retrieval: train SASRec or HSTU on a prepared dataset (retrieval.prepare_dataset),
evaluate by full ranking, export a top-k SavedModel.

  python -m retrieval.main --model hstu --dataset_dir DATA --output_dir OUT
  python -m retrieval.main --model hstu --dataset_dir DATA --output_dir OUT --mode export
  horovodrun -np 2 -H localhost:2 python -m retrieval.main --model sasrec ...

Every evaluation ranks the target among every item and, in the same pass, among the items
the user has not seen (the two protocols of the literature). Training keeps the epoch of the
best validation NDCG@10 (of the seen-removed protocol with --filter_seen; early stopping
after --early_stopping_patience evaluations without a better one), ends on that state
(OUT/checkpoint) and writes OUT/results.json: "valid", "test", "valid_filtered",
"test_filtered", "best_epoch", "selected_on", the test figures read once, at the kept state. OUT/checkpoint is also written at the end of
every epoch (and every --checkpoint_steps steps), so a killed run continues with --resume and
ends as an uninterrupted one; a new run into an OUT holding another is refused unless
--resume, --warm_start or --overwrite says what to do with it.
"""
from __future__ import annotations

import json
import os
import sys

from core import runtime

runtime.import_tensorflow()  # its settings first

# flake8: noqa: E402 (imports after the runtime settings)
import numpy as np
import psutil
import tensorflow as tf
from absl import app, flags

from core import plot_log
from core.cli import exit_process, parse_flags, run_cli
from core.dllog import DLLogger, logged_parameters
from core.dynamic_flags import define_dynamic_flags, with_dynamic_flags
from core.files import FileError, atomic_write_text, write_error
from core.optimizers import LearningRateSchedule
from core.parallel.comm import make_communicator
from core.parallel.rows import RowShards
from core.sources import load_spec
from retrieval import export, index
from retrieval.batches import RowBatches
from retrieval.contract import RETRIEVAL_CONTRACT
from retrieval.data import catalogue, read_sequences, requested_item_attributes
from retrieval.metrics import results_record
from retrieval.model import CHECKPOINT_DEFAULTS, MODELS, Encoder, RetrievalConfig
from retrieval.trainer import (ITEM_IDS, LOSSES, NEGATIVES, TIMESTAMPS, RetrievalTrainer,
                               evaluated, with_rows)
from training import checkpoint, loop, outputs
from training.engine import DEFAULT_DIVERGENCE_FACTOR

F = flags.FLAGS
# --sharding: the whole table on every process, or split by rows (row_wise: the ranking
# families' name)
SHARDING = ("data_parallel", "row", "row_wise")
# the one knob whose best value on Beauty's validation split differs between the models
RECIPE_LR = {"sasrec": 0.003, "hstu": 0.006}
flags.DEFINE_enum("model", "hstu", list(MODELS), "sasrec: causal softmax self-attention; "
                  "hstu: Meta's generative-recommender layer")
flags.DEFINE_enum("mode", "train", ["train", "eval", "export"], "train; eval: the kept "
                  "state's validation and test figures; export: its SavedModel to "
                  "OUT/saved_model")
flags.DEFINE_string("dataset_dir", None, "A dataset written by retrieval.prepare_dataset")
flags.DEFINE_string("feature_spec", "feature_spec.yaml", "Spec, relative to --dataset_dir")
flags.DEFINE_string("output_dir", None, "Checkpoint, results.json, log, curves, SavedModel")
flags.DEFINE_integer("max_sequence_length", 50, "History positions the model reads (the "
                     "most recent)", lower_bound=1)
flags.DEFINE_integer("embedding_dim", 64, "Width of the item table and the blocks",
                     lower_bound=1)
flags.DEFINE_integer("num_blocks", 2, "Attention blocks", lower_bound=1)
flags.DEFINE_integer("num_heads", 1, "Attention heads", lower_bound=1)
flags.DEFINE_float("dropout_rate", 0.3, "Dropout of the embedded input and every residual "
                   "branch, in [0, 1)", lower_bound=0.0)
flags.DEFINE_float("attention_dropout", 0.0, "Dropout of the attention weights, in [0, 1)",
                   lower_bound=0.0)
flags.DEFINE_bool("item_attributes", None, "An item's vector (read and scored) is its "
                  "embedding plus the mean of its attributes' embeddings (a dataset prepared "
                  "with --item_attributes). Default: on when the dataset has attributes "
                  "(Beauty's validation: bench/results/retrieval/beauty_choices)")
flags.DEFINE_bool("normalize", True, "Score L2-normalised vectors (divided by "
                  "--temperature)")
flags.DEFINE_float("temperature", 0.05, "Scores are divided by this (> 0)", lower_bound=0.0)
flags.DEFINE_enum("loss", "full", list(LOSSES), "full: cross-entropy over every item; "
                  "sampled: sampled softmax (--negatives), for catalogues too large to score "
                  "whole at every step")
flags.DEFINE_enum("negatives", "mixed", list(NEGATIVES), "--loss sampled: uniform draws "
                  "of the catalogue, the batch's other next items, or both (mixed: chosen on "
                  "validation, bench/results/retrieval/synthetic_choices)")
flags.DEFINE_integer("num_negatives", 128, "--loss sampled --negatives uniform or mixed: "
                     "uniform draws per step", lower_bound=1)
flags.DEFINE_float("lr", None, "Adam's learning rate, > 0 (default: the model's recipe, "
                   f"{', '.join(f'{m} {lr}' for m, lr in RECIPE_LR.items())})",
                   lower_bound=0.0)
flags.DEFINE_enum("lr_decay", "linear", ["none", "linear"], "none: --lr throughout; linear: "
                  "from --lr down to zero at the end of --epochs")
flags.DEFINE_float("weight_decay", 0.0, "Decoupled weight decay (AdamW), >= 0",
                   lower_bound=0.0)
flags.DEFINE_integer("batch_size", 128, "Histories per step over all processes", lower_bound=1)
flags.DEFINE_integer("epochs", 40, "Most passes over the training histories", lower_bound=1)
flags.DEFINE_integer("early_stopping_patience", 6, "Stop after this many evaluations "
                     "without a better validation NDCG@10 (0: never)", lower_bound=0)
flags.DEFINE_integer("eval_batch_size", 1024, "Users scored at once in an evaluation",
                     lower_bound=1)
flags.DEFINE_integer("eval_users", 0, "Evaluate on a seeded sample of this many users (the "
                     "same in validation and test) instead of all (0): each one's full ranking "
                     "costs a pass over the catalogue", lower_bound=0)
flags.DEFINE_bool("filter_seen", False, "Keep the epoch of the best validation NDCG@10 with "
                  "the user's seen items removed (the target kept); without it, of every item "
                  "ranked (the published tables' protocol). Both are always reported")
flags.DEFINE_enum("sharding", "data_parallel", list(SHARDING), "Where the item table lives "
                  "under horovodrun: data_parallel: whole on every process; row (the ranking "
                  "families' row_wise): split by rows, each process holding its rows and their "
                  "Adam slots, the others' read from their owners (a static table)")
flags.DEFINE_integer("top_k", 100, "--mode export: items the SavedModel returns per history",
                     lower_bound=1)
flags.DEFINE_enum("index", "none", ["none", "faiss"], "--mode export: also write an "
                  "approximate nearest-neighbour index of the catalogue (faiss IVF, float16 vectors), its "
                  "recall@top_k against the brute force measured on validation histories; "
                  "retrieval.serve answers from it")
define_dynamic_flags("item_ids (or 'all'): the item table learns its "
                     "ids (raw ids, open vocabulary; prepare_dataset --ids raw marks it so)")
flags.DEFINE_bool("resume", False, "Continue the training run in --output_dir from its "
                  "checkpoint (the same data: it ends as an uninterrupted run would)")
flags.DEFINE_bool("warm_start", False, "Start a new training run (epochs, model selection) "
                  "from the weights, optimizer state and id map of the run in --output_dir: "
                  "continued training on new data")
flags.DEFINE_bool("overwrite", False, "Replace the training run in --output_dir (its "
                  "checkpoints, results, log and curves) with a new one")
flags.DEFINE_integer("checkpoint_steps", 0, "Also save OUT/checkpoint every this many steps "
                     "(it is saved at the end of every epoch; 0: only then)", lower_bound=0)
flags.DEFINE_bool("amp", False, "bfloat16 compute on a CPU that has it natively (float16 "
                  "on a GPU); weights stay float32")
flags.DEFINE_float("divergence_factor", DEFAULT_DIVERGENCE_FACTOR, "A loss above this many "
                   "times the first step's ends the run (0: only a non-finite loss)",
                   lower_bound=0.0)
flags.DEFINE_integer("seed", 1, "Seed of initialisation, shuffling and dropout",
                     lower_bound=0)
flags.DEFINE_integer("print_freq", 100, "Progress line every this many steps", lower_bound=1)
flags.DEFINE_integer("max_steps", 0, "Stop after this many steps (0: no limit; smoke runs)",
                     lower_bound=0)
flags.DEFINE_bool("cpu", False, "Hide GPUs")
flags.mark_flags_as_required(["dataset_dir", "output_dir"])
# ranges absl's inclusive bounds cannot say: (flag, refused value test, the range)
for _name, _refused, _range in (("dropout_rate", lambda v: v >= 1, "[0, 1)"),
                                ("attention_dropout", lambda v: v >= 1, "[0, 1)"),
                                ("temperature", lambda v: v <= 0, "> 0"),
                                ("lr", lambda v: v is not None and v <= 0, "> 0")):
    flags.register_validator(_name, lambda v, refused=_refused: not refused(v),
                             f"--{_name} must be {_range}")
flags.register_multi_flags_validator(
    ["resume", "warm_start", "overwrite"], lambda given: sum(given.values()) <= 1,
    "give at most one of --resume (continue the run in --output_dir), --warm_start (a new run "
    "from its state) and --overwrite (a new run replacing it)")

# float32 copies of the item table a training process holds: the weights and Adam's two slots
TABLE_COPIES = 3


def paths() -> dict:
    return outputs.run_paths(F.output_dir)


def model_config(spec, attributes=None) -> RetrievalConfig:
    items = catalogue(spec)
    return RetrievalConfig(
        model=F.model, items=items.items, length=F.max_sequence_length, width=F.embedding_dim,
        blocks=F.num_blocks, heads=F.num_heads, dropout=F.dropout_rate,
        attention_dropout=F.attention_dropout, timestamps=items.timestamps,
        normalize=F.normalize, temperature=F.temperature,
        attributes=attributes.count if attributes else 0, seed=F.seed)


def attributes_of(spec):
    """The dataset's item attributes when --item_attributes asks for them (else None); not
    given, an existing run (eval, export, --resume) keeps what its log records. The flag is
    then set to what was chosen, as the run's log records it."""
    asked = F.item_attributes
    if asked is None and (F.mode != "train" or F.resume):
        asked = logged_attributes_choice()
    attributes = requested_item_attributes(spec, F.dataset_dir, asked)
    F.item_attributes = attributes is not None
    return attributes


def logged_attributes_choice():
    """--item_attributes as the run in --output_dir logged it (None: no such record)."""
    try:
        return logged_parameters(paths()["log"]).get("item_attributes")
    except (OSError, ValueError):
        return None


def rows(spec, mapping: str, length: int) -> dict:
    """A mapping's rows, each its last length + 1 ids (and timestamps)."""
    return {k: v for k, v in read_sequences(spec, mapping, length).items()
            if k in (ITEM_IDS, TIMESTAMPS)}


def sampled(found: dict, count: int) -> dict:
    """A seeded sample of `count` rows (all when count is 0 or more than there are), in their
    order: validation and test hold the same users in the same order, so the same users."""
    n = len(found[ITEM_IDS])
    if not count or count >= n:
        return found
    picked = np.sort(np.random.default_rng(0).permutation(n)[:count])
    return {k: v[picked] for k, v in found.items()}


def evaluation_rows(spec, mapping: str, length: int) -> dict:
    return sampled(rows(spec, mapping, length), F.eval_users)


INDEX_QUERIES = 2000  # validation histories the index's recall is measured on


def index_queries(model, spec):
    """Query vectors (as `encode` gives them) of a seeded sample of validation histories."""
    history = sampled(rows(spec, "validation", model.config.length), INDEX_QUERIES)
    features = {k: tf.constant(v) for k, v in history.items()}
    history, _ = evaluated(with_rows(model, features))
    vectors = model.encode(history[ITEM_IDS], history.get(TIMESTAMPS))[:, -1]
    return model.queries(vectors).numpy()


def selection_metric() -> str:
    return "filtered_ndcg@10" if F.filter_seen else "ndcg@10"


def save_results(path: str, final: dict) -> None:
    """Both protocols' figures at the kept epoch: every item ranked, and the seen ones removed."""
    results = results_record(final, selection_metric())
    try:
        atomic_write_text(path, json.dumps(results, indent=2) + "\n")
    except OSError as e:
        raise write_error(path, e) from None


def learning_rate(steps_per_epoch: int) -> LearningRateSchedule:
    steps = F.epochs * steps_per_epoch if F.lr_decay == "linear" else 0
    return LearningRateSchedule(F.lr, warmup_steps=0, decay_start_step=0, decay_steps=steps,
                                decay_power=1.0)


def train(trainer, data, spec, comm, logger) -> None:
    where, length = paths(), trainer.model.config.length
    position = {"epoch": 0, "step": 0}
    if F.resume or F.warm_start:
        resumed = restore(trainer, where["checkpoint"], comm)
        position = resumed if F.resume else position
    validation, test = (RowBatches(evaluation_rows(spec, m, length), F.eval_batch_size, comm)
                        for m in ("validation", "test"))

    def save(path, position):
        checkpoint.save_replica(path, trainer.named_state(), comm, position,
                                trainer.model.config.checkpoint_shape(), trainer.optimizer,
                                trainer.dynamic_tables(), trainer.row_ranges(),
                                maps_replicated=True)
    config = loop.LoopConfig(epochs=F.epochs, batch_size=F.batch_size, print_freq=F.print_freq,
                             max_steps=F.max_steps, selection_metric=selection_metric(),
                             keep_best=True, early_stopping_patience=F.early_stopping_patience,
                             checkpoint_steps=F.checkpoint_steps, checkpoint_every_epoch=True)
    final, _ = loop.train(trainer, data, lambda: trainer.evaluate(validation.epoch()), logger,
                          config, position,
                          loop.Checkpoints(where["checkpoint"], save,
                                           lambda path: restore(trainer, path, comm)),
                          lambda: trainer.evaluate(test.epoch()))
    if comm.rank == 0:
        save_results(where["results"], final)
        logger.print(f"wrote {where['results']}")


def restore(trainer, path: str, comm) -> dict:
    return checkpoint.restore_replica(path, trainer.named_state(), trainer.named_state(),
                                      trainer.model.config.checkpoint_shape(),
                                      trainer.optimizer, CHECKPOINT_DEFAULTS,
                                      trainer.dynamic_tables(), trainer.row_ranges(), comm,
                                      maps_replicated=True)


def evaluate_kept(trainer, spec, comm, logger) -> None:
    """Both protocols' validation and test figures of the kept checkpoint, logged and written
    to OUT/results.json as training writes them."""
    position = restore(trainer, paths()["checkpoint"], comm)
    chosen = position.get("selection") or {}
    final = {"best_epoch": chosen.get("best_epoch", position["epoch"]),
             "selected_on": chosen.get("metric", selection_metric())}
    for mapping, prefix in (("validation", ""), ("test", "test_")):
        batches = RowBatches(evaluation_rows(spec, mapping, trainer.model.config.length),
                             F.eval_batch_size, comm)
        figures = trainer.evaluate(batches.epoch())
        loop.log_result(logger, mapping, figures)
        final.update({f"{prefix}{k}": v for k, v in figures.items()})
    if comm.rank == 0:
        save_results(paths()["results"], final)
        logger.print(f"wrote {paths()['results']}")


def check_table_fits(items: int, width: int, shards) -> None:
    """A catalogue too large for this machine is one line now, not an out-of-memory kill
    while the table is built (a split table: this process's rows)."""
    rows = items + 1 if shards is None else shards.held[1] - shards.held[0]
    need, have = rows * width * 4 * TABLE_COPIES, psutil.virtual_memory().total
    if need > have:
        held = "" if shards is None else f" ({rows:,} rows on this process of {shards.comm.size})"
        raise ValueError(f"the item table does not fit in this machine's memory: {items:,} items"
                         f"{held} x width {width} x {TABLE_COPIES} float32 copies (the weights "
                         f"and Adam's two slots) = {need / 2**30:,.1f} GiB, this machine has "
                         f"{have / 2**30:,.1f} GiB; a catalogue of sparse ids wants "
                         f"retrieval.prepare_dataset --ids map (or --ids raw)")


def item_shards(items, comm):
    """The item table's RowShards under --sharding row (the SavedModel is written by one
    process from the checkpoint's whole table: export reads it whole)."""
    if F.sharding == "data_parallel" or F.mode == "export":
        return None
    if items.dynamic is not None:
        raise ValueError("--sharding row splits a static item table: an open vocabulary "
                         "(--ids raw, --dynamic_features item_ids) is mapped on every process, "
                         "give --sharding data_parallel")
    return RowShards(comm, items.items + 1)


def run(spec, attributes, comm, logger) -> None:
    items = catalogue(spec)
    shards = item_shards(items, comm)
    check_table_fits(items.items, F.embedding_dim, shards)
    model = Encoder(model_config(spec, attributes), items.dynamic,
                    attributes.table if attributes else None, shards)
    data = (RowBatches(rows(spec, "train", model.config.length), F.batch_size, comm,
                       shuffle_seed=F.seed) if F.mode == "train" else None)
    trainer = RetrievalTrainer(model, comm, learning_rate(len(data) if data else 1),
                               F.weight_decay, F.amp, F.seed,
                               F.divergence_factor, F.loss, F.negatives,
                               F.num_negatives)
    if shards is not None:
        logger.print(f"item table split by rows over {comm.size} processes: rows " + ", ".join(
            f"{a}-{b - 1}" for a, b in zip(shards.bounds, shards.bounds[1:])) +
            " (each with its Adam slots)")
    comm.broadcast_variables([v for name, v in model.named.items()
                              if name not in trainer.task.row_split])
    if F.mode == "train":
        train(trainer, data, spec, comm, logger)
    elif F.mode == "eval":
        evaluate_kept(trainer, spec, comm, logger)
    else:
        restore(trainer, paths()["checkpoint"], comm)
        if comm.rank == 0:
            queries = index_queries(model, spec) if F.index == "faiss" else None
            k, built = export.export(model, paths()["saved_model"], F.top_k, queries)
            capped = f"; --top_k {F.top_k} is capped at the catalogue" if k < F.top_k else ""
            logger.print(f"exported {paths()['saved_model']} (top {k} of "
                         f"{model.config.items} items{capped}) and its item embeddings"
                         + (f"; {index.summary(built)}" if built else ""))


def work() -> None:
    if os.path.exists(F.output_dir) and not os.path.isdir(F.output_dir):
        raise FileError(f"--output_dir {F.output_dir} is a file, not a directory")
    comm = make_communicator(F.cpu)
    tf.random.set_seed(F.seed)
    tf.config.experimental.enable_op_determinism()
    where = paths()
    if F.lr is None:
        F.lr = RECIPE_LR[F.model]
    spec = with_dynamic_flags(load_spec(F.dataset_dir, RETRIEVAL_CONTRACT, F.feature_spec))
    attributes = attributes_of(spec)  # refused before anything is written
    with outputs.claimed(comm, outputs.mode_paths(where, F.mode)):
        if F.mode == "train":
            outputs.start_training(
                where, comm, F.resume or F.warm_start, F.overwrite,
                "pass --resume to continue it, --warm_start to start a new run from its "
                "state, or --overwrite to replace it")
        logger = DLLogger(where["log"] if F.mode == "train" else os.devnull,
                          enabled=comm.rank == 0)
        logger.parameters({f.name: f.value
                           for f in F.get_flags_for_module(sys.modules[__name__])})
        run(spec, attributes, comm, logger)
        if F.mode == "train" and comm.rank == 0:
            plot_log.plot(where["log"], where["curves"])
        logger.close()


def main(argv) -> int:
    """Errors of the inputs (spec, data, flags, checkpoint) and of the outputs (a full disk,
    a path that cannot be written) end the run with one line."""
    return run_cli(work, errors=(ValueError, OSError))


if __name__ == "__main__":
    app.run(lambda argv: exit_process(main(argv)), flags_parser=parse_flags)
