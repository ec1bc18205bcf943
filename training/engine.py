"""One training step for every family (DLRM, Wide & Deep, SIM).

A step is split at the table lookups: the lookups (and, with several processes, DLRM's
all-to-all) run under an outer tape; everything after them runs in `dense_forward_backward`,
which --xla compiles. Dense gradients are summed across ranks through the communicator;
a table's gradient stays sparse (tf.IndexedSlices) and is summed only where the table is
replicated (every rank holds it), under a name that is a function of the table, so every
rank issues the same collectives in the same order. Then each variable's optimizer group
applies its update (dense variables, then tables).

float16 compute scales the loss dynamically (loss_scale.py): a step whose gradients are not
finite on some rank is skipped on every rank and the scale halved.

Divergence. A step's (global) loss diverged when it is not finite, or when it exceeds
`divergence_factor` (DEFAULT_DIVERGENCE_FACTOR; 0: this rule is off) times the loss of the
run's first step, the model as it was before this run's first update. Whether a runaway loss
overflows to inf depends on the CPU and on thread timing; a loss of 1e29 exceeds the bound on
every CPU. A healthy logistic loss stays within a few times its first value, so the default
bound never fires on it. The step never waits for the host: the first diverged step is
recorded on the device and `check_diverged()` turns it into TrainingDivergedError, an
expected error (one `error:` line). The loop checks before every evaluation and save, so
nothing is evaluated, saved or exported after a divergence.

A family supplies a task object with:
  dense_variables: dict  name -> tf.Variable (summed across ranks)
  row_split (optional): names of dense variables split by rows over the ranks, read through
      routed lookups whose backward pass already brings each rank its rows' gradient summed
      over the ranks: not summed again (e.g. retrieval's item table under --sharding row)
  row_updated (optional): names of dense variables updated in the rows their gradient holds
      when it is rows (tf.IndexedSlices: the loss read them by gathers only), as tables are
      (e.g. retrieval's item table under a sampled loss); any other dense gradient is dense
  tables, lookup_collectives: table_bookkeeping(declarations), one TableDeclaration per table
      (or piece) this rank holds, in a fixed order: which tables are replicated, routed or
      dynamic, their rare-row sums and their routed lookups' collectives follow from it
      (DLRM adds its all-to-all's names to lookup_collectives)
  lookup(batch) -> (embedded, context, sources)  embedded: nest of differentiable tensors;
      context: nest passed on to loss() untouched; sources: tensors whose (empty) gradients
      keep a backward collective alive on a rank that holds no table
  dense_inputs(batch, step) -> nest given to loss()
  loss(inputs, embedded, context, compute_dtype) -> this rank's rows' loss summed and
      divided by the global batch (summed over ranks: the global mean)
  predict(batch, compute_dtype) -> probabilities of this rank's rows
  label(batch) -> this rank's labels; global_rows(batch) -> rows of the global batch
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import tensorflow as tf

from core import runtime
from core.parallel.rows import collective_names
from training.loss_scale import make_loss_scale


DEFAULT_DIVERGENCE_FACTOR = 1000.0


class TrainingDivergedError(ValueError):
    """A diverged loss: bad settings (learning rate), reported as one `error:` line."""


@dataclass(frozen=True)
class TableGradient:
    key: object       # names the cross-rank sum of a replicated table (e.g. its table id)
    variable: tf.Variable
    replicated: bool  # every rank holds it: its gradient rows are summed across ranks
    distinct_rows: bool = False  # the lookup deduplicates ids: a rank's gradient holds
    #                              each row once (until rows are gathered across ranks)
    row_zero_sum: str = ""  # a dynamic table's share, whose rare row 0 is a copy on every
    #                         rank: the name of its gradient's sum across ranks ("": none)


@dataclass(frozen=True)
class TableDeclaration:
    """One table (or piece) of this rank as its family declares it (table_bookkeeping)."""
    key: object             # names the table's sums across ranks, alike on every rank
    variable: tf.Variable
    routed_lookup: str = ""  # the routed lookup (core/parallel/rows.py) that reads the table,
    #                          split by rows over the ranks ("": not split)
    exchanged: bool = False  # a model-parallel piece whose lookups and gradients the family's
    #                          own collectives carry (DLRM's all-to-all): nothing to sum
    dynamic: bool = False    # maps any id to a row, row 0 the rare row (core/dynamic.py)
    distinct_rows: bool = False  # its lookups read each distinct id of a batch once


def table_bookkeeping(declarations) -> tuple:
    """(tables, lookup_collectives) of a task from its TableDeclarations. A table neither
    routed nor exchanged is held whole by every rank: replicated. A routed table's gradient
    holds the rows every rank read, so not distinct ones; a routed dynamic table's shares
    each hold a copy of the rare row, whose gradient is summed across ranks. A frozen table
    (not trainable) gets no gradient, but its lookup still runs. lookup_collectives: each
    routed lookup's collectives once, in declaration order, which is alike on every rank."""
    declarations = list(declarations)
    tables = [TableGradient(d.key, d.variable, replicated=not (d.routed_lookup or d.exchanged),
                            distinct_rows=d.distinct_rows and not d.routed_lookup,
                            row_zero_sum=rare_row_name(d.key)
                            if d.routed_lookup and d.dynamic else "")
              for d in declarations if d.variable.trainable]
    lookups = dict.fromkeys(d.routed_lookup for d in declarations if d.routed_lookup)
    return tables, [name for lookup in lookups for name in collective_names(lookup)]


@dataclass(frozen=True)
class OptimizerGroup:
    optimizer: object       # apply_dense / apply_sparse / finish_step (optimizers.py)
    learning_rate: object   # step -> float
    variables: tuple        # the tf.Variables it updates
    name: str = ""          # names its learning rate in the logs when there are several


def compute_dtype_for(amp: bool):
    """--amp: float16 on a GPU; on a CPU bfloat16 (float32's exponent range) where it
    multiplies bfloat16 natively (AMX or AVX512_BF16), else float32, said in one line
    (core/runtime.py: cpu_amp_dtype; DLRM_CPU_AMP=bfloat16 forces bfloat16); without --amp
    float32."""
    if not amp:
        return tf.float32
    if tf.config.list_logical_devices("GPU"):
        return tf.float16
    if runtime.cpu_amp_dtype() == "bfloat16":
        return tf.bfloat16
    _say_once("--amp: this CPU has no native bfloat16 instructions (AMX, AVX512_BF16): "
              "bfloat16 would be emulated and slower, so training keeps float32 "
              f"({runtime.CPU_AMP_VARIABLE}=bfloat16 forces it)")
    return tf.float32


@functools.cache
def _say_once(line: str) -> None:
    print(line, flush=True)


def mean_share(per_row_loss, global_rows):
    """This rank's rows' loss summed over the global batch's rows: summed over the ranks,
    the global mean, so N ranks take the same step as one."""
    return tf.reduce_sum(per_row_loss) / tf.cast(global_rows, tf.float32)


def dense_gradient_name(variable: str) -> str:
    return f"dense_grad_{variable.replace('/', '_')}"


def rare_row_name(table) -> str:
    """Names the sum across ranks of the gradient of a dynamic table's rare row (a copy in
    every rank's share; TableGradient.row_zero_sum)."""
    return f"rare_row_grad_table_{table}"


def replicated_gradient_name(table) -> str:
    """Named after the table (the plan's table id in DLRM), so every rank names it alike
    whatever else it holds."""
    return f"replicated_grad_table_{table}"


def compiled(fn, signature=None):
    """fn as a tf.function. With a signature, calls go straight to its concrete function
    (made on the first call): a tf.function call matches its arguments against the
    signature every time, ~0.2 ms of Python per call here, a few per cent of a small
    model's step on CPU. No AutoGraph: the steps' Python control flow is over static
    values only, and converting their ~100 functions took 2-3 s of every run's start-up."""
    function = tf.function(fn, input_signature=signature, autograph=False)
    if signature is None:
        return function
    concrete = functools.cache(function.get_concrete_function)
    return lambda *args: concrete()(*args)


class Trainer:
    def __init__(self, task, comm, groups, compute_dtype=tf.float32, loss_scale=None,
                 xla=False, run_eagerly=False, input_signature=None, predict_signature=None,
                 divergence_hint="", divergence_factor=DEFAULT_DIVERGENCE_FACTOR):
        """loss_scale: a static scale, or None: dynamic for float16, none otherwise.
        input_signature / predict_signature: TensorSpecs of a training / prediction batch
        (one trace for every batch size). divergence_factor: a loss above this many times
        the first step's loss diverged (0: only a non-finite loss; None: the default)."""
        if divergence_factor is None:
            divergence_factor = DEFAULT_DIVERGENCE_FACTOR
        # below 1 the first step would exceed its own bound
        if not (divergence_factor == 0 or divergence_factor >= 1):
            raise ValueError(f"--divergence_factor must be 0 (off) or at least 1, found "
                             f"{divergence_factor:g}")
        self.task, self.comm, self.groups = task, comm, list(groups)
        self.compute_dtype = compute_dtype
        self.loss_scale = make_loss_scale(compute_dtype, loss_scale)
        self.divergence_hint, self.divergence_factor = divergence_hint, float(divergence_factor)
        self.dense_vars = dict(task.dense_variables)
        self.row_updated = frozenset(getattr(task, "row_updated", ()))
        self.row_split = frozenset(getattr(task, "row_split", ()))
        self.trained_tables = list(task.tables)
        self._group_of = {v.ref(): i for i, g in enumerate(self.groups) for v in g.variables}
        self.diverged_at = tf.Variable(-1, dtype=tf.int64, trainable=False, name="diverged_at")
        self.diverged_loss = tf.Variable(0.0, trainable=False, name="diverged_loss")
        # NaN until the first step's loss is known
        self.first_loss = tf.Variable(float("nan"), trainable=False, name="first_loss")
        self._dense_fn = self._dense_forward_backward
        if xla and not run_eagerly:
            self._dense_fn = tf.function(self._dense_forward_backward, jit_compile=True)
        self._step_fn, self._predict_fn = self._train_step, self._predict_step
        if not run_eagerly:
            sig = None if input_signature is None else [
                input_signature, [tf.TensorSpec([], tf.float32)] * len(self.groups),
                tf.TensorSpec([], tf.int64)]
            self._step_fn = compiled(self._train_step, sig)
            self._predict_fn = compiled(
                self._predict_step, None if predict_signature is None else [predict_signature])

    @property
    def loss_name(self) -> str:
        """What the step's loss is, for the curves' label: a task whose loss is more than
        one binary cross-entropy names its terms (`loss_name`)."""
        return getattr(self.task, "loss_name", "binary cross-entropy")

    # ---- the step ---------------------------------------------------------------------
    def _dense_forward_backward(self, inputs, embedded, context, scale):
        dense, flat = list(self.dense_vars.values()), tf.nest.flatten(embedded)
        with tf.GradientTape() as tape:
            tape.watch(flat)
            loss = self.task.loss(inputs, embedded, context, self.compute_dtype)
            scaled = loss * scale if self.loss_scale.needed else loss
        grads = tape.gradient(scaled, dense + flat)
        if self.loss_scale.needed:
            grads = [g / scale for g in grads]
        return loss, grads[:len(dense)], grads[len(dense):]

    def _train_step(self, batch, learning_rates, step):
        table_vars = [t.variable for t in self.trained_tables]
        with tf.GradientTape() as tape:
            embedded, context, sources = self.task.lookup(batch)
        loss, dense_grads, embedded_grads = self._dense_fn(
            self.task.dense_inputs(batch, step), embedded, context, self.loss_scale.scale)
        grads = tape.gradient(tf.nest.flatten(embedded), table_vars + list(sources),
                              output_gradients=embedded_grads)
        table_grads, source_grads = grads[:len(table_vars)], grads[len(table_vars):]
        # named collectives: Horovod matches them across ranks by name, and the names it
        # generates differ between ranks whose graphs differ (e.g. one without tables)
        dense_grads = [g if name in self.row_split else
                       self.comm.allreduce_sum(g, name=dense_gradient_name(name))
                       for name, g in zip(self.dense_vars, dense_grads)]
        table_grads = [self._table_gradient(t, g) for t, g in zip(self.trained_tables, table_grads)]
        if self.loss_scale.dynamic:
            finite = self._all_finite(dense_grads + [g.values for g in table_grads])
            tf.cond(finite, lambda: self._apply(dense_grads, table_grads, learning_rates),
                    lambda: None)
            self.loss_scale.update(finite)
        else:
            self._apply(dense_grads, table_grads, learning_rates)
        loss = self.comm.allreduce_sum(loss, name="loss")
        for grad in source_grads:  # + 0 (no elements): tf.function prunes control-only paths
            loss += tf.reduce_sum(tf.convert_to_tensor(grad))
        self._record_divergence(loss, step)
        return loss

    def _table_gradient(self, table: TableGradient, grad):
        if table.replicated:
            grad = self.comm.allreduce_sum(grad, name=replicated_gradient_name(table.key))
        if table.row_zero_sum:
            grad = self._row_zero_summed(table.row_zero_sum, grad)
        if not isinstance(grad, tf.IndexedSlices):
            grad = tf.IndexedSlices(grad, tf.range(tf.shape(grad)[0]))
        return grad

    def _row_zero_summed(self, name, grad):
        """The gradient rows of a dynamic table's share with row 0's summed across ranks: one
        entry when any rank read row 0 this step, none otherwise (as one process updates the
        rare row only on steps that read it)."""
        grad = grad if isinstance(grad, tf.IndexedSlices) else \
            tf.IndexedSlices(grad, tf.range(tf.shape(grad)[0], dtype=tf.int64))
        zero = tf.equal(grad.indices, 0)
        values = tf.cast(tf.boolean_mask(grad.values, zero), tf.float32)
        total = tf.concat([tf.reduce_sum(values, 0),
                           [tf.cast(tf.shape(values)[0], tf.float32)]], 0)
        total = self.comm.allreduce_sum(total, name=name)
        read = total[-1:] > 0
        return tf.IndexedSlices(
            tf.concat([tf.boolean_mask(grad.values, ~zero),
                       tf.boolean_mask(tf.cast(total[None, :-1], grad.values.dtype), read)], 0),
            tf.concat([tf.boolean_mask(grad.indices, ~zero),
                       tf.boolean_mask(tf.zeros([1], grad.indices.dtype), read)], 0),
            grad.dense_shape)

    def _all_finite(self, grads):
        """True on every rank, or on none: the count of non-finite values is summed."""
        bad = tf.add_n([tf.reduce_sum(tf.cast(~tf.math.is_finite(getattr(g, "values", g)),
                                              tf.float32)) for g in grads])
        return tf.equal(self.comm.allreduce_sum(bad, name="nonfinite_count"), 0.0)

    def _apply(self, dense_grads, table_grads, learning_rates):
        for (name, var), grad in zip(self.dense_vars.items(), dense_grads):
            group = self._group_of[var.ref()]
            optimizer, rate = self.groups[group].optimizer, learning_rates[group]
            if isinstance(grad, tf.IndexedSlices) and name in self.row_updated:
                optimizer.apply_sparse(var, grad, rate)
            else:  # a split table's rows (routed lookups) summed into its dense gradient
                optimizer.apply_dense(var, tf.convert_to_tensor(grad), rate)
        for table, grad in zip(self.trained_tables, table_grads):
            group = self._group_of[table.variable.ref()]
            distinct = table.distinct_rows and not (table.replicated and self.comm.size > 1)
            self.groups[group].optimizer.apply_sparse(table.variable, grad,
                                                      learning_rates[group], distinct)
        for group in self.groups:
            group.optimizer.finish_step()

    def _record_divergence(self, loss, step):
        self.first_loss.assign(tf.where(tf.math.is_nan(self.first_loss), loss, self.first_loss))
        diverged = ~tf.math.is_finite(loss)
        if self.divergence_factor > 0:
            diverged |= (self.first_loss > 0) & (loss > self.divergence_factor * self.first_loss)
        first = tf.logical_and(diverged, self.diverged_at < 0)
        self.diverged_at.assign(tf.where(first, step, self.diverged_at))
        self.diverged_loss.assign(tf.where(first, loss, self.diverged_loss))

    def _predict_step(self, batch):
        return self.task.predict(batch, self.compute_dtype)

    # ---- public -----------------------------------------------------------------------
    def step_collectives(self) -> list:
        """The collectives of one step by name: a function of the task alone, hence the same
        on every rank (Horovod matches them by name)."""
        names = list(self.task.lookup_collectives)
        names += [dense_gradient_name(name) for name in self.dense_vars
                  if name not in self.row_split]
        names += [replicated_gradient_name(t.key) for t in self.trained_tables if t.replicated]
        names += [t.row_zero_sum for t in self.trained_tables if t.row_zero_sum]
        return names + (["nonfinite_count"] if self.loss_scale.dynamic else []) + ["loss"]

    def train_step(self, batch, step: int):
        """One update at schedule step `step`; returns the global mean loss as a tensor
        without waiting for it (check_diverged() tells whether a loss diverged)."""
        rates = [tf.constant(g.learning_rate(step), tf.float32) for g in self.groups]
        return self._step_fn(batch, rates, tf.constant(step, tf.int64))

    def learning_rates(self, step: int) -> dict:
        """The logged learning rate(s): `learning_rate`, or `<group>_learning_rate` each."""
        if len(self.groups) == 1:
            return {"learning_rate": float(self.groups[0].learning_rate(step))}
        return {f"{g.name}_learning_rate": float(g.learning_rate(step)) for g in self.groups}

    def label(self, batch):
        return self.task.label(batch)

    def global_rows(self, batch) -> int:
        return int(self.task.global_rows(batch))

    def check_diverged(self) -> None:
        """Raise TrainingDivergedError naming the first step whose loss diverged."""
        step = int(self.diverged_at.numpy())
        if step < 0:
            return
        loss, first = float(self.diverged_loss.numpy()), float(self.first_loss.numpy())
        bound = "" if not math.isfinite(loss) else (
            f", more than {self.divergence_factor:g} times the first step's loss {first:.6g}")
        rates = ", ".join(f"{g.name} {g.learning_rate(step):g}".lstrip() for g in self.groups)
        raise TrainingDivergedError(
            f"loss became {loss:.6g} at step {step}{bound} (learning rate {rates}, "
            f"--divergence_factor {self.divergence_factor:g}); training "
            f"stopped, nothing was saved or exported for this state. "
            f"{self.divergence_hint}".rstrip())

    def predict(self, batch):
        """Probabilities of this rank's rows of the batch (a tensor)."""
        return self._predict_fn(batch)
