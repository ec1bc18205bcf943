"""HSTU as a target-aware ranker (`--model_type hstu`): the history's D behaviours, then C
candidate tokens, through the HSTU layers of core/hstu.py (M-FALCON, Zhai et al., 2024).

    x_j = e(h_j) sqrt(w) + p_j       history position j < D (0 where padding), w the item width
    t_c = e(c) sqrt(w) + p_D          every candidate at the position after the history
    per layer: history query i reads keys j <= i that hold a behaviour (and itself);
               candidate c reads the history's behaviours and itself, no other candidate
    y_c = LayerNorm(t_c) * scale + offset                after the last layer
    logit_c = head([y_c, user])       the family's classifier (sim/model.py)

with the relative-position bias of each layer read at (key position - query position) and
n = D in A = SiLU(Q K^T + bias) / n. Candidates never meet, so C candidates scored in one
pass get the logits each gets alone, at the cost O(D^2 + C D) of one history.
"""
from __future__ import annotations

import tensorflow as tf

from core import hstu


class HstuRanker(tf.Module):
    """The positions, HSTU layers and final norm over histories of `length` behaviours of
    items `width` wide."""

    def __init__(self, width: int, length: int, blocks: int, heads: int, seed: int, key: int,
                 name: str):
        super().__init__(name=name)
        self.length, self.heads = length, heads
        w = hstu.NamedWeights(seed, key)
        positions = length + 1  # the history's, then the candidates'
        with self.name_scope:
            self.positions = w.normal("positions", [positions, width], width ** -0.5)
            self.blocks = [hstu.block_weights(w, f"block_{b}/", width, positions)
                           for b in range(blocks)]
            self.final_norm = (w.constant("final_norm/scale", [width], 1.0),
                               w.constant("final_norm/offset", [width], 0.0))
        self.named = w.variables

    def named_variables(self, prefix: str) -> dict:
        return {f"{prefix}/{k}": v for k, v in self.named.items()}

    def __call__(self, history, mask, candidates, compute_dtype=tf.float32):
        """history [B, D, w], mask [B, D] (1 where a behaviour), candidates [B, C, w] ->
        [B, C, w] float32: each candidate's output."""
        d, scale = self.length, history.shape[-1] ** 0.5
        valid = mask > 0
        x = (tf.cast(history, tf.float32) * scale + self.positions[:d]) * \
            tf.cast(mask, tf.float32)[:, :, None]
        t = tf.cast(candidates, tf.float32) * scale + self.positions[d]
        causal = tf.linalg.band_part(tf.ones([d, d], tf.bool), -1, 0)
        # a padded query keeps itself as a key; its output is zeroed anyway
        visible = causal[None] & (valid[:, None, :] | tf.eye(d, dtype=tf.bool)[None])
        target_visible = tf.broadcast_to(valid[:, None, :],
                                         [tf.shape(t)[0], tf.shape(t)[1], d])
        history_positions = tf.range(d)
        bias_index = hstu.relative_positions(history_positions, history_positions, d + 1)
        target_index = hstu.relative_positions(tf.constant([d]), history_positions, d + 1)
        for block in self.blocks:
            x, t = hstu.layer_with_targets(
                block, x, t, visible, hstu.attention_bias(block, bias_index),
                target_visible, hstu.attention_bias(block, target_index),
                block["position_bias"][d], self.heads, d, compute_dtype)
            x *= tf.cast(mask, tf.float32)[:, :, None]
        return hstu.layer_norm(t, *self.final_norm)
