"""What is computed: bottom MLP -> embeddings -> interaction -> top MLP -> one logit."""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from core.parallel.comm import Communicator
from embedding import EmbeddingLayer
from core.layers import MLP
from core.parallel.placement import PlacementPlan
from interaction import CrossInteraction, DotInteraction, dot_interact_tf, round_up_8


@dataclass(frozen=True)
class ModelConfig:
    num_numerical: int
    cardinalities: tuple
    embedding_dim: int = 128
    bottom_mlp_dims: tuple = (512, 256, 128)
    top_mlp_dims: tuple = (1024, 1024, 512, 256, 1)
    interaction: str = "dot"
    num_cross_layers: int = 3
    cross_layer_projection_dim: int = 512
    embedding_trainable: bool = True
    seed: int = 0
    dynamic: tuple = ()  # per table: a DynamicSpec (open vocabulary) or None; () all static

    def validate(self) -> "ModelConfig":
        if self.interaction not in ("dot", "cross"):
            raise ValueError(f"--interaction must be 'dot' or 'cross', found "
                             f"'{self.interaction}'")
        if not self.top_mlp_dims or self.top_mlp_dims[-1] != 1:
            raise ValueError(f"--top_mlp_dims must end with 1 (one logit), found "
                             f"{list(self.top_mlp_dims)}")
        if self.num_numerical and not self.bottom_mlp_dims:
            raise ValueError("--bottom_mlp_dims is empty but the data has numerical features")
        if self.interaction == "dot" and not self.num_numerical:
            raise ValueError("the dot interaction needs numerical features (a bottom MLP); "
                             "use --interaction=cross for data without them")
        if (self.interaction == "dot" and self.num_numerical
                and self.bottom_mlp_dims[-1] != self.embedding_dim):
            raise ValueError(f"the last --bottom_mlp_dims width ({self.bottom_mlp_dims[-1]}) "
                             f"must equal --embedding_dim ({self.embedding_dim}) for the dot "
                             f"interaction")
        if any(d < 1 for d in tuple(self.bottom_mlp_dims) + tuple(self.top_mlp_dims)) \
                or self.embedding_dim < 1:
            raise ValueError("MLP widths and --embedding_dim must be positive")
        return self


class DLRM(tf.Module):
    """DLRM (dot interaction) or DCNv2 (cross interaction) for one rank of a placement plan."""

    def __init__(self, config: ModelConfig, plan: PlacementPlan, comm: Communicator = None,
                 dot_implementation=dot_interact_tf, offload_threshold_bytes: int = 0,
                 name="dlrm"):
        super().__init__(name=name)
        self.config = config.validate()
        self.plan = plan
        self.comm = comm or Communicator()
        dim, num_tables = config.embedding_dim, len(config.cardinalities)
        self.padded_numerical = round_up_8(config.num_numerical) if config.num_numerical else 0
        with self.name_scope:
            self.bottom_mlp = (MLP(self.padded_numerical, config.bottom_mlp_dims, True,
                                   config.seed, 100, "bottom_mlp")
                               if config.num_numerical else None)
            self.embeddings = EmbeddingLayer(plan, self.comm, config.seed,
                                             config.embedding_trainable,
                                             offload_threshold_bytes, config.dynamic)
            bottom_width = config.bottom_mlp_dims[-1] if config.num_numerical else 0
            if config.interaction == "dot":
                self.interaction = DotInteraction(dot_implementation)
                width = self.interaction.output_width(num_tables, dim)
            else:
                self.interaction = CrossInteraction(bottom_width + num_tables * dim,
                                                    config.num_cross_layers,
                                                    config.cross_layer_projection_dim,
                                                    config.seed)
                width = self.interaction.input_width
            self.top_mlp = MLP(width, config.top_mlp_dims, False, config.seed, 200, "top_mlp")

    def dense_variables(self) -> dict:
        """Data-parallel variables by checkpoint name (same on every rank)."""
        out = {}
        if self.bottom_mlp is not None:
            out.update(self.bottom_mlp.named_variables("bottom_mlp"))
        if isinstance(self.interaction, CrossInteraction):
            out.update(self.interaction.named_variables())
        out.update(self.top_mlp.named_variables("top_mlp"))
        return out

    def __call__(self, numerical, categorical, global_rows, compute_dtype=tf.float32):
        """numerical [b_local, num_numerical]; categorical: [B_global] ids for the tables this
        rank reads; global_rows: B_global. Returns logits [b_local]."""
        embedded = self.embeddings.lookup(categorical, global_rows, training=False)[0]
        return self.forward_dense(numerical, embedded, compute_dtype)

    def forward_dense(self, numerical, embedded, compute_dtype=tf.float32):
        """Everything after the lookup: embedded, one [b_local, dim] float32 tensor per table
        -> logits. The name scopes name the pieces in a profile (bench/train_throughput.py
        --profile)."""
        embedded = [tf.cast(e, compute_dtype) for e in embedded]
        with tf.name_scope("bottom_mlp"):
            if self.bottom_mlp is not None:
                x = tf.cast(numerical, compute_dtype)
                pad = self.padded_numerical - self.config.num_numerical
                if pad:
                    x = tf.pad(x, [[0, 0], [0, pad]])
                bottom = self.bottom_mlp(x, compute_dtype)
            else:
                bottom = tf.zeros([tf.shape(embedded[0])[0], 0], compute_dtype)
        with tf.name_scope("interaction"):
            if isinstance(self.interaction, DotInteraction):
                features = self.interaction(bottom, embedded)
            else:
                features = self.interaction(bottom, embedded, compute_dtype)
        with tf.name_scope("top_mlp"):
            logits = self.top_mlp(features, compute_dtype)
        return tf.cast(tf.squeeze(logits, axis=1), tf.float32)
