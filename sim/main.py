"""SIM, DIEN, DIN and the HSTU ranker on TFRecord data: train (test AUC every epoch) or
benchmark inference.

  python -m sim.main --dataset_dir DATA --cpu
  horovodrun -np 2 -H localhost:2 python -m sim.main --dataset_dir DATA --cpu [--sharding row_wise]
"""
from __future__ import annotations

import os
import sys

from core import runtime

runtime.import_tensorflow()  # its settings first

# flake8: noqa: E402 (imports after the runtime settings)
import numpy as np
import tensorflow as tf
from absl import app, flags

from core import plot_log
from core.cli import exit_process, parse_flags, run_cli
from core.dllog import DLLogger
from core.dynamic_flags import define_dynamic_flags, with_dynamic_flags
from core.feature_spec import VALIDATION_MAPPING
from core.parallel.comm import make_communicator
from core.parallel.placement import (ROUTED_REPLICATED_ELEMENTS, SHARDING_KINDS,
                                     describe_routed_tables, plan_routed_tables)
from core.pipelines import DictPipeline, MappedPipeline, reader_errors_surfaced
from core.sources import load_spec
from sim import export
from sim.contract import SIM_CONTRACT
from sim.data import model_shape, open_mapping
from sim.model import SimConfig, SimModel
from sim.trainer import SimTrainer, model_variables, step_batch
from training import checkpoint, loop, outputs
from training.engine import DEFAULT_DIVERGENCE_FACTOR
from training.export import export_saved_model
from training.selection import best_state_path

F = flags.FLAGS
flags.DEFINE_enum("mode", "train", ["train", "inference"], "train, or benchmark inference "
                  "(of --load_checkpoint_path when given, else of a random model)")
flags.DEFINE_enum("model_type", "sim", ["sim", "dien", "din", "hstu"], "sim: long + short "
                  "history; dien: the short history; din: the whole history; hstu: the "
                  "target-aware HSTU ranker over the whole history")
flags.DEFINE_string("dataset_dir", None, "Directory of the TFRecord dataset")
flags.DEFINE_string("feature_spec", "feature_spec.yaml", "Spec, relative to --dataset_dir")
flags.DEFINE_integer("global_batch_size", 131072, "Batch size over all processes", lower_bound=1)
flags.DEFINE_integer("epochs", 3, "Passes over the training data", lower_bound=0)
flags.DEFINE_float("lr", 0.01, "Learning rate")
flags.DEFINE_float("divergence_factor", DEFAULT_DIVERGENCE_FACTOR, "A loss above this many "
                   "times the first step's loss ends the run as diverged, like a non-finite "
                   "loss (0: only a non-finite loss)")
flags.DEFINE_enum("optimizer", "adam", ["adam", "lazy_adam", "sgd"], "adam (lazy rows for "
                  "tables; lazy_adam: the same) or sgd")
flags.DEFINE_float("weight_decay", 0.0, "Decoupled weight decay (adam)")
define_dynamic_flags("Features (or 'all') whose tables learn their ids "
                     "(open vocabulary; an item feature's target and histories share its map)")
flags.DEFINE_enum("sharding", "auto", list(SHARDING_KINDS), "Where the tables live under "
                  "several processes: data_parallel (every process holds every table), "
                  "row_wise (each table's rows split over the processes), table_wise (whole "
                  "tables spread over them), auto (tables of up to "
                  f"{ROUTED_REPLICATED_ELEMENTS:,d} elements data_parallel, larger ones "
                  "row_wise); column_wise is refused")
flags.DEFINE_enum("table_updates", "lazy", ["lazy", "dense"], "lazy: the optimizer updates "
                  "the table rows a batch looks up (moments included); dense: every row each "
                  "step, as the reference's AdamW on dense table gradients (slower)")
flags.DEFINE_float("dropout_rate", -1.0, "Dropout before the scorer of every MLP (reference; "
                   "compact: on the stage-two MLP input); -1: off")
flags.DEFINE_bool("amp", False, "bfloat16 (CPU) / float16 (GPU) compute; tables stay float32")
flags.DEFINE_bool("xla", False, "JIT-compile everything after the lookups with XLA")
flags.DEFINE_bool("drop_remainder", False, "Drop the last partial training batch")
flags.DEFINE_bool("disable_cache", False, "Re-read the training and test data at every "
                  "epoch instead of keeping them in memory")
flags.DEFINE_integer("repeat_count", 0, "Passes over the training data per epoch (0 or 1: "
                     "one)", lower_bound=0)
flags.DEFINE_integer("prefetch_train_size", -1, "Training batches prepared ahead (-1: "
                     "autotune)", lower_bound=-1)
flags.DEFINE_integer("prefetch_test_size", -1, "Test batches prepared ahead (-1: autotune)",
                     lower_bound=-1)
flags.DEFINE_integer("prebatch_train_size", 0, "Rows per TFRecord record of the training data "
                     "(NVIDIA's prebatched files; 0: the spec's metadata.prebatch_size, else "
                     "detected from the first record)", lower_bound=0)
flags.DEFINE_integer("prebatch_test_size", 0, "The same for the test data", lower_bound=0)
flags.DEFINE_integer("num_parallel_calls", None, "Batches read in parallel (default: "
                     "autotuned by tf.data)", lower_bound=1)
flags.DEFINE_enum("affinity", "socket_unique_interleaved",
                  ["socket", "single", "single_unique", "socket_unique_interleaved",
                   "socket_unique_continuous", "disabled"],
                  "GPU-to-CPU affinity of NVIDIA's launcher; accepted, not applied (see README)")
flags.DEFINE_integer("train_dataset_size", 0, "Train on the first batches covering this many "
                     "rows per epoch (0: all)", lower_bound=0)
flags.DEFINE_integer("long_seq_length", 90, "Older behaviours in the long part (SIM)",
                     lower_bound=1)
flags.DEFINE_integer("embedding_dim", 16, "Width of every embedding table", lower_bound=1)
flags.DEFINE_enum("item_item_interaction", "dot", ["dot", "activation_unit"],
                  "Attention scores of DIN, SIM's GSU and ESU: dot (NVIDIA's: target . "
                  "behaviour) or activation_unit (this toolkit's earlier MLP scorer)")
flags.DEFINE_enum("architecture", "reference", ["reference", "compact"],
                  "reference: NVIDIA's model layer by layer (PReLU MLPs, GRU/AUGRU 6 x "
                  "--embedding_dim wide, DIEN attention with target adaptation); compact: "
                  "this toolkit's earlier model (ReLU, item-wide GRU/AUGRU, target * pooled "
                  "inputs). See sim/README.md")
flags.DEFINE_list("stage_one_mlp_dims", ["200"], "GSU head widths (and the GSU scorer's with "
                  "--item_item_interaction activation_unit)")
flags.DEFINE_list("stage_two_mlp_dims", ["200", "80"], "Final MLP widths (then 1 logit)")
flags.DEFINE_list("aux_mlp_dims", ["100", "50"], "DIEN auxiliary network widths")
flags.DEFINE_integer("num_blocks", 2, "HSTU ranker layers (--model_type hstu)", lower_bound=1)
flags.DEFINE_integer("num_heads", 1, "HSTU ranker attention heads (--model_type hstu; they "
                     "split the item width: --embedding_dim x item features)", lower_bound=1)
flags.DEFINE_integer("gsu_top_k", 50, "Long behaviours the GSU selects for the ESU (the "
                     "reference's hard-coded k)", lower_bound=1)
flags.DEFINE_string("results_dir", "results", "Directory of the log and curves")
flags.DEFINE_string("log_filename", "log.json", "DLLogger log, in --results_dir")
flags.DEFINE_string("save_checkpoint_path", None, "Save a checkpoint here after training")
flags.DEFINE_string("load_checkpoint_path", None, "Resume from / infer with this checkpoint")
flags.DEFINE_bool("keep_best", False, "End training on the best evaluation's state (highest "
                  "AUC): the checkpoint and --export_path's SavedModel are that state (kept "
                  "beside --save_checkpoint_path as <path>.best while training). Off by "
                  "default, as NVIDIA's command lines end on the last epoch")
flags.DEFINE_integer("early_stopping_patience", 0, "Stop training after this many "
                     "evaluations without a higher AUC (0: never)", lower_bound=0)
flags.DEFINE_string("export_path", None, "Also write a SavedModel here after training")
flags.DEFINE_bool("benchmark", False, "Time training steps; report samples/s")
flags.DEFINE_integer("benchmark_warmup_steps", 20, "Untimed steps before benchmarking",
                     lower_bound=0)
flags.DEFINE_integer("benchmark_steps", 200, "Timed steps", lower_bound=1)
flags.DEFINE_integer("inter_op_parallelism", 0, "TensorFlow inter-op threads (0: default)",
                     lower_bound=0)
flags.DEFINE_integer("intra_op_parallelism", 0, "TensorFlow intra-op threads (0: default)",
                     lower_bound=0)
flags.DEFINE_integer("seed", -1, "Seed of initialisation and dropout (runs with the same seed "
                     "are bit-identical on CPU); -1: a random seed, logged", lower_bound=-1)
flags.DEFINE_integer("print_freq", 10, "Progress line every this many steps", lower_bound=1)
flags.DEFINE_bool("cpu", False, "Hide GPUs")
flags.mark_flag_as_required("dataset_dir")


def configure_tensorflow():
    if F.inter_op_parallelism:
        tf.config.threading.set_inter_op_parallelism_threads(F.inter_op_parallelism)
    if F.intra_op_parallelism:
        tf.config.threading.set_intra_op_parallelism_threads(F.intra_op_parallelism)
    tf.random.set_seed(F.seed)
    tf.config.experimental.enable_op_determinism()


def resolve_seed() -> int:
    """--seed -1: a random seed (rank 0's, for every rank), to be logged with the flags."""
    if F.seed < 0:
        F.seed = int(np.random.SeedSequence().entropy % (2 ** 31))
    return F.seed


def build(spec, comm, logger):
    config = SimConfig(**model_shape(spec), model_type=F.model_type,
                       long_seq_length=F.long_seq_length, embedding_dim=F.embedding_dim,
                       stage_one_mlp_dims=_ints(F.stage_one_mlp_dims),
                       stage_two_mlp_dims=_ints(F.stage_two_mlp_dims),
                       aux_mlp_dims=_ints(F.aux_mlp_dims), gsu_top_k=F.gsu_top_k,
                       dropout_rate=F.dropout_rate, seed=F.seed,
                       item_item_interaction=F.item_item_interaction,
                       architecture=F.architecture, hstu_blocks=F.num_blocks,
                       hstu_heads=F.num_heads)
    optimizer = "adam" if F.optimizer == "lazy_adam" else F.optimizer
    names, rows = zip(*config.table_rows())
    widths = [config.embedding_dim] * len(rows)
    placement = plan_routed_tables(rows, widths, comm.size, F.sharding, hashed_tables=[
        t for t, dynamic in enumerate(config.dynamic) if dynamic])
    if comm.size > 1:
        logger.print(describe_routed_tables(names, placement, widths, comm.size))
    trainer = SimTrainer(SimModel(config, placement=placement, comm=comm), comm, optimizer,
                         F.lr, F.weight_decay, F.amp, F.xla, F.seed, F.divergence_factor,
                         F.table_updates)
    split = trainer.row_ranges()
    comm.broadcast_variables([v for n, v in trainer.variables().items() if n not in split])
    return trainer


def whole_model(trainer, comm):
    """The trained model with every table whole, on rank 0 (None elsewhere): the model, or,
    when tables are split over the ranks, a copy of it with their rows gathered."""
    model = trainer.model
    if not model.routed_tables():
        return model if comm.rank == 0 else None
    arrays = checkpoint.gathered_arrays(trainer.variables(), trainer.row_ranges(), comm)
    maps = checkpoint.gathered_maps(trainer.dynamic_tables(), trainer.row_ranges(), comm)
    if comm.rank != 0:
        return None
    whole = SimModel(model.config)
    variables = model_variables(whole)
    for name, var in variables.items():
        var.assign(arrays[name])
    checkpoint.load_maps(maps, {n: (whole.dynamic[n], entries) for n, (_, entries)
                                in trainer.dynamic_tables().items()},
                         arrays, variables, 0, 1, F.export_path)
    return whole


def _ints(values):
    return tuple(int(v) for v in values)


def pipelines(spec, comm):
    """Training batches, and a function giving the batches of an evaluation mapping (each
    cached unless --disable_cache), as the SIM trainer takes them."""
    train = open_mapping(spec, "train", F.global_batch_size, comm, F.drop_remainder,
                         F.prebatch_train_size)
    labels, parallel = (spec.label_feature,), F.num_parallel_calls or tf.data.AUTOTUNE
    train = DictPipeline(train, labels, F.prefetch_train_size, parallel)

    def evaluation(mapping: str):
        batches = DictPipeline(open_mapping(spec, mapping, F.global_batch_size, comm,
                                            prebatch=F.prebatch_test_size),
                               labels, F.prefetch_test_size, parallel).epoch()
        if not F.disable_cache:
            batches = batches.cache()
        return lambda: (step_batch(spec, batch) for batch in batches)
    return (MappedPipeline(train, lambda batch: step_batch(spec, batch),
                           cache=not F.disable_cache), evaluation)


def loop_config():
    batches = -(-F.train_dataset_size // F.global_batch_size) if F.train_dataset_size else 0
    return loop.LoopConfig(epochs=F.epochs, batch_size=F.global_batch_size, print_freq=F.print_freq,
                      batches_per_epoch=batches, repeat_count=max(F.repeat_count, 1),
                      benchmark_warmup_steps=F.benchmark_warmup_steps,
                      benchmark_steps=F.benchmark_steps if F.benchmark else 0,
                      keep_best=F.keep_best, early_stopping_patience=F.early_stopping_patience)


def restore(trainer, path: str, comm) -> dict:
    return checkpoint.restore_replica(
        path, trainer.variables(), trainer.named_state(),
        trainer.model.config.checkpoint_shape(), trainer.optimizer,
        # fields older checkpoints lack
        dynamic_tables=trainer.dynamic_tables(),
        model_defaults={"dynamic": [], "item_item_interaction": "activation_unit",
                        "architecture": "compact"}, row_ranges=trainer.row_ranges(),
        comm=comm)


def run(spec, comm, logger):
    if F.keep_best and F.mode == "train" and not F.save_checkpoint_path:
        raise ValueError("--keep_best needs --save_checkpoint_path (the best evaluation's "
                         "state is kept beside it)")
    trainer = build(spec, comm, logger)
    position = {"epoch": 0, "step": 0}
    if F.load_checkpoint_path:
        position = restore(trainer, F.load_checkpoint_path, comm)
    train, evaluation = pipelines(spec, comm)
    test = evaluation("test")
    if F.mode == "inference":
        loop.log_result(logger, "inference", loop.benchmark_inference(
            trainer, test(), F.benchmark_steps, F.benchmark_warmup_steps))
        return
    def save(path, position):
        checkpoint.save_replica(path, trainer.named_state(), comm, position,
                                trainer.model.config.checkpoint_shape(), trainer.optimizer,
                                trainer.dynamic_tables(), trainer.row_ranges())
    # with a validation split, model selection reads it and the test data is held out
    selection, held_out_test = test, None
    if VALIDATION_MAPPING in spec.mappings:
        selection = evaluation(VALIDATION_MAPPING)
        held_out_test = lambda: loop.evaluate(trainer, test())  # noqa: E731
    loop.train(trainer, train, lambda: loop.evaluate(trainer, selection()), logger,
               loop_config(), position,
               loop.Checkpoints(F.save_checkpoint_path, save,
                                lambda path: restore(trainer, path, comm)),
               held_out_test)
    model = whole_model(trainer, comm) if F.export_path else None
    if model is not None:
        export_saved_model(model, *export.serving(model, spec), F.export_path, "sim_serving")


def written_paths() -> list:
    """What training writes (taken at its start: one writer per path)."""
    if F.mode != "train":
        return []
    best = [best_state_path(F.save_checkpoint_path)] if F.keep_best and \
        F.save_checkpoint_path else []
    return [F.save_checkpoint_path, F.export_path] + best


def main(argv) -> int:
    """Errors of the inputs (spec, data, flags, checkpoint) end the run with one line."""

    def work():  # FeatureSpecError, DatasetError, SimDataError, CheckpointError...
        with reader_errors_surfaced():
            train_or_infer()
    return run_cli(work, errors=(ValueError,))


def train_or_infer():
    comm = make_communicator(F.cpu)  # --cpu: hides the GPUs before TensorFlow starts
    F.seed = int(comm.broadcast_from_root(np.int64(resolve_seed())))
    configure_tensorflow()
    log_path = os.path.join(F.results_dir, F.log_filename)
    logger = DLLogger(log_path, enabled=comm.rank == 0)
    logger.parameters({f.name: f.value for f in F.get_flags_for_module(sys.modules[__name__])})
    spec = with_dynamic_flags(load_spec(F.dataset_dir, SIM_CONTRACT, F.feature_spec))
    with outputs.claimed(comm, written_paths()):
        run(spec, comm, logger)
    if F.mode == "train" and comm.rank == 0:
        plot_log.plot(log_path, os.path.join(F.results_dir, "curves.png"))
    logger.close()


if __name__ == "__main__":
    app.run(lambda argv: exit_process(main(argv)), flags_parser=parse_flags)
