"""Loss scaling for float16 compute: gradients that underflow in float16 are kept by scaling
the loss up (and the gradients back down in float32).

A static scale never changes. The dynamic scale halves after a step whose gradients are not
finite on some rank (that step is skipped) and doubles after `growth_interval` clean steps in
a row; every rank takes the same decision because the finiteness check is summed across ranks.
"""
from __future__ import annotations

import tensorflow as tf

INITIAL_DYNAMIC_SCALE = 2.0 ** 15
GROWTH_INTERVAL = 2000


class StaticLossScale:
    dynamic = False

    def __init__(self, scale: float):
        self.scale = float(scale)
        self.needed = self.scale != 1.0


class DynamicLossScale:
    dynamic = needed = True

    def __init__(self, initial: float = INITIAL_DYNAMIC_SCALE,
                 growth_interval: int = GROWTH_INTERVAL):
        self.scale = tf.Variable(initial, dtype=tf.float32, trainable=False, name="loss_scale")
        self.clean_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                       name="loss_scale_clean_steps")
        self.growth_interval = growth_interval

    def update(self, finite):
        """After a step: halve on non-finite gradients, double after growth_interval clean
        steps (branch-free, so it costs no host sync)."""
        clean = tf.where(finite, self.clean_steps + 1, tf.constant(0, tf.int64))
        grow = clean >= self.growth_interval
        factor = tf.where(finite, tf.where(grow, 2.0, 1.0), 0.5)
        self.scale.assign(tf.maximum(self.scale * factor, 1.0))
        self.clean_steps.assign(tf.where(grow, tf.constant(0, tf.int64), clean))


def make_loss_scale(compute_dtype, static_scale=None):
    """static_scale (--loss_scale) when given; else dynamic for float16, none (1) otherwise:
    float32 and bfloat16 have float32's exponent range."""
    if static_scale is not None:
        if static_scale <= 0:
            raise ValueError(f"--loss_scale must be positive, found {static_scale}")
        return StaticLossScale(static_scale)
    if compute_dtype == tf.float16:
        return DynamicLossScale()
    return StaticLossScale(1.0)
