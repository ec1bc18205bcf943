"""Two-stage recommendation: a retrieval run's candidates reranked by a ranker trained on them,
evaluated as the final list over the whole catalogue, served as one SavedModel.

  python -m recommend.main --dataset_dir DATA --retrieval_dir R --output_dir OUT
  python -m recommend.main --dataset_dir DATA --retrieval_dir R --output_dir OUT --mode export
  horovodrun -np 2 -H localhost:2 python -m recommend.main ...

R is a retrieval.main output dir (its kept model, OUT/checkpoint, trained on DATA). The ranker
trains on the training prefixes whose next item the retrieval model puts in its top
--candidates: it learns to move the true item up among the retrieved ones (hard negatives).
Validation and test users get the retrieval model's top --candidates, reordered by the ranker
(recommend/stages.py: a target outside them is a miss). Training keeps the epoch of the best
validation NDCG@10 and writes OUT/results.json: retrieval.main's layout
("valid", "test", "valid_filtered", "test_filtered", "best_epoch", "selected_on") of the final
lists, and "retrieval": the retrieval model's own figures on the same users. With
--filter_seen the recommender is one of unseen items: its training lists, the lists it is
selected on and the ones it serves hold none of the history's items.
"""
from __future__ import annotations

import json
import os
import sys
import time

from core import runtime

runtime.import_tensorflow()  # its settings first

# flake8: noqa: E402 (imports after the runtime settings)
import numpy as np
import tensorflow as tf
from absl import app, flags

from core import plot_log
from core.cli import exit_process, parse_flags, run_cli
from core.dllog import DLLogger
from core.files import FileError, atomic_write_text, write_error
from core.optimizers import LearningRateSchedule
from core.parallel.comm import make_communicator
from core.sources import load_spec
from recommend import export
from recommend.ranker import RANKERS, Ranker, RankerConfig
from recommend.stages import Candidates, load_retrieval, training_pairs
from recommend.trainer import TRAINING_FEATURES, RankingTrainer
from retrieval.batches import RowBatches
from retrieval.contract import RETRIEVAL_CONTRACT
from retrieval.data import read_sequences, requested_item_attributes
from retrieval.metrics import ranking_metrics, results_record
from training import checkpoint, loop, outputs

F = flags.FLAGS
flags.DEFINE_enum("mode", "train", ["train", "eval", "export"], "train; eval: the kept "
                  "state's figures again; export: the two-stage SavedModel to OUT/saved_model")
flags.DEFINE_string("dataset_dir", None, "A dataset written by retrieval.prepare_dataset")
flags.DEFINE_string("feature_spec", "feature_spec.yaml", "Spec, relative to --dataset_dir")
flags.DEFINE_string("retrieval_dir", None, "A retrieval.main output dir trained on "
                    "--dataset_dir: its kept model retrieves the candidates")
flags.DEFINE_string("output_dir", None, "Checkpoint, results.json, log, curves, SavedModel")
flags.DEFINE_enum("ranker", "hstu", list(RANKERS), "hstu: the target-aware HSTU ranker (all "
                  "candidates in one pass); din: DIN's attention pool per candidate (baseline)")
flags.DEFINE_integer("candidates", 100, "K: the retrieved items the ranker reorders",
                     lower_bound=1)
flags.DEFINE_integer("num_blocks", 2, "HSTU layers (--ranker hstu)", lower_bound=1)
flags.DEFINE_integer("num_heads", RankerConfig.heads, "HSTU heads (--ranker hstu)",
                     lower_bound=1)
flags.DEFINE_bool("start_from_retrieval", False, "Start the ranker's item table from the "
                  "retrieval model's (else its own draw: a second view of the items)")
flags.DEFINE_bool("item_attributes", False, "The ranker's item vectors add the mean of the "
                  "item's attributes' rows (a dataset prepared with --item_attributes)")
flags.DEFINE_float("dropout_rate", 0.2, "Dropout of the ranker's head input, in [0, 1)",
                   lower_bound=0.0)
flags.DEFINE_float("lr", 0.003, "Adam's learning rate, > 0, decayed linearly to zero over "
                   "--epochs", lower_bound=0.0)
flags.DEFINE_integer("batch_size", 128, "Training prefixes per step over all processes",
                     lower_bound=1)
flags.DEFINE_integer("epochs", 3, "Most passes over the training prefixes", lower_bound=1)
flags.DEFINE_integer("early_stopping_patience", 1, "Stop after this many evaluations "
                     "without a better validation NDCG@10 (0: never)", lower_bound=0)
flags.DEFINE_integer("eval_batch_size", 512, "Histories scored at once (retrieval and "
                     "evaluation)", lower_bound=1)
flags.DEFINE_bool("filter_seen", False, "A recommender of unseen items: train on the top "
                  "--candidates of the items a history does not hold, keep the epoch of the best "
                  "validation NDCG@10 of the seen-removed lists and serve (--mode export) "
                  "without them (both protocols are always reported)")
flags.DEFINE_integer("top_k", 10, "--mode export: items of the final list served (at most "
                     "--candidates)", lower_bound=1)
flags.DEFINE_bool("resume", False, "Continue the training run in --output_dir from its "
                  "checkpoint")
flags.DEFINE_bool("overwrite", False, "Replace the training run in --output_dir")
flags.DEFINE_integer("checkpoint_steps", 0, "Also save OUT/checkpoint every this many steps "
                     "(it is saved at the end of every epoch)", lower_bound=0)
flags.DEFINE_integer("seed", 1, "Seed of initialisation, shuffling and dropout",
                     lower_bound=0)
flags.DEFINE_integer("print_freq", 100, "Progress line every this many steps", lower_bound=1)
flags.DEFINE_integer("max_steps", 0, "Stop after this many steps (0: no limit; smoke runs)",
                     lower_bound=0)
flags.DEFINE_bool("cpu", False, "Hide GPUs")
flags.mark_flags_as_required(["dataset_dir", "retrieval_dir", "output_dir"])
flags.register_validator("dropout_rate", lambda v: v < 1, "--dropout_rate must be in [0, 1)")
flags.register_validator("lr", lambda v: v > 0, "--lr must be > 0")
flags.register_multi_flags_validator(
    ["resume", "overwrite"], lambda given: sum(given.values()) <= 1,
    "give at most one of --resume and --overwrite")


def paths() -> dict:
    return outputs.run_paths(F.output_dir)


def selection_metric() -> str:
    return "filtered_ndcg@10" if F.filter_seen else "ndcg@10"


def timed(logger, what: str, function):
    start = time.perf_counter()
    out = function()
    logger.print(f"{what}: {time.perf_counter() - start:.0f} s")
    return out


def training_rows(spec, stage: Candidates, length: int, logger) -> dict:
    """The training prefixes whose next item the retrieval model retrieves: the lists the
    ranker reorders at serving. (A prefix whose next item is outside the top K, added to its
    list, would carry a retrieval score below every other candidate's and teach the ranker to
    distrust retrieval: lower validation NDCG@10 than retrieval alone on Beauty.)"""
    histories, targets = training_pairs(read_sequences(spec, "train", length)["item_ids"],
                                        length)
    rows = timed(logger, f"retrieved {stage.k} candidates for {len(targets):,} training "
                 f"prefixes", lambda: stage.training(histories, targets))
    logger.print(f"{len(rows['label']):,} prefixes have their next item among them: the "
                 f"ranker's training lists")
    return rows


def evaluation_rows(spec, mapping: str, stage: Candidates, length: int, logger) -> dict:
    """A mapping's users: history, target, both protocols' retrieved lists and ranks."""
    ids = read_sequences(spec, mapping, length)["item_ids"]
    history, target = ids[:, :-1], ids[:, -1]
    lists = timed(logger, f"retrieved {stage.k} candidates for {len(target):,} {mapping} "
                  f"users", lambda: stage.evaluation(history, target))
    return {"history": history, "target": target, **lists}


def retrieval_figures(rows: dict) -> dict:
    """The retrieval model's own figures on these users, both protocols."""
    return {"": ranking_metrics(rows["retrieval_rank"]),
            "filtered_": ranking_metrics(rows["filtered_retrieval_rank"])}


def save_results(final: dict, retrieval: dict) -> None:
    """retrieval: {mapping: retrieval_figures()} of validation and test."""
    results = results_record(final, selection_metric())
    results["retrieval"] = {
        f"{split}{suffix}": retrieval[mapping][prefix]
        for split, mapping in (("valid", "validation"), ("test", "test"))
        for suffix, prefix in (("", ""), ("_filtered", "filtered_"))}
    path = paths()["results"]
    try:
        atomic_write_text(path, json.dumps(results, indent=2) + "\n")
    except OSError as e:
        raise write_error(path, e) from None


def restore(trainer, path: str, comm) -> dict:
    return checkpoint.restore_replica(path, trainer.named_state(), trainer.named_state(),
                                      trainer.ranker.config.checkpoint_shape(),
                                      trainer.optimizer, comm=comm)


def batches(rows: dict, comm, features=None, shuffle_seed=None, size=None) -> RowBatches:
    picked = {k: v for k, v in rows.items() if features is None or k in features}
    return RowBatches(picked, size or F.eval_batch_size, comm, shuffle_seed=shuffle_seed)


def train(trainer, data, evaluation: dict, comm, logger) -> dict:
    where = paths()
    position = restore(trainer, where["checkpoint"], comm) if F.resume else \
        {"epoch": 0, "step": 0}
    validation, test = (batches(evaluation[m], comm) for m in ("validation", "test"))

    def save(path, position):
        checkpoint.save_replica(path, trainer.named_state(), comm, position,
                                trainer.ranker.config.checkpoint_shape(), trainer.optimizer)
    config = loop.LoopConfig(epochs=F.epochs, batch_size=F.batch_size, print_freq=F.print_freq,
                             max_steps=F.max_steps, selection_metric=selection_metric(),
                             keep_best=True, early_stopping_patience=F.early_stopping_patience,
                             checkpoint_steps=F.checkpoint_steps, checkpoint_every_epoch=True)
    final, _ = loop.train(trainer, data, lambda: trainer.evaluate(validation.epoch()), logger,
                          config, position,
                          loop.Checkpoints(where["checkpoint"], save,
                                           lambda path: restore(trainer, path, comm)),
                          lambda: trainer.evaluate(test.epoch()))
    return final


def evaluate_kept(trainer, evaluation: dict, comm, logger) -> dict:
    position = restore(trainer, paths()["checkpoint"], comm)
    chosen = position.get("selection") or {}
    final = {"best_epoch": chosen.get("best_epoch", position["epoch"]),
             "selected_on": chosen.get("metric", selection_metric())}
    for mapping, prefix in (("validation", ""), ("test", "test_")):
        figures = trainer.evaluate(batches(evaluation[mapping], comm).epoch())
        loop.log_result(logger, mapping, figures)
        final.update({f"{prefix}{k}": v for k, v in figures.items()})
    return final


def attributes_of(spec):
    """The dataset's item attributes when --item_attributes asks for them (else None)."""
    return requested_item_attributes(spec, F.dataset_dir) if F.item_attributes else None


def run(spec, comm, logger) -> None:
    retrieval = load_retrieval(F.retrieval_dir, spec)
    c, attributes = retrieval.config, attributes_of(spec)
    ranker = Ranker(RankerConfig(ranker=F.ranker, items=c.items, length=c.length, width=c.width,
                                 blocks=F.num_blocks, heads=F.num_heads, dropout=F.dropout_rate,
                                 attributes=attributes.count if attributes else 0, seed=F.seed),
                    retrieval.items.numpy() if F.start_from_retrieval else None,
                    attributes.table if attributes else None)
    stage = Candidates(retrieval, min(F.candidates, c.items - 1), F.eval_batch_size,
                       F.filter_seen)
    data = batches(training_rows(spec, stage, c.length, logger), comm, TRAINING_FEATURES,
                   F.seed, F.batch_size) if F.mode == "train" else None
    steps = F.epochs * len(data) if data else 0
    trainer = RankingTrainer(ranker, comm, LearningRateSchedule(
        F.lr, warmup_steps=0, decay_start_step=0, decay_steps=steps, decay_power=1.0),
                             stage.k, F.seed)
    if F.mode == "export":
        restore(trainer, paths()["checkpoint"], comm)
        if comm.rank == 0:
            k = export.export(retrieval, ranker, paths()["saved_model"], stage.k, F.top_k,
                              F.filter_seen)
            logger.print(f"exported {paths()['saved_model']} (retrieval's top {stage.k} of "
                         f"{c.items} items reranked, the best {k} served)")
        return
    evaluation = {m: evaluation_rows(spec, m, stage, c.length, logger)
                  for m in ("validation", "test")}
    final = train(trainer, data, evaluation, comm, logger) if F.mode == "train" else \
        evaluate_kept(trainer, evaluation, comm, logger)
    if comm.rank == 0:
        save_results(final, {m: retrieval_figures(rows) for m, rows in evaluation.items()})
        logger.print(f"wrote {paths()['results']}")


def work() -> None:
    if os.path.exists(F.output_dir) and not os.path.isdir(F.output_dir):
        raise FileError(f"--output_dir {F.output_dir} is a file, not a directory")
    comm = make_communicator(F.cpu)
    tf.random.set_seed(F.seed)
    tf.config.experimental.enable_op_determinism()
    spec = load_spec(F.dataset_dir, RETRIEVAL_CONTRACT, F.feature_spec)
    where = paths()
    with outputs.claimed(comm, outputs.mode_paths(where, F.mode)):
        if F.mode == "train":
            outputs.start_training(where, comm, F.resume, F.overwrite,
                                   "pass --resume to continue it or --overwrite to replace it")
        logger = DLLogger(where["log"] if F.mode == "train" else os.devnull,
                          enabled=comm.rank == 0)
        logger.parameters({f.name: f.value
                           for f in F.get_flags_for_module(sys.modules[__name__])})
        run(spec, comm, logger)
        if F.mode == "train" and comm.rank == 0:
            plot_log.plot(where["log"], where["curves"])
        logger.close()


def main(argv) -> int:
    """Errors of the inputs and outputs end the run with one line."""
    return run_cli(work, errors=(ValueError, OSError))


if __name__ == "__main__":
    app.run(lambda argv: exit_process(main(argv)), flags_parser=parse_flags)
