"""A retrieval dataset of any size with a signal planted in the order of each user's items.

  python -m retrieval.synthetic --users U --items N --dst DIR [--topic_size 1000]
      [--mean_length 20] [--switch 0.1] [--max_length 200] [--seed 1] [--overwrite]

The catalogue's items 1..N fall in topics of about --topic_size items (a seeded random
partition: a topic's items are spread over the ids). Topics are drawn log-uniformly over a
seeded order (the Zipf-like law of TensorFlow's log-uniform sampler, P(rank k) =
log((k + 2) / (k + 1)) / log(n + 1)), and an item within its topic the same way, so the
catalogue's popularity is Zipf-like. A user's first item opens a topic; each next item stays
in the current topic with probability 1 - switch, else a new topic is drawn. So the last
item's topic predicts the next item's, and that topic's most popular items are the best
guess: a model that learns the partition from the sequences alone reaches about
(1 - switch) x the share of a topic's top 10 (0.3 at the defaults), where the catalogue's
most popular items get a small fraction of it. The answer key is DIR/synthetic_topics.npz
(`topic` int32 [N + 1], item row r's topic, row 0 -1); both guesses' test HR@10 are printed
and kept in the spec's metadata (synthetic.test_hr@10).

History lengths are 3 + a geometric draw of mean --mean_length - 3. The layout, split and
metadata are retrieval.prepare_dataset's (--ids dense).
"""
from __future__ import annotations

import sys

import numpy as np
import psutil

from core.cli import ArgumentParser, run_cli
from retrieval.prepare_dataset import (DEFAULT_MAX_LENGTH, ROW_BYTES, PrepareError, Sequences,
                                       split_rows, summary, write_sequences)

TOPICS_FILE = "synthetic_topics.npz"
MIN_LENGTH = 3


def log_uniform(rng, sizes) -> np.ndarray:
    """A rank 0..sizes-1 per draw (sizes: int array), P(k) = log((k+2)/(k+1)) / log(n+1)."""
    sizes = np.asarray(sizes, np.float64)
    ranks = np.floor(np.exp(rng.random(sizes.shape) * np.log1p(sizes))) - 1
    return np.minimum(ranks, sizes - 1).astype(np.int64)


def topics_of(items: int, topic_size: int, rng) -> tuple:
    """(topic of each item row [items + 1] (row 0: -1), members: item ids grouped by topic,
    bounds: topic t's members are members[bounds[t]:bounds[t + 1]])."""
    count = max(1, round(items / topic_size))
    bounds = np.linspace(0, items, count + 1).round().astype(np.int64)
    members = rng.permutation(items).astype(np.int64) + 1
    topic = np.full(items + 1, -1, np.int32)
    topic[members] = np.repeat(np.arange(count, dtype=np.int32), np.diff(bounds))
    return topic, members, bounds


def generate(users: int, items: int, topic_size: int = 1000, mean_length: float = 20.0,
             switch: float = 0.1, seed: int = 1) -> tuple:
    """(Sequences of users 1..users, topic of each item row): the module doc's process."""
    rng = np.random.default_rng(seed)
    topic, members, bounds = topics_of(items, topic_size, rng)
    topic_order = rng.permutation(bounds.size - 1)  # which topic is the k-th most popular
    counts = MIN_LENGTH + rng.geometric(1.0 / max(mean_length - MIN_LENGTH + 1, 1.0), users) - 1
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    actions = int(counts.sum())
    opens = rng.random(actions) < switch
    opens[starts] = True  # a user's first item opens a topic
    opened = topic_order[log_uniform(rng, np.full(int(opens.sum()), topic_order.size))]
    current = opened[np.cumsum(opens) - 1]  # each action's topic: the last one opened
    sizes = np.diff(bounds)[current]
    chosen = members[bounds[current] + log_uniform(rng, sizes)]
    users_of = np.arange(1, users + 1, dtype=np.int64)
    return Sequences(chosen, starts, counts.astype(np.int64), users_of), topic


def reference_hit_rates(sequences: Sequences, topic: np.ndarray, k: int = 10) -> dict:
    """HR@k on the test rows (each held user's last item, the split's rule) of two guesses
    made from the training rows' popularity: the catalogue's k most popular items, and the k
    most popular of the topic of the user's last item before the target (the answer key's
    best guess). Without the topic rule a model can do no better than the first."""
    rows, starts = split_rows(sequences.counts), sequences.starts
    held, ends = rows["test"]
    targets = sequences.items[starts[held] + ends - 1]
    lasts = sequences.items[starts[held] + ends - 2]
    users, ends = rows["train"]
    train = np.concatenate([np.arange(starts[u], starts[u] + e) for u, e in zip(users, ends)]
                           + [np.zeros(0, np.int64)])
    popularity = np.bincount(sequences.items[train], minlength=topic.size)
    order = np.argsort(-popularity, kind="stable")
    order = order[order > 0]
    best_of_topic = {}
    for item in order:  # each topic's k most popular, in one pass over the catalogue
        kept = best_of_topic.setdefault(topic[item], [])
        if len(kept) < k:
            kept.append(item)
    return {"popularity": float(np.isin(targets, order[:k]).mean()),
            "answer_key": float(np.mean([t in best_of_topic.get(topic[last], ())
                                         for t, last in zip(targets, lasts)]))}


def make(users: int, items: int, dst: str, topic_size: int = 1000, mean_length: float = 20.0,
         switch: float = 0.1, max_length: int = DEFAULT_MAX_LENGTH, seed: int = 1,
         overwrite: bool = False):
    """Write the dataset; returns its FeatureSpec."""
    for name, value, low in (("--users", users, 1), ("--items", items, 1),
                             ("--topic_size", topic_size, 1), ("--max_length", max_length, 1)):
        if value < low:
            raise PrepareError(f"{name} must be at least {low}, found {value}")
    if not MIN_LENGTH <= mean_length or not 0 <= switch <= 1:
        raise PrepareError(f"--mean_length must be at least {MIN_LENGTH} and --switch in "
                           f"[0, 1], found {mean_length:g} and {switch:g}")
    memory = psutil.virtual_memory().total
    if items * ROW_BYTES > memory:
        raise PrepareError(f"--items {items:,}: a training process would hold "
                           f"{items * ROW_BYTES / 2**30:.1f} GiB of item table and optimizer "
                           f"slots ({ROW_BYTES} bytes a row), over this machine's "
                           f"{memory / 2**30:.0f} GiB")
    sequences, topic = generate(users, items, topic_size, mean_length, switch, seed)
    metadata = {"source": "retrieval.synthetic", "format": "synthetic", "ids": "dense",
                "users": users, "items": items,
                "distinct_items": int(np.unique(sequences.items).size),
                "interactions": int(sequences.items.size),
                "synthetic": {"topic_size": topic_size, "topics": int(topic.max()) + 1,
                              "mean_length": mean_length, "switch": switch, "seed": seed,
                              "answer_key": TOPICS_FILE,
                              "test_hr@10": reference_hit_rates(sequences, topic)}}
    return write_sequences(dst, sequences, items, max_length, metadata, overwrite=overwrite,
                           arrays={TOPICS_FILE: {"topic": topic}})


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, required=True, help="users (ids 1..U)")
    p.add_argument("--items", type=int, required=True, help="catalogue (ids 1..N)")
    p.add_argument("--dst", required=True, help="output dataset directory")
    p.add_argument("--topic_size", type=int, default=1000, help="items per topic (about)")
    p.add_argument("--mean_length", type=float, default=20.0, help="mean items per user")
    p.add_argument("--switch", type=float, default=0.1,
                   help="probability that the next item opens a new topic")
    p.add_argument("--max_length", type=int, default=DEFAULT_MAX_LENGTH,
                   help="items of history kept per row (a row holds max_length + 1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --dst")
    a = p.parse_args(argv)
    return run_cli(lambda: described(make(a.users, a.items, a.dst, a.topic_size,
                                          a.mean_length, a.switch, a.max_length, a.seed,
                                          a.overwrite)))


def described(spec) -> str:
    reference = spec.metadata["synthetic"]["test_hr@10"]
    return (f"{summary(spec)}; test HR@10 of the training rows' 10 most popular items "
            f"{reference['popularity']:.4f}, of the last item's topic's 10 most popular (the "
            f"answer key) {reference['answer_key']:.4f}")


if __name__ == "__main__":
    sys.exit(main())
