"""DIN, DIEN and SIM over one user's behaviour history.

Histories follow NVIDIA's convention: D ids per row, left-padded with 0 (padding), most
recent last; a behaviour is real where its first item feature's id is not 0. With
--long_seq_length L, the first L positions are the long part and the last D-L the short
part, as in the reference. Each model reads what the reference's does:

  DIN:  attention of the target over the whole history (long + short, masked).
  DIEN: GRU + AUGRU over the short part (auxiliary loss from the negative history).
  HSTU: the target-aware HSTU ranker over the whole history (sim/hstu.py): the target is a
        candidate token after the history; its output and the user go to the classifier.
        Several candidates per history are scored in one pass (score_candidates).
  SIM:  DIEN over the short part, plus a search over the long part:
        GSU (soft search): every long behaviour is scored against the target; the masked
        softmax of the scores pools the long part into a vector with its own logit and loss
        (the GSU head, of widths stage_one_mlp_dims); the gsu_top_k largest weights are the
        selection.
        ESU: attention of the target over the selection, plus the selection's masked mean.

item_item_interaction picks the attention scores of DIN, the GSU and the ESU, as the
reference's DINModel argument of that name:
  dot (default, the reference's): score = target . behaviour, masked softmax weights.
  activation_unit: this toolkit's earlier scoring, an MLP on [q, k, q-k, q*k] (AttentionUnit;
        DIN pools with the raw scores, the GSU scorer has stage_one_mlp_dims widths, the ESU
        has no masked mean), kept for its checkpoints and results.

architecture picks the layers after the lookups:
  reference (default): NVIDIA's, layer by layer. PReLU classifiers (slope per unit, 0.1 at
        start) on [target, pooled, user] (DIN), [target, h'_T, user] (DIEN), stage one
        [target, GSU pool, user] and stage two [ESU pool, selection mean, target, h'_T,
        user] (SIM); Keras's GRU (reset after the recurrent matmul) and NVIDIA's AUGRU cell,
        6 x embedding_dim wide, over the short part with its padding zeroed; DIEN's
        attention adapts the target by Dense + PReLU and scores with sigmoid layers; the
        auxiliary network has sigmoid layers and NVIDIA's loss; SIM's loss averages the
        two stages'.
  compact: this toolkit's earlier model: ReLU MLPs with target * pooled inputs, GRU/AUGRU as
        wide as an item that skip padding steps, the activation unit for DIEN's attention,
        SIM's loss the sum of both stages'.

An item (target or behaviour) is the concatenation of its features' embeddings (item id,
category id, ...); feature i of the target and of both histories shares table i, of
cardinality + 1 rows (ids 1..cardinality, row 0 the padding).
"""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from types import MappingProxyType

import tensorflow as tf

from core import fused_ops
from core.dynamic import DynamicTable
from core.layers import MLP, copy_rare_row, table_variable
from core.parallel.rows import hash_owner, range_lookup, routed_lookup
from sim import blocks
from sim.hstu import HstuRanker

MODEL_TYPES = ("sim", "dien", "din", "hstu")
ITEM_INTERACTIONS = ("dot", "activation_unit")
ARCHITECTURES = ("reference", "compact")
STATE_WIDTH_PER_EMBEDDING = 6  # NVIDIA's GRU/AUGRU width: 6 x embedding_dim


def routed_lookup_name(table: str) -> str:
    """Names the routed lookup (its collectives, core/parallel/rows.py) of a split table."""
    return f"routed_{table}"


class SimConfigError(ValueError):
    pass


@dataclass(frozen=True)
class SimConfig:
    user_cardinalities: tuple
    item_cardinalities: tuple
    history_length: int
    model_type: str = "sim"
    long_seq_length: int = 90
    embedding_dim: int = 16
    stage_one_mlp_dims: tuple = (200,)
    stage_two_mlp_dims: tuple = (200, 80)
    aux_mlp_dims: tuple = (100, 50)
    attention_mlp_dims: tuple = (80, 40)
    gsu_top_k: int = 50  # the reference's hard-coded k
    dropout_rate: float = -1.0
    seed: int = 0
    item_item_interaction: str = "dot"
    architecture: str = "reference"
    hstu_blocks: int = 2  # the HSTU ranker's layers and heads
    hstu_heads: int = 1
    # per user feature, then per item feature: a DynamicSpec (open vocabulary) or None
    dynamic: tuple = ()

    @property
    def dot(self) -> bool:
        return self.item_item_interaction == "dot"

    @property
    def reference(self) -> bool:
        return self.architecture == "reference"

    @property
    def item_width(self) -> int:
        return self.embedding_dim * len(self.item_cardinalities)

    @property
    def user_width(self) -> int:
        return self.embedding_dim * len(self.user_cardinalities)

    @property
    def state_width(self) -> int:
        """GRU/AUGRU width: NVIDIA's 6 x embedding_dim, or an item's (compact)."""
        return (STATE_WIDTH_PER_EMBEDDING * self.embedding_dim if self.reference
                else self.item_width)

    @property
    def short_length(self) -> int:
        return self.history_length - self.long_seq_length

    def table_rows(self) -> list:
        """(name, rows) of every table: the user tables, then the item tables; a table has a
        row per id and row 0, the padding."""
        return ([(f"user_table_{t}", n + 1) for t, n in enumerate(self.user_cardinalities)]
                + [(f"item_table_{t}", n + 1) for t, n in enumerate(self.item_cardinalities)])

    def checkpoint_shape(self) -> dict:
        """The fields that decide the variables, architecture included (a checkpoint records
        them); DIEN's attention does not depend on item_item_interaction; the HSTU ranker's
        fields are the HSTU ranker's alone."""
        ignored = ("seed", "dropout_rate") + (
            ("long_seq_length", "stage_one_mlp_dims", "aux_mlp_dims", "attention_mlp_dims",
             "gsu_top_k", "item_item_interaction") if self.model_type == "hstu" else
            ("hstu_blocks", "hstu_heads")) + (
            ("item_item_interaction",) if self.model_type == "dien" else ())
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(self).items() if k not in ignored}

    def validate(self) -> "SimConfig":
        if self.model_type not in MODEL_TYPES:
            raise SimConfigError(f"--model_type must be one of {MODEL_TYPES}, found "
                                 f"'{self.model_type}'")
        if self.architecture not in ARCHITECTURES:
            raise SimConfigError(f"--architecture must be one of {ARCHITECTURES}, found "
                                 f"'{self.architecture}'")
        if self.item_item_interaction not in ITEM_INTERACTIONS:
            raise SimConfigError(f"--item_item_interaction must be one of {ITEM_INTERACTIONS}, "
                                 f"found '{self.item_item_interaction}'")
        if self.model_type != "hstu" and not 0 < self.long_seq_length < self.history_length:
            raise SimConfigError(f"--long_seq_length must be in [1, {self.history_length - 1}] "
                                 f"(history length {self.history_length} in the feature spec), "
                                 f"found {self.long_seq_length}")
        if self.gsu_top_k < 1:
            raise SimConfigError(f"--gsu_top_k must be positive, found {self.gsu_top_k}")
        widths = (self.stage_one_mlp_dims + self.stage_two_mlp_dims + self.aux_mlp_dims
                  + self.attention_mlp_dims + (self.embedding_dim,))
        if any(w < 1 for w in widths):
            raise SimConfigError(f"MLP widths and --embedding_dim must be positive, found "
                                 f"{list(widths)}")
        if self.hstu_blocks < 1 or self.hstu_heads < 1 or self.item_width % self.hstu_heads:
            raise SimConfigError(f"--num_blocks and --num_heads must be positive and the item "
                                 f"width ({self.item_width}: --embedding_dim x item features) "
                                 f"a multiple of --num_heads, found {self.hstu_blocks}, "
                                 f"{self.hstu_heads}")
        if not 0 <= self.dropout_rate < 1 and self.dropout_rate != -1:
            raise SimConfigError(f"--dropout_rate must be in [0, 1) or -1 (off), found "
                                 f"{self.dropout_rate}")
        return self


class SimModel(tf.Module):
    def __init__(self, config: SimConfig, name="sim_model", placement=None, comm=None):
        """placement: per table (user tables, then item tables) a RoutedTable
        (core/parallel/placement.py, plan_routed_tables; None: every table whole): a table
        split over the ranks holds this rank's (`comm`) rows and is read by routed lookups.
        A dynamic table split over the ranks holds the share of its rows that
        plan_routed_tables (hashed_tables) gives this rank, with its own map: its ids go to
        the rank a hash of the id names (core/parallel/rows.py hash_owner), which gives new
        ids rows; row 0 of every share is a copy of the rare row (the trainer sums its
        gradient across ranks)."""
        super().__init__(name=name)
        self.config = c = config.validate()
        self.comm = comm
        self.placement = {n: p for (n, _), p in zip(c.table_rows(), placement or ())
                          if p.sharded}
        self._dense = {}  # checkpoint prefix -> block, in creation order
        with self.name_scope:
            self.user_tables = [self._table(n + 1, t, f"user_table_{t}")
                                for t, n in enumerate(c.user_cardinalities)]
            self.item_tables = [self._table(n + 1, 100 + t, f"item_table_{t}")
                                for t, n in enumerate(c.item_cardinalities)]
            # a split table's variable -> (its name, its row bounds); a read-only view, which
            # tf.Module does not walk for variables
            self._routed = MappingProxyType({
                table.ref(): (n, self.placement[n].bounds)
                for n, table in self.tables().items() if n in self.placement})
            # a dynamic table's rows: its cardinality + 1 as a static one's; row 0 is both
            # the padding and the rare row (padding is masked wherever it is read)
            self.dynamic = {name: DynamicTable(int(table.shape[0]), spec, f"dynamic_{name}",
                                               rows)
                            for (name, rows), table, spec in zip(
                                c.table_rows(), self.tables().values(), c.dynamic) if spec}
            keys = [t for t in range(len(c.user_cardinalities))] + [
                100 + t for t in range(len(c.item_cardinalities))]
            for (name, rows), key in zip(c.table_rows(), keys):
                if name in self.dynamic and name in self.placement:
                    copy_rare_row(self.tables()[name], rows, c.embedding_dim, c.seed, key)
            # (table, rows) of rows a dynamic table gave to new ids: the optimizer resets
            # their slots (SimTrainer registers it)
            self.new_rows_hooks = []
            if c.model_type == "din" and not c.dot:
                # name kept for checkpoints: DIN's scorer over the whole history
                self._add("short_attention", "short_attention",
                          self._activation_unit(1000, "short_attention"))
            if c.model_type == "hstu":
                self._add("hstu", "hstu", HstuRanker(c.item_width, c.history_length,
                                                     c.hstu_blocks, c.hstu_heads, c.seed,
                                                     1800, "hstu"))
            if c.model_type not in ("din", "hstu"):
                self._build_dien()
            if c.model_type == "sim" and not c.dot:
                self._add("gsu_scorer", "gsu_scorer", blocks.AttentionUnit(
                    c.item_width, c.stage_one_mlp_dims, c.seed, 1400, "gsu_scorer"))
                self._add("long_attention", "long_attention",
                          self._activation_unit(1600, "long_attention"))
            if c.model_type == "sim":
                self._add("gsu_head", "gsu_head", self._classifier(
                    self._stage_one_width(), c.stage_one_mlp_dims, 1500, "gsu_head"))
            self._add("top_mlp", "stage_two_mlp", self._classifier(
                self._stage_two_width(), c.stage_two_mlp_dims, 1700, "stage_two_mlp"))

    def _add(self, attribute: str, prefix: str, block):
        setattr(self, attribute, block)
        self._dense[prefix] = block

    def _activation_unit(self, key: int, name: str):
        c = self.config
        return blocks.AttentionUnit(c.item_width, c.attention_mlp_dims, c.seed, key, name)

    def _build_dien(self):
        """DIEN's attention over the short part, GRU, AUGRU and auxiliary network."""
        c = self.config
        item, state = c.item_width, c.state_width
        if c.reference:
            self._add("short_attention", "short_attention", blocks.TargetAdaptedAttention(
                item, state, c.attention_mlp_dims, c.seed, 1000, "short_attention"))
            self._add("gru", "interest_extractor", blocks.ResetAfterGRU(
                item, state, c.seed, 1100, "interest_extractor"))
            self._add("augru", "interest_evolution", blocks.AUGRU(
                state, state, c.seed, 1200, "interest_evolution"))
            self._add("aux_mlp", "aux_mlp", blocks.ClassifierMLP(
                state + item, c.aux_mlp_dims, "sigmoid", c.seed, 1300, "aux_mlp"))
            return
        self._add("short_attention", "short_attention",
                  self._activation_unit(1000, "short_attention"))
        self._add("gru", "interest_extractor", blocks.GRU(item, item, c.seed, 1100,
                                                          "interest_extractor"))
        self._add("augru", "interest_evolution", blocks.GRU(item, item, c.seed, 1200,
                                                            "interest_evolution"))
        self._add("aux_mlp", "aux_mlp", MLP(2 * item, tuple(c.aux_mlp_dims) + (1,), False,
                                            c.seed, 1300, "aux_mlp"))

    def _classifier(self, input_width: int, widths, key: int, name: str):
        """reference: NVIDIA's PReLU classifier; compact: the core's ReLU MLP."""
        c = self.config
        if c.reference:
            return blocks.ClassifierMLP(input_width, widths, "prelu", c.seed, key, name)
        return MLP(input_width, tuple(widths) + (1,), False, c.seed, key, name)

    def _stage_one_width(self) -> int:
        c = self.config
        # reference: [target, GSU pool, user]; compact adds target * GSU pool
        return c.user_width + (2 if c.reference else 3) * c.item_width

    def _stage_two_width(self) -> int:
        c = self.config
        if c.model_type == "hstu":  # [candidate output, user]
            return c.item_width + c.user_width
        interest = c.item_width if c.model_type == "din" else c.state_width
        search = (1 + c.dot) * c.item_width if c.model_type == "sim" else 0
        if c.reference:  # [ESU pool, selection mean (dot)] + [target, interest, user]
            return search + c.item_width + interest + c.user_width
        # compact: [user, target] + pooled + target * pooled (+ the selection mean)
        pooled = 1 + (c.model_type == "sim")
        return c.user_width + c.item_width + 2 * pooled * c.item_width + (
            c.item_width if c.model_type == "sim" and c.dot else 0)

    def _table(self, rows: int, key: int, name: str):
        start, stop = self.placement[name].rows_on(self.comm.rank) if name in self.placement \
            else (0, rows)
        return table_variable(rows, self.config.embedding_dim, self.config.seed, key, name=name,
                              row_start=start, row_stop=stop)

    def routed_tables(self) -> list:
        """The names of the tables split over the ranks, in table order."""
        return list(self.placement)

    def rows_held(self, name: str) -> tuple:
        """(row_start, row_stop, rows) of the rows of a split table this rank holds."""
        rows = self.placement[name].rows
        return (*self.placement[name].rows_on(self.comm.rank), rows)

    def _read(self, table, ids, training: bool):
        """table's rows at ids: from this rank's variable, or, for a table split over the
        ranks, from the ranks holding them (one routed lookup per table and step)."""
        if table.ref() not in self._routed:
            return tf.nn.embedding_lookup(table, ids)
        name, bounds = self._routed[table.ref()]
        if name in self.dynamic:
            return routed_lookup(self.comm, [table], ids, hash_owner(self.comm.size),
                                 lambda asked: self._dynamic_rows_of(name, asked, training),
                                 routed_lookup_name(name))[0]
        return range_lookup(self.comm, bounds, [table], ids, routed_lookup_name(name))[0]

    def _hashed(self, table) -> bool:
        """Whether table is a dynamic table split over the ranks."""
        return self._routed.get(table.ref(), ("",))[0] in self.dynamic

    def tables(self) -> dict:
        out = {f"user_table_{t}": v for t, v in enumerate(self.user_tables)}
        out.update({f"item_table_{t}": v for t, v in enumerate(self.item_tables)})
        return out

    def dense_variables(self) -> dict:
        """Every non-table variable by checkpoint name."""
        out = {}
        for prefix, block in self._dense.items():
            out.update(block.named_variables(prefix))
        return out

    # ---- lookups: ids -> embedded tensors (the part whose gradients are sparse) ----

    def split_history(self, ids):
        """ids [B, D] -> (long ids [B, L], short ids [B, D-L]) at the fixed split point."""
        return ids[:, :self.config.long_seq_length], ids[:, self.config.long_seq_length:]

    def _items(self, ids_per_feature, deduplicate: bool):
        """ids_per_feature[f]: the id tensors of item feature f (target, history parts) ->
        one embedded tensor per part, the features' embeddings side by side."""
        return self._embed(self.item_tables, ids_per_feature, deduplicate)

    def _rows(self, names, ids_per_feature, training: bool):
        """ids_per_feature with a dynamic feature's ids replaced by their rows: one map per
        feature for all its id tensors; padding (0) is never inserted and reads row 0."""
        out = []
        for name, id_tensors in zip(names, ids_per_feature):
            if name not in self.dynamic or name in self.placement:  # split: on the owner
                out.append(id_tensors)
                continue
            flat = self._dynamic_rows_of(
                name, tf.concat([tf.reshape(ids, [-1]) for ids in id_tensors], 0), training)
            pieces = tf.split(flat, [tf.size(ids) for ids in id_tensors])
            out.append([tf.reshape(p, tf.shape(ids)) for p, ids in zip(pieces, id_tensors)])
        return out

    def _dynamic_rows_of(self, name: str, flat, training: bool):
        """Rows of a dynamic table's ids (1-D; on their owner when the table is split); in
        training new ids get rows (drawn again, slots reset); padding (0) is never inserted
        and reads row 0."""
        dynamic = self.dynamic[name]
        if not training:
            return dynamic.lookup(flat)
        real = tf.where(flat != 0)
        rows, new_rows = dynamic.train_lookup(tf.gather_nd(flat, real))
        table = self.tables()[name]
        dynamic.redraw(table, new_rows, self.config.seed * 1000 + list(self.tables()).index(name))
        for hook in self.new_rows_hooks:
            hook(table, new_rows)
        return tf.tensor_scatter_nd_update(tf.zeros_like(flat), real, rows)

    def _dynamic_rows(self, inputs: dict, training: bool) -> dict:
        """inputs with dynamic features' ids as rows (the target and both histories of an
        item feature share its map)."""
        users = self._rows([f"user_table_{t}" for t in range(len(inputs["user"]))],
                           [[ids] for ids in inputs["user"]], training)
        items = self._rows([f"item_table_{t}" for t in range(len(inputs["target"]))],
                           [list(parts) for parts in zip(inputs["target"], inputs["positive"],
                                                         inputs["negative"])], training)
        return {"user": [u[0] for u in users], "target": [i[0] for i in items],
                "positive": [i[1] for i in items], "negative": [i[2] for i in items]}

    def _embed(self, tables, ids_per_feature, deduplicate: bool):
        """_shared_lookup when training; without gradients (prediction) a plain gather per
        feature and part is cheaper: the same values without finding the distinct ids
        (at batch 4096, half of DIN's lookup time)."""
        if deduplicate or self._routed:  # a split table is read once, at distinct ids
            return self._shared_lookup(tables, ids_per_feature, deduplicate)
        return [tf.concat([tf.nn.embedding_lookup(table, ids_per_feature[f][part])
                           for f, table in enumerate(tables)], -1)
                for part in range(len(ids_per_feature[0]))]

    def _shared_lookup(self, tables, ids_per_feature, training: bool):
        """tables[f] read at ids_per_feature[f] (id tensors shaped alike for every f) -> per
        id tensor, [*ids.shape, F * dim]: the F features' embeddings side by side.

        Each table is read once for all its id tensors, at the batch's distinct ids: its
        gradient then holds one row per distinct id (already summed), not one per position,
        so the optimizer updates ~U rows without sorting and summing B * (1 + 2D). The
        features' distinct rows are stacked and gathered once for every position and feature:
        no concatenation of per-feature [B, D, dim] histories, one segment sum backward.
        A dynamic table split over the ranks is read at every id: its owner counts each
        occurrence to admit it."""
        width = len(tables) * self.config.embedding_dim
        rows, positions, offset = [], [], 0
        for table, id_tensors in zip(tables, ids_per_feature):
            flat = tf.concat([tf.reshape(ids, [-1]) for ids in id_tensors], 0)
            if self._hashed(table):
                distinct, position = flat, tf.range(tf.size(flat))
            elif table.ref() in self._routed:  # global ids, the variable holds a share
                distinct, position = tf.unique(flat)
            else:
                distinct, position = fused_ops.distinct_ids(flat, table.shape[0])
            rows.append(self._read(table, distinct, training))
            positions.append(position + offset)
            offset += tf.shape(distinct)[0]
        stacked = blocks.gather_rows(tf.concat(rows, 0), tf.stack(positions, 1))  # [N, F, dim]
        flat = tf.reshape(stacked, [-1, width])
        parts = ids_per_feature[0]
        out = []
        for ids, part in zip(parts, tf.split(flat, [tf.size(i) for i in parts])):
            part = tf.reshape(part, tf.concat([tf.shape(ids), [width]], 0))
            part.set_shape(ids.shape.concatenate([width]))
            out.append(part)
        return out

    def lookup(self, inputs: dict, training: bool = True) -> dict:
        """inputs: 'user' [ids [B]], 'target' [ids [B]], 'positive' / 'negative' [ids [B, D]]
        per item feature. Returns the embedded tensors and masks (id != 0 of the first
        positive feature) that forward() reads; only the parts this model type uses.
        training=False: no gradient will be taken (see _embed) and the negative history,
        read only by DIEN's auxiliary loss, is left out."""
        c = self.config
        mask = tf.cast(inputs["positive"][0] != 0, tf.float32)  # a dynamic id may be < 0
        if self.dynamic:
            inputs = self._dynamic_rows(inputs, training)
        out = {"user": self._embed(self.user_tables, [[ids] for ids in inputs["user"]],
                                   training)[0]}
        if c.model_type in ("din", "hstu"):
            out["target"], out["history"] = self._items(
                [[t, p] for t, p in zip(inputs["target"], inputs["positive"])], training)
            out["history_mask"] = mask
            return out
        parts = ["target", "short"] if c.model_type == "dien" else ["target", "long", "short"]
        parts += ["short_negative"] if training else []
        ids = []
        for t, p, n in zip(inputs["target"], inputs["positive"], inputs["negative"]):
            long, short = self.split_history(p)
            by_part = {"target": t, "long": long, "short": short,
                       "short_negative": self.split_history(n)[1]}
            ids.append([by_part[name] for name in parts])
        if c.model_type != "dien":
            out["long_mask"] = mask[:, :c.long_seq_length]
        out.update(zip(parts, self._items(ids, training)))
        out["short_mask"] = mask[:, c.long_seq_length:]
        return out

    # ---- everything after the lookups ----

    def forward(self, embedded: dict, compute_dtype=tf.float32, dropout_seed=None):
        """-> (logit [B], gsu_logit [B] or None, aux_loss [B] or None: None without the
        negative history), float32.
        dropout_seed: a stateless seed [2] while training (None: no dropout)."""
        c = self.config
        e = {k: tf.cast(v, compute_dtype) for k, v in embedded.items()}
        if c.reference:  # NVIDIA zeroes the padding's embeddings before its GRU and aux net
            for part in ("short", "short_negative"):
                if part in e:
                    e[part] = e[part] * e["short_mask"][:, :, None]
        user, target = e["user"], e["target"]
        if c.model_type == "hstu":
            return self._hstu_logits(e, compute_dtype, dropout_seed), None, None
        search, gsu_logit, aux = [], None, None
        if c.model_type == "din":
            unit = blocks.dot_product if c.dot else self.short_attention
            interest, _ = blocks.attention_pool(unit, target, e["history"],
                                                e["history_mask"], compute_dtype,
                                                normalize=c.dot)
        else:
            interest, aux = self._dien(e, compute_dtype, self._dropout(dropout_seed, 2))
        if c.model_type == "sim":
            esu, selection_mean, gsu_logit = self._search(e, compute_dtype,
                                                          self._dropout(dropout_seed, 1))
            search = [esu] + ([selection_mean] if c.dot else [])
        if c.reference:
            x = tf.concat(search + [target, interest, user], -1)
        else:
            pooled = [interest] + search[:1]
            x = tf.concat([user, target] + pooled + [target * p for p in pooled] + search[1:],
                          -1)
        return self._top_logit(x, compute_dtype, dropout_seed), gsu_logit, aux

    def _top_logit(self, x, compute_dtype, dropout_seed):
        """The stage-two classifier: x [N, width] -> logit [N] float32."""
        dropout = self._dropout(dropout_seed, 0)
        if self.config.reference:
            logit = self.top_mlp(x, compute_dtype, dropout)
        else:
            if dropout is not None:  # compact: on the stage-two input
                x = tf.nn.experimental.stateless_dropout(x, *dropout)
            logit = self.top_mlp(x, compute_dtype)
        return tf.cast(tf.squeeze(logit, -1), tf.float32)

    def _hstu_logits(self, e, compute_dtype, dropout_seed):
        """The HSTU ranker's logits: [B] of a target [B, w]; [B, C] of candidates
        [B, C, w]."""
        target = e["target"]
        candidates = target[:, None] if target.shape.rank == 2 else target
        y = tf.cast(self.hstu(e["history"], e["history_mask"], candidates, compute_dtype),
                    compute_dtype)
        user = tf.broadcast_to(e["user"][:, None],
                               tf.concat([tf.shape(y)[:2], [self.config.user_width]], 0))
        x = tf.reshape(tf.concat([y, user], -1), [-1, self._stage_two_width()])
        logit = tf.reshape(self._top_logit(x, compute_dtype, dropout_seed),
                           tf.shape(candidates)[:2])
        return logit if target.shape.rank == 3 else logit[:, 0]

    def score_candidates(self, inputs: dict, compute_dtype=tf.float32):
        """HSTU: inputs as lookup()'s with each item feature's 'target' ids [B, C], C
        candidates per history -> logits [B, C] in one pass (a candidate's logit is the one
        it gets scored alone)."""
        if self.config.model_type != "hstu":
            raise SimConfigError("scoring several candidates per history in one pass is "
                                 "--model_type hstu's")
        return self.forward(self.lookup(inputs, training=False), compute_dtype)[0]

    def _dropout(self, seed, block: int):
        """(rate, stateless seed) of one MLP's dropout at this step, or None (off)."""
        if seed is None or self.config.dropout_rate <= 0:
            return None
        # the step is the seed's second half: blocks apart by 2**40 steps never meet
        return self.config.dropout_rate, seed + tf.constant([0, block << 40], seed.dtype)

    def _dien(self, e, compute_dtype, dropout=None):
        if self.config.reference:
            return self._dien_reference(e, compute_dtype, dropout)
        states = self.gru(e["short"], e["short_mask"], compute_dtype)
        aux = None if "short_negative" not in e else blocks.auxiliary_loss(
            self.aux_mlp, states, e["short"], e["short_negative"], e["short_mask"],
            compute_dtype)
        scores = self.short_attention(e["target"], states, compute_dtype)
        attention = blocks.masked_softmax(scores, e["short_mask"])
        evolved = self.augru(states, e["short_mask"], compute_dtype, attention)
        return evolved[:, -1], aux

    def _dien_reference(self, e, compute_dtype, dropout):
        """NVIDIA's DIENItemSequenceInteractionBlock over the (zeroed-padding) short part and
        its auxiliary loss: the attention's softmax hands a row without behaviours uniform
        weights, as NVIDIA's."""
        short = blocks.time_major(e["short"])  # the recurrences' layout
        states = self.gru(short, compute_dtype)
        aux = None if "short_negative" not in e else blocks.reference_auxiliary_loss(
            self.aux_mlp, states, short, blocks.time_major(e["short_negative"]),
            e["short_mask"], compute_dtype, dropout)
        scores = self.short_attention(e["target"], states, compute_dtype)
        attention = blocks.masked_softmax(scores, e["short_mask"], zero_padding=False)
        return self.augru(states, tf.transpose(attention), compute_dtype), aux

    def _search(self, e, compute_dtype, dropout=None):
        """-> (ESU's pooled selection, the selection's masked mean, GSU logit)."""
        c = self.config
        target, long, mask = e["target"], e["long"], e["long_mask"]
        gsu_pooled, weights = blocks.attention_pool(
            blocks.dot_product if c.dot else self.gsu_scorer, target, long, mask,
            compute_dtype, normalize=True)
        if c.reference:
            gsu_logit = self.gsu_head(tf.concat([target, gsu_pooled, e["user"]], -1),
                                      compute_dtype, dropout)
        else:
            gsu_logit = self.gsu_head(tf.concat([e["user"], target, gsu_pooled,
                                                 target * gsu_pooled], -1), compute_dtype)
        gsu_logit = tf.cast(tf.squeeze(gsu_logit, -1), tf.float32)
        k = min(c.gsu_top_k, c.long_seq_length)
        indices, selected_mask = blocks.top_k_selection(tf.stop_gradient(weights), k)
        selected = blocks.batch_gather_rows(long, indices)
        esu, _ = blocks.attention_pool(blocks.dot_product if c.dot else self.long_attention,
                                       target, selected, selected_mask, compute_dtype,
                                       normalize=c.dot)
        return esu, blocks.masked_mean_plus_one(selected, selected_mask), gsu_logit
