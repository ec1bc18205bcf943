"""Train / evaluate / benchmark Wide & Deep on a parquet FeatureSpec dataset.

  python -m wide_and_deep.main --dataset_path DIR [--cpu] [--num_epochs 20] ...
  horovodrun -np N python -m wide_and_deep.main ... [--sharding row_wise]

Wiring only: flags -> objects -> loops.
"""
from __future__ import annotations

import argparse
import os

from core import runtime
from core.cli import exit_process, run_cli
from core.feature_spec import DynamicSpec
from core.parallel.placement import ROUTED_REPLICATED_ELEMENTS, SHARDING_KINDS


AFFINITIES = ("all", "single", "single_unique", "unique_interleaved", "unique_contiguous",
              "disabled")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--dataset_path", required=True, help="directory holding the feature spec and parquet")
    a("--fspec_file", default="feature_spec.yaml", help="spec file name inside --dataset_path")
    a("--embedding_sizes_file", help="yaml/json: feature name -> embedding dimension")
    a("--use_checkpoint", action="store_true", help="resume from / evaluate --model_dir")
    a("--model_dir", default="model", help="checkpoint and SavedModel directory")
    a("--results_dir", default="results", help="log and plots directory")
    a("--log_filename", default="log.json", help="DLLogger log inside --results_dir")
    a("--global_batch_size", type=int, default=131072, help="rows per step, all ranks")
    a("--eval_batch_size", type=int, default=131072, help="rows per evaluation batch")
    a("--num_epochs", type=int, default=20, help="training epochs")
    a("--cpu", action="store_true", help="hide GPUs")
    a("--amp", action="store_true", help="bfloat16 (CPU) / float16 (GPU) MLP")
    a("--xla", action="store_true", help="compile the dense part with XLA")
    a("--linear_learning_rate", type=float, default=0.02, help="FTRL, wide part")
    a("--deep_learning_rate", type=float, default=0.00012, help="RMSProp, deep part")
    a("--divergence_factor", type=float, default=None,
      help="a loss above this many times the first step's loss ends the run as diverged, "
           "like a non-finite loss (0: only a non-finite loss; default: the engine's, 1000)")
    a("--deep_warmup_epochs", type=float, default=6, help="linear warmup of the deep rate")
    a("--deep_hidden_units", type=int, nargs="+", default=[1024] * 5,
      help="units of the deep part's hidden layers")
    a("--deep_dropout", type=float, default=0.1, help="dropout after each hidden layer")
    a("--combiner", default="sum", help="multi-hot pooling: sum or mean")
    a("--num_auc_thresholds", type=int, default=8000,
      help="accepted for NVIDIA's command lines; the AUC here is exact (all scores ranked), "
           "not a histogram of this many thresholds")
    a("--keep_best", action="store_true",
      help="end training on the best evaluation's state (highest MAP@12, or AUC with "
           "--disable_map_calculation): the checkpoint and the SavedModel are that state "
           "(kept in --model_dir/checkpoint.best while training); off by default, as "
           "NVIDIA's command lines end on the last epoch")
    a("--early_stopping_patience", type=int, default=0,
      help="stop after this many evaluations without a better MAP@12 (AUC) (0: never)")
    a("--evaluate", action="store_true", help="evaluate only (with --use_checkpoint)")
    a("--benchmark", action="store_true", help="measure train (or eval) samples/s")
    a("--benchmark_warmup_steps", type=int, default=500, help="steps before timing")
    a("--benchmark_steps", type=int, default=1000, help="timed steps")
    a("--affinity", default="unique_interleaved", choices=AFFINITIES,
      help="accepted for NVIDIA's command lines; not applied: processes keep the CPUs the "
           "launcher (horovodrun, slurm) gives them")
    a("--disable_map_calculation", action="store_true",
      help="no MAP@12 (needs a feature in the spec's 'map' channel otherwise)")
    a("--print_freq", type=int, default=100, help="steps between progress lines")
    a("--seed", type=int, default=0, help="initialization, shuffling and dropout seed")
    a("--sharding", default="auto", choices=SHARDING_KINDS,
      help="where the tables live under several processes: data_parallel (every process "
           "holds every table), row_wise (each table's rows split over the processes), "
           f"table_wise (whole tables spread over them), auto (tables of up to "
           f"{ROUTED_REPLICATED_ELEMENTS:,d} elements data_parallel, larger ones row_wise); "
           f"column_wise is refused")
    a("--dynamic_features", type=lambda s: s.split(","), default=[],
      help="comma-separated categorical features (or 'all') whose tables learn their ids "
           "(open vocabulary; the spec's cardinality is the capacity)")
    a("--dynamic_min_count", type=int, default=1,
      help="--dynamic_features: occurrences before an id gets a row of its own")
    a("--dynamic_pending_per_row", type=int, default=DynamicSpec.pending_per_row,
      help="--dynamic_min_count > 1: ids waiting for it that a table remembers, per row of "
           "its capacity (about 66 bytes each; the oldest is forgotten)")
    args = p.parse_args(argv)
    if args.dynamic_pending_per_row < 1:
        p.error(f"--dynamic_pending_per_row must be >= 1, found {args.dynamic_pending_per_row}")
    if args.early_stopping_patience < 0:
        p.error(f"--early_stopping_patience must be >= 0, found {args.early_stopping_patience}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    runtime.import_tensorflow()
    from core.pipelines import reader_errors_surfaced
    from wide_and_deep.run import Run

    def work():  # FeatureSpecError, DatasetError, CheckpointError are ValueErrors
        with reader_errors_surfaced():
            Run(args).execute()
    return run_cli(work)


if __name__ == "__main__":
    exit_process(main())
