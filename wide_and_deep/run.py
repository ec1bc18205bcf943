"""Flags -> objects (spec, readers, model, trainer, logger) and the four modes: train,
evaluate, and the train / eval benchmarks."""
from __future__ import annotations

import os

from core import plot_log
from core.dllog import DLLogger
from core.feature_spec import VALIDATION_MAPPING, DynamicSpec
from core.optimizers import LearningRateSchedule
from core.parallel.comm import make_communicator
from core.parallel.placement import describe_routed_tables, plan_routed_tables
from core.pipelines import DictPipeline
from core.columnar import open_reader
from core.sources import load_spec
from training import checkpoint, loop, outputs
from training.export import export_saved_model
from training.selection import best_state_path
from wide_and_deep import export
from wide_and_deep.contract import (MAP_CHANNEL, MULTIHOT_CHANNEL, ONEHOT_CHANNEL,
                                    WIDE_DEEP_CONTRACT, embedding_dims)
from wide_and_deep.model import (PROJECT_MAX_ROWS, WideDeepConfig, WideDeepModel,
                                 parameter_count)
from wide_and_deep.trainer import WideDeepTrainer


class Run:
    def __init__(self, args):
        self.args = args
        # NVIDIA's specs carry no dtypes: the parquet schema (or a default) gives them
        self.spec = load_spec(args.dataset_path, WIDE_DEEP_CONTRACT, args.fspec_file)
        if args.dynamic_features:
            self.spec = self.spec.with_dynamic(args.dynamic_features, DynamicSpec(
                args.dynamic_min_count, pending_per_row=args.dynamic_pending_per_row))
        self.comm = make_communicator()
        self.logger = DLLogger(os.path.join(args.results_dir, args.log_filename),
                               enabled=self.comm.rank == 0)
        self.checkpoint_path = os.path.join(args.model_dir, "checkpoint")
        self.label = self.spec.label_feature
        maps = self.spec.channel(MAP_CHANNEL)
        self.display = maps[0] if maps and not args.disable_map_calculation else None
        if not maps and not args.disable_map_calculation:
            self.logger.print(f"warning: no MAP@12: the spec's '{MAP_CHANNEL}' channel is "
                              f"empty (pass --disable_map_calculation to silence this)")
        self.train_pipe = self._pipe("train", args.global_batch_size, shuffle=True)
        self.eval_pipe = self._pipe("test", args.eval_batch_size, shuffle=False)
        # with a validation split, model selection reads it and the test data is held out
        self.selection_pipe = (self._pipe(VALIDATION_MAPPING, args.eval_batch_size, False)
                               if VALIDATION_MAPPING in self.spec.mappings else self.eval_pipe)
        self.config = WideDeepConfig.from_spec(
            self.spec, embedding_dims(self.spec, args.embedding_sizes_file),
            hidden_units=tuple(args.deep_hidden_units), dropout=args.deep_dropout,
            combiner=args.combiner,
            # XLA compiles one program per input shape; projected tables vary it every step
            project_max_rows=0 if args.xla else PROJECT_MAX_ROWS)
        widths = [t.dim + 1 for t in self.config.tables]  # a feature's deep and wide tables
        self.placement = plan_routed_tables(
            [t.cardinality for t in self.config.tables], widths, self.comm.size, args.sharding,
            hashed_tables=[i for i, t in enumerate(self.config.tables) if t.dynamic])
        if self.comm.size > 1:
            self.logger.print(describe_routed_tables([t.name for t in self.config.tables],
                                                     self.placement, widths, self.comm.size))
        self.model = WideDeepModel(self.config, args.seed, self.placement, self.comm)
        warmup = int(args.deep_warmup_epochs * len(self.train_pipe))
        schedule = LearningRateSchedule(args.deep_learning_rate, warmup_steps=warmup,
                                        decay_steps=0)
        self.trainer = WideDeepTrainer(self.model, self.comm, self.label,
                                       args.linear_learning_rate, schedule, seed=args.seed,
                                       amp=args.amp, xla=args.xla,
                                       divergence_factor=args.divergence_factor)

    def _pipe(self, mapping: str, batch_size: int, shuffle: bool) -> DictPipeline:
        features = [f for c in (ONEHOT_CHANNEL, MULTIHOT_CHANNEL, "numerical", "label")
                    for f in self.spec.channel(c)]
        if mapping != "train" and self.display:
            features.append(self.display)
        reader = open_reader(self.spec, mapping, batch_size, rank=self.comm.rank,
                             world_size=self.comm.size,
                             shuffle=shuffle, seed=self.args.seed, features=features)
        if reader.num_rows == 0:
            raise ValueError(f"{self.spec.base_directory}/{self.args.fspec_file}: the "
                             f"'{mapping}' mapping has no rows")
        return DictPipeline(reader, label_features=(self.label,))

    def _evaluate(self, pipe: DictPipeline) -> dict:
        groups = (lambda batch: batch[self.display]) if self.display else None
        return loop.evaluate(self.trainer, pipe.epoch(), groups)

    def _save(self, path: str, position: dict) -> None:
        checkpoint.save_replica(path, self.trainer.named_state(), self.comm, position,
                                dynamic_tables=self.trainer.dynamic_tables(),
                                row_ranges=self.trainer.row_ranges())

    def _restore(self, path: str) -> dict:
        state = self.trainer.named_state()
        position = checkpoint.restore_replica(path, state, state,
                                              dynamic_tables=self.trainer.dynamic_tables(),
                                              row_ranges=self.trainer.row_ranges(),
                                              comm=self.comm)
        self.logger.print(f"restored {path} (epoch {position['epoch']})")
        return position

    def _loop_config(self) -> loop.LoopConfig:
        args = self.args
        return loop.LoopConfig(epochs=args.num_epochs, batch_size=args.global_batch_size,
                               print_freq=args.print_freq, checkpoint_every_epoch=True,
                               benchmark_warmup_steps=args.benchmark_warmup_steps,
                               benchmark_steps=args.benchmark_steps if args.benchmark else 0,
                               selection_metric="map12" if self.display else "auc",
                               keep_best=args.keep_best,
                               early_stopping_patience=args.early_stopping_patience)

    def written_paths(self) -> list:
        """What training writes (taken at its start: one writer per path)."""
        args = self.args
        if args.evaluate or args.benchmark:
            return []
        return [self.checkpoint_path, os.path.join(args.model_dir, "saved_model")] + (
            [best_state_path(self.checkpoint_path)] if args.keep_best else [])

    def execute(self) -> None:
        with outputs.claimed(self.comm, self.written_paths()):
            self._execute()

    def _execute(self) -> None:
        args = self.args
        self.logger.parameters(dict(vars(args), world_size=self.comm.size,
                                    parameters=parameter_count(self.config)))
        position = {"epoch": 0, "step": 0}
        if args.use_checkpoint and (args.evaluate or
                                    os.path.exists(self.checkpoint_path)):
            position = self._restore(self.checkpoint_path)
        if not args.evaluate:
            held_out = self.selection_pipe is not self.eval_pipe
            loop.train(self.trainer, self.train_pipe,
                       lambda: self._evaluate(self.selection_pipe), self.logger,
                       self._loop_config(), position,
                       loop.Checkpoints(self.checkpoint_path, self._save, self._restore),
                       (lambda: self._evaluate(self.eval_pipe)) if held_out else None)
            if not args.benchmark:
                self._export()
            return
        if args.benchmark:  # the prediction step's throughput
            loop.log_result(self.logger, "inference", loop.benchmark_inference(
                self.trainer, self.eval_pipe.epoch(), args.benchmark_steps,
                args.benchmark_warmup_steps))
        else:
            loop.log_result(self.logger, "eval", self._evaluate(self.eval_pipe))

    def _whole_model(self):
        """The model with every table whole, on rank 0 (None elsewhere): this model, or, when
        features are split over the ranks, a copy of it with their rows gathered."""
        if not self.model.routed_features():
            return self.model if self.comm.rank == 0 else None
        variables = {**self.model.wide_variables(), **self.model.deep_variables()}
        arrays = checkpoint.gathered_arrays(variables, self.trainer.row_ranges(), self.comm)
        maps = checkpoint.gathered_maps(self.trainer.dynamic_tables(),
                                        self.trainer.row_ranges(), self.comm)
        if self.comm.rank != 0:
            return None
        whole = WideDeepModel(self.config, self.args.seed)
        whole_variables = {**whole.wide_variables(), **whole.deep_variables()}
        for name, var in whole_variables.items():
            var.assign(arrays[name])
        checkpoint.load_maps(maps, {n: (whole.dynamic[n], entries) for n, (_, entries)
                                    in self.trainer.dynamic_tables().items()},
                             arrays, whole_variables, 0, 1, self.checkpoint_path)
        return whole

    def _export(self) -> None:
        model = self._whole_model()
        if model is None:
            return
        export_saved_model(model, *export.serving(model),
                           os.path.join(self.args.model_dir, "saved_model"), "wide_deep_serving")
        log = os.path.join(self.args.results_dir, self.args.log_filename)
        plot_log.plot(log, os.path.join(self.args.results_dir, "curves.png"))
        self.logger.print(f"exported {self.args.model_dir}/saved_model, plotted "
                          f"{self.args.results_dir}/curves.png")
