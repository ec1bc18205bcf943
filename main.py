"""DLRM / DCNv2 for TensorFlow 2: train, evaluate, benchmark inference and export.

Examples:
  python main.py --dataset_path /data/dlrm --cpu
  python main.py --dataset_type synthetic --synthetic_dataset_cardinalities 1000,1000,1000 --cpu
  horovodrun -np 2 -H localhost:2 python main.py --dataset_path /data/dlrm --cpu
"""
from __future__ import annotations

import sys

from core import runtime

runtime.import_tensorflow()  # its settings first

# flake8: noqa: E402 (imports after the runtime settings)
from absl import app, flags

import export
from core.cli import exit_process, parse_flags, run_cli
from core.dllog import DLLogger
from core.dynamic_flags import with_dynamic_flags
from core.feature_spec import (TEST_MAPPING, TRAIN_MAPPING, VALIDATION_MAPPING, DynamicSpec,
                               FeatureSpec, FeatureSpecError)
from core.parallel.comm import make_communicator
from core.parallel.placement import SHARDING_KINDS, make_plan
from core.pipelines import reader_errors_surfaced
from core.sources import DatasetError, load_spec
from dataloader import BatchPipeline, make_source
from dlrm_contract import CRITEO_VARIANTS, DLRM_CONTRACT, criteo_variant
from interaction import INTERACTIONS, resolve_interaction, select_dot_implementation
from lr_scheduler import schedule_from_flags
from model import DLRM, ModelConfig
from trainer import DlrmTrainer
from training import checkpoint, loop, outputs
from training.checkpoint import CheckpointError
from training.engine import DEFAULT_DIVERGENCE_FACTOR
from training.export import export_saved_model
from training.selection import best_state_path

FLAGS = flags.FLAGS

flags.DEFINE_enum("mode", "train", ["train", "eval", "inference", "deploy"],
                  "train (with periodic evaluation), eval (AUC of a restored checkpoint), "
                  "inference (latency/throughput benchmark) or deploy (export a SavedModel)")
flags.DEFINE_string("dataset_path", None, "Directory of a split-binary dataset")
flags.DEFINE_string("feature_spec", "feature_spec.yaml",
                    "FeatureSpec yaml, relative to --dataset_path unless absolute")
flags.DEFINE_enum("dataset_type", "tf_raw", ["tf_raw", "synthetic"],
                  "tf_raw: split-binary files; synthetic: fresh random batches every step")
flags.DEFINE_integer("batch_size", 65536, "Global training batch size (all processes)")
flags.DEFINE_integer("valid_batch_size", 65536, "Global evaluation / inference batch size")
flags.DEFINE_integer("epochs", 1, "Number of passes over the training data")
flags.DEFINE_integer("max_steps", -1, "Stop training after this many steps (-1: no limit); "
                     "in --mode inference the number of timed batches (-1 means 1000)")
flags.DEFINE_integer("evals_per_epoch", 1, "Evaluations per epoch (the last at its end)")
flags.DEFINE_enum("optimizer", "sgd", ["sgd", "adam"],
                  "sgd for every variable, or adam for dense layers + lazy adam for tables")
flags.DEFINE_float("learning_rate", 24.0, "Peak learning rate")
flags.DEFINE_integer("warmup_steps", 8000, "Linear warmup from 0 over this many steps")
flags.DEFINE_integer("decay_start_step", 48000, "Step where polynomial decay starts")
flags.DEFINE_integer("decay_steps", 24000, "Length of the decay to 0 (power 2); 0: no decay")
flags.DEFINE_bool("amp", False, "Mixed precision: float16 compute on GPUs, bfloat16 on "
                  "CPUs; tables stay float32; float16 uses dynamic loss scaling")
flags.DEFINE_float("loss_scale", None, "A static loss scale for --amp instead of the "
                   "default (dynamic for float16, none for bfloat16)")
flags.DEFINE_float("divergence_factor", DEFAULT_DIVERGENCE_FACTOR, "A loss above this many "
                   "times the first step's loss ends the run as diverged, like a non-finite "
                   "loss (0: only a non-finite loss)")
flags.DEFINE_bool("xla", False, "JIT-compile the dense part of the training step with XLA")
flags.DEFINE_bool("run_eagerly", False, "Run steps eagerly (debugging)")
flags.DEFINE_bool("cpu", False, "Run on CPU even when GPUs are present")
flags.DEFINE_integer("print_freq", 1000, "Print and log progress every this many steps")
flags.DEFINE_integer("benchmark_warmup_steps", 100, "Training steps not timed for the final "
                     "throughput (the seed's warm-up); --mode inference times the batches "
                     "after 10 warm-up batches")
flags.DEFINE_float("collective_timeout_s", 300, "Several processes: a rank that waits "
                   "longer than this on collectives names them, the step and the ranks it "
                   "waits for, and ends the job with a non-zero status (0: wait forever)")
flags.DEFINE_integer("embedding_dim", 128, "Width of every embedding vector")
flags.DEFINE_list("bottom_mlp_dims", ["512", "256", "128"], "Bottom MLP widths")
flags.DEFINE_list("top_mlp_dims", ["1024", "1024", "512", "256", "1"], "Top MLP widths")
flags.DEFINE_bool("embedding_trainable", True, "Train the embedding tables")
flags.DEFINE_enum("interaction", "dot", list(INTERACTIONS),
                  "dot (DLRM) or cross (DCNv2); the DLRM_and_DCNv2 tree's dot_custom_cuda and "
                  "dot_tensorflow mean dot with that --dot_interaction")
flags.DEFINE_integer("num_cross_layers", 3, "DCNv2 cross layers")
flags.DEFINE_integer("cross_layer_projection_dim", 512, "DCNv2 low-rank projection width")
flags.DEFINE_enum("dot_interaction", "auto", ["auto", "custom_cuda", "tensorflow"],
                  "Dot interaction implementation: auto uses the CUDA op when it is loaded "
                  "and a GPU is used")
flags.DEFINE_integer("seed", 12345, "Seed of initialisation, synthetic data and shuffling")
flags.DEFINE_bool("shuffle_batch_order", False, "Shuffle the order of training batches "
                  "(seeded per epoch)")
flags.DEFINE_list("dynamic_features", [], "Categorical features (or 'all') whose tables "
                  "learn their ids (open vocabulary; the spec's cardinality is the capacity)")
flags.DEFINE_integer("dynamic_min_count", 1, "--dynamic_features: occurrences before an id "
                     "gets a row of its own (until then it reads the rare row 0)")
flags.DEFINE_integer("dynamic_pending_per_row", DynamicSpec.pending_per_row,
                     "--dynamic_min_count > 1: ids waiting for it that a table remembers, per "
                     "row of its capacity (about 66 bytes each; the oldest is forgotten)")
flags.DEFINE_string("save_checkpoint_path", None, "Save a checkpoint here at the end")
flags.DEFINE_integer("checkpoint_steps", 0, "Also save every this many steps (0: only at "
                     "the end)")
flags.DEFINE_string("restore_checkpoint_path", None, "Restore (and resume from) this "
                    "checkpoint")
flags.DEFINE_bool("continue_on_new_data", False, "With --restore_checkpoint_path: keep the "
                  "weights, optimizer state and dynamic tables' maps, and train --epochs over "
                  "--dataset_path from step 0 (continuous training; the schedule restarts)")
flags.DEFINE_bool("keep_best", False, "End training on the best evaluation's state (highest "
                  "validation AUC): the final checkpoint, and so --mode deploy's SavedModel, "
                  "is that state (kept beside --save_checkpoint_path as <path>.best while "
                  "training). Off by default: NVIDIA's command lines end on the last step")
flags.DEFINE_integer("early_stopping_patience", 0, "Stop training after this many "
                     "evaluations without a higher validation AUC (0: never)")
flags.DEFINE_string("saved_model_output_path", None, "--mode deploy: SavedModel directory")
flags.DEFINE_string("log_path", "dlrm_tf_log.json", "DLLogger JSON-lines log file")
flags.DEFINE_bool("print_plan", False, "Print the table placement plan and exit (no data "
                  "is read, nothing is trained): table -> kind, ranks, bytes per rank and "
                  "bytes exchanged per step for --batch_size")
flags.DEFINE_list("plan_world_sizes", [], "--print_plan: plan for these world sizes instead "
                  "of the launched one (e.g. 8,64,512: size a cluster from here)")
flags.DEFINE_enum("plan_shape", None, sorted(CRITEO_VARIANTS), "--print_plan: the tables of "
                  "one of NVIDIA's named Criteo shapes instead of the data's FeatureSpec")
flags.DEFINE_enum("sharding", "auto", list(SHARDING_KINDS), "Placement of every table: auto "
                  "(the planner's choice) or one kind forced on every table it can hold")
flags.DEFINE_float("memory_budget_gb", 0.0, "Embedding-table memory per process in GiB the "
                   "planner must respect (0: no limit); under auto a table that fits no "
                   "process is split by columns, then by rows")
flags.DEFINE_integer("column_slice_threshold", 0, "Split tables with more elements than "
                     "this by columns across processes (0: never)")
flags.DEFINE_integer("data_parallel_threshold", 0, "Replicate tables with at most this "
                     "many elements on every process (0: never)")
flags.DEFINE_float("cpu_offloading_threshold_gb", 0.0, "On GPU machines, keep tables "
                   "larger than this in host memory (0: never); no effect with --cpu")
flags.DEFINE_list("synthetic_dataset_cardinalities", ["100000"] * 26,
                  "Synthetic data: cardinality of each categorical feature")
flags.DEFINE_integer("synthetic_dataset_num_numerical_features", 13,
                     "Synthetic data: number of numerical features")
flags.DEFINE_bool("synthetic_dataset_use_feature_spec", False,
                  "Synthetic data: take the shape from --feature_spec instead")
flags.DEFINE_integer("synthetic_dataset_train_batches", 64, "Synthetic batches per epoch")
flags.DEFINE_integer("synthetic_dataset_valid_batches", 8, "Synthetic evaluation batches")
flags.DEFINE_float("synthetic_dataset_signal_strength", 0.0, "Synthetic data: strength of "
                   "the planted label signal (0: labels independent of features)")
flags.DEFINE_float("synthetic_dataset_power_law_alpha", 1.2, "Synthetic data: power-law "
                   "exponent of categorical ids (1 = uniform)")


class UsageError(ValueError):
    pass


def _ints(values, flag):
    try:
        return tuple(int(v) for v in values)
    except ValueError:
        raise UsageError(f"--{flag} must be comma-separated integers, found "
                         f"{','.join(values)}") from None


def check_flags(world_size: int) -> None:
    if FLAGS.batch_size < 1 or FLAGS.valid_batch_size < 1:
        raise UsageError("--batch_size and --valid_batch_size must be positive")
    if FLAGS.batch_size < world_size:
        raise UsageError(f"--batch_size {FLAGS.batch_size} is smaller than the number of "
                         f"processes ({world_size}): every process needs rows")
    if FLAGS.evals_per_epoch < 1:
        raise UsageError(f"--evals_per_epoch must be >= 1, found {FLAGS.evals_per_epoch}")
    if FLAGS.epochs < 1:
        raise UsageError(f"--epochs must be >= 1, found {FLAGS.epochs}")
    if FLAGS.dataset_type == "tf_raw" and not FLAGS.dataset_path and not FLAGS.plan_shape:
        raise UsageError("--dataset_path is required with --dataset_type tf_raw "
                         "(or use --dataset_type synthetic)")
    if FLAGS.mode == "deploy" and not FLAGS.saved_model_output_path:
        raise UsageError("--mode deploy needs --saved_model_output_path")
    if FLAGS.mode == "deploy" and world_size > 1:
        raise UsageError("--mode deploy runs in one process: restore the checkpoint there "
                         "(checkpoints do not depend on the number of processes)")
    if FLAGS.keep_best and FLAGS.mode == "train" and not FLAGS.save_checkpoint_path:
        raise UsageError("--keep_best needs --save_checkpoint_path (the best evaluation's "
                         "state is kept beside it)")
    if FLAGS.early_stopping_patience < 0:
        raise UsageError(f"--early_stopping_patience must be >= 0, found "
                         f"{FLAGS.early_stopping_patience}")
    if FLAGS.loss_scale is not None and FLAGS.loss_scale <= 0:
        raise UsageError(f"--loss_scale must be positive, found {FLAGS.loss_scale}")


def dataset_spec():
    """The data's spec, with --dynamic_features turned dynamic."""
    spec = spec_of_the_data()
    if not FLAGS.dynamic_features:
        return spec
    if FLAGS.dynamic_min_count < 1:
        raise UsageError(f"--dynamic_min_count must be >= 1, found {FLAGS.dynamic_min_count}")
    if FLAGS.dynamic_pending_per_row < 1:
        raise UsageError(f"--dynamic_pending_per_row must be >= 1, found "
                         f"{FLAGS.dynamic_pending_per_row}")
    return with_dynamic_flags(spec)


def spec_of_the_data():
    if FLAGS.dataset_type == "tf_raw" or FLAGS.synthetic_dataset_use_feature_spec:
        base = FLAGS.dataset_path or "."
        return load_spec(base, DLRM_CONTRACT, FLAGS.feature_spec)
    cardinalities = _ints(FLAGS.synthetic_dataset_cardinalities,
                          "synthetic_dataset_cardinalities")
    if any(c < 1 for c in cardinalities):
        raise UsageError(f"--synthetic_dataset_cardinalities must be positive, found "
                         f"{list(cardinalities)}")
    return FeatureSpec.get_default(FLAGS.synthetic_dataset_num_numerical_features,
                                   cardinalities)


def placement(cardinalities, world_size: int, dynamic=()):
    """dynamic: per table a DynamicSpec or None (dynamic tables are split by id hash)."""
    return make_plan(cardinalities, FLAGS.embedding_dim, world_size,
                     FLAGS.column_slice_threshold, FLAGS.data_parallel_threshold,
                     FLAGS.sharding, int(FLAGS.memory_budget_gb * 2**30),
                     hashed_tables=[t for t, d in enumerate(dynamic) if d])


def print_plans(logger, launched_world_size: int) -> None:
    """Plan-only mode: the plans of the data's tables (or a named Criteo shape) for the
    launched world size or --plan_world_sizes; nothing is read or trained."""
    dynamic = ()
    if FLAGS.plan_shape:
        cardinalities = criteo_variant(FLAGS.plan_shape).cardinalities
    else:
        spec = dataset_spec()
        cardinalities = spec.cardinalities
        dynamic = [spec.dynamic(f) for f in spec.categorical_features]
    sizes = _ints(FLAGS.plan_world_sizes, "plan_world_sizes") or (launched_world_size,)
    if any(n < 1 for n in sizes):
        raise UsageError(f"--plan_world_sizes must be positive, found {list(sizes)}")
    parameters = sum(cardinalities) * FLAGS.embedding_dim
    logger.print(f"{len(cardinalities)} tables, {sum(cardinalities):,d} rows x "
                 f"{FLAGS.embedding_dim} = {parameters / 1e9:,.2f} B embedding parameters "
                 f"({parameters * 4 / 2**30:,.1f} GiB in float32)")
    for world_size in sizes:
        logger.print(placement(cardinalities, world_size, dynamic).describe(FLAGS.batch_size))


def build(comm, spec):
    interaction, dot_request = resolve_interaction(FLAGS.interaction, FLAGS.dot_interaction)
    config = ModelConfig(
        num_numerical=len(spec.numerical_features), cardinalities=tuple(spec.cardinalities),
        embedding_dim=FLAGS.embedding_dim,
        bottom_mlp_dims=_ints(FLAGS.bottom_mlp_dims, "bottom_mlp_dims"),
        top_mlp_dims=_ints(FLAGS.top_mlp_dims, "top_mlp_dims"),
        interaction=interaction, num_cross_layers=FLAGS.num_cross_layers,
        cross_layer_projection_dim=FLAGS.cross_layer_projection_dim,
        embedding_trainable=FLAGS.embedding_trainable, seed=FLAGS.seed,
        dynamic=tuple(spec.dynamic(f) for f in spec.categorical_features)).validate()
    if any(config.dynamic) and FLAGS.xla:
        raise UsageError("--xla compiles fixed shapes; dynamic tables change their map every "
                         "step: drop --xla or the dynamic features")
    plan = placement(config.cardinalities, comm.size, config.dynamic)
    dot = select_dot_implementation(dot_request, FLAGS.cpu,
                                    xla=FLAGS.xla and FLAGS.mode == "train",
                                    export=FLAGS.mode == "deploy")
    model = DLRM(config, plan, comm, dot,
                 offload_threshold_bytes=int(FLAGS.cpu_offloading_threshold_gb * 2**30))
    trainer = DlrmTrainer(model, FLAGS.optimizer, schedule_from_flags(FLAGS), amp=FLAGS.amp,
                          loss_scale=FLAGS.loss_scale, xla=FLAGS.xla,
                          run_eagerly=FLAGS.run_eagerly,
                          divergence_factor=FLAGS.divergence_factor)
    return plan, trainer


def pipeline(spec, plan, comm, mapping: str):
    training = mapping == TRAIN_MAPPING
    batch = FLAGS.batch_size if training else FLAGS.valid_batch_size
    batches = (FLAGS.synthetic_dataset_train_batches if training
               else FLAGS.synthetic_dataset_valid_batches)
    source = make_source(spec, plan, comm.rank, mapping,
                         batch, training, FLAGS.dataset_type, batches, FLAGS.seed,
                         FLAGS.synthetic_dataset_signal_strength,
                         FLAGS.synthetic_dataset_power_law_alpha, FLAGS.shuffle_batch_order)
    return BatchPipeline(source, spec.cardinalities)


def loop_config():
    return loop.LoopConfig(epochs=FLAGS.epochs, batch_size=FLAGS.batch_size,
                      print_freq=FLAGS.print_freq, evals_per_epoch=FLAGS.evals_per_epoch,
                      max_steps=max(FLAGS.max_steps, 0), checkpoint_steps=FLAGS.checkpoint_steps,
                      benchmark_warmup_steps=FLAGS.benchmark_warmup_steps,
                      keep_best=FLAGS.keep_best,
                      early_stopping_patience=FLAGS.early_stopping_patience)


def checkpoints(trainer) -> loop.Checkpoints:
    return loop.Checkpoints(FLAGS.save_checkpoint_path,
                            lambda path, position: checkpoint.save(path, trainer, position),
                            lambda path: checkpoint.restore(path, trainer))


def run_mode(trainer, spec, plan, comm, logger, position) -> None:
    if FLAGS.mode == "deploy":
        export_saved_model(trainer.model, *export.serving(trainer.model, spec),
                           FLAGS.saved_model_output_path)
        logger.print(f"SavedModel written to {FLAGS.saved_model_output_path}")
        return
    eval_pipe = pipeline(spec, plan, comm, TEST_MAPPING)
    if FLAGS.mode == "train":
        # with a validation split, selection reads it and the test data is held out
        selection_pipe, test = eval_pipe, None
        if FLAGS.dataset_type != "synthetic" and VALIDATION_MAPPING in spec.mappings:
            selection_pipe = pipeline(spec, plan, comm, VALIDATION_MAPPING)
            test = lambda: loop.evaluate(trainer, eval_pipe.epoch())  # noqa: E731
        loop.train(trainer, pipeline(spec, plan, comm, TRAIN_MAPPING),
                   lambda: loop.evaluate(trainer, selection_pipe.epoch()), logger,
                   loop_config(), position, checkpoints(trainer), test)
        return
    if FLAGS.mode == "eval":
        loop.log_result(logger, "eval", loop.evaluate(trainer, eval_pipe.epoch()))
    else:
        steps = FLAGS.max_steps if FLAGS.max_steps > 0 else 1000
        loop.log_result(logger, "inference",
                        loop.benchmark_inference(trainer, eval_pipe.epoch(), steps))


def main(argv):
    del argv
    # configures devices before any TensorFlow op
    comm = make_communicator(FLAGS.cpu, FLAGS.collective_timeout_s)
    check_flags(comm.size)  # before the log exists: a refused command line leaves no file
    logger = DLLogger(FLAGS.log_path, enabled=comm.rank == 0)
    try:
        if FLAGS.print_plan:
            print_plans(logger, comm.size)
            return 0
        with outputs.claimed(comm, written_paths()):
            build_and_run(comm, logger)
        return 0
    finally:
        logger.close()


def written_paths() -> list:
    """The paths this run writes (taken at its start: one writer per path)."""
    if FLAGS.mode == "deploy":
        return [FLAGS.saved_model_output_path]
    if FLAGS.mode != "train" or not FLAGS.save_checkpoint_path:
        return []
    return [FLAGS.save_checkpoint_path] + (
        [best_state_path(FLAGS.save_checkpoint_path)] if FLAGS.keep_best else [])


def build_and_run(comm, logger) -> None:
    """The model, restored when asked, and the mode run."""
    spec = dataset_spec()
    plan, trainer = build(comm, spec)
    own_flags = FLAGS.get_key_flags_for_module(sys.modules[__name__])
    logger.parameters({f.name: f.value for f in own_flags} | {"world_size": comm.size})
    position = {"step": 0, "epoch": 0, "batch_in_epoch": 0}
    if FLAGS.restore_checkpoint_path:
        position = checkpoint.restore(FLAGS.restore_checkpoint_path, trainer)
        logger.print(f"restored {FLAGS.restore_checkpoint_path} at step {position['step']}")
        if FLAGS.continue_on_new_data:
            position = {"step": 0, "epoch": 0, "batch_in_epoch": 0}
    with comm.waiting("the broadcast of the initial dense weights", 0):
        comm.broadcast_variables(list(trainer.model.dense_variables().values()))
    run_mode(trainer, spec, plan, comm, logger, position)


def run():

    def guarded(argv):
        def work():
            with reader_errors_surfaced():
                main(argv)  # training divergence is a ValueError (training/engine.py)
        exit_process(run_cli(work, errors=(UsageError, FeatureSpecError, DatasetError,
                                           CheckpointError, ValueError)))
    app.run(guarded, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
