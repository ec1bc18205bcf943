"""One user's time-ordered interactions -> SIM examples (pure numpy; Spark runs it per user).

Interaction k (k = 0 .. n-1) becomes two examples sharing its history (the up to D
interactions before it, oldest first) and a negative history (for each behaviour, a random
other item): the real item with label 1 and a random other item with label 0. The last
interaction's examples are the user's test examples, the others training examples. Random
draws come from a generator seeded by (seed, user id), so the output does not depend on how
Spark partitions the users.
"""
from __future__ import annotations

import numpy as np


def other_items(rng, avoid, num_items: int):
    """A uniform item of 1..num_items different from each of `avoid` (needs num_items >= 2)."""
    drawn = rng.integers(1, num_items, np.shape(avoid))
    return drawn + (drawn >= avoid)


def user_examples(user: int, items, item_category, history_length: int, seed: int):
    """items: the user's item ids (1..) in time order; item_category: category id by item
    id (entry 0 unused).
    Yields (split, row) with row = (user, k, label, item, category, hist_items, hist_cats,
    neg_items, neg_cats) in (k, label) order."""
    items = np.asarray(items, np.int64)
    num_items = len(item_category) - 1
    rng = np.random.default_rng([seed, user])
    for k, item in enumerate(items):
        history = items[max(0, k - history_length):k]
        negative_history = other_items(rng, history, num_items)
        negative_target = int(other_items(rng, item, num_items))
        split = "test" if k == len(items) - 1 else "train"
        shared = (history.tolist(), item_category[history].tolist(),
                  negative_history.tolist(), item_category[negative_history].tolist())
        for label, target in ((1, int(item)), (0, negative_target)):
            yield split, (user, k, label, target, int(item_category[target])) + shared
