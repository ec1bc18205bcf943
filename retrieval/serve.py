"""Answer histories with an exported retriever: each history's top k items.

  python -m retrieval.serve --model_dir OUT --src FILE --format lines --top_k K
      [--batch_size 256]

OUT: a retrieval.main output directory (its saved_model/) or the SavedModel's directory.
FILE holds one history per line, `user item item ...` (oldest first; the ids the SavedModel
takes). Prints one line per history: `user id id ...`, K ids best first. When the export has
an index (`--mode export --index faiss`), the ids come from it: the query from the
SavedModel's `encode`, its nearest items by inner product from the index (approximate; its
recall at export is in OUT/saved_model/item_index.json); else from the SavedModel's exact
brute force (`serving_default`, at most the k it was exported with).
"""
from __future__ import annotations

import os
import sys

import numpy as np

from core.cli import ArgumentParser, run_cli
from retrieval import index as item_index
from retrieval.export import EMBEDDINGS_FILE

FORMATS = ("lines",)


def saved_model_dir(model_dir: str) -> str:
    for candidate in (os.path.join(model_dir, "saved_model"), model_dir):
        if os.path.exists(os.path.join(candidate, "saved_model.pb")):
            return candidate
    raise ValueError(f"--model_dir {model_dir}: no SavedModel there nor in its saved_model/ "
                     f"(retrieval.main --mode export writes one)")


def read_histories(src: str) -> tuple:
    """(user tokens, histories: lists of int ids) of a `user item item ...` file."""
    users, histories = [], []
    try:
        with open(src, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                fields = line.split()
                if not fields:
                    continue
                try:
                    histories.append([int(x) for x in fields[1:]])
                except ValueError:
                    raise ValueError(f"{src} line {number}: expected `user item item ...` "
                                     f"with integer item ids, found '{line.strip()}'") from None
                users.append(fields[0])
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--src {src}: cannot read it ({getattr(e, 'strerror', None) or e})") \
            from None
    return users, histories


def padded(histories: list) -> np.ndarray:
    """int64 [n, longest] histories left-padded with 0 (at least one column)."""
    width = max([len(h) for h in histories] + [1])
    out = np.zeros((len(histories), width), np.int64)
    for row, h in zip(out, histories):
        if h:
            row[width - len(h):] = h
    return out


class Server:
    def __init__(self, model_dir: str, k: int):
        import tensorflow as tf
        directory = saved_model_dir(model_dir)
        self.model = tf.saved_model.load(directory)
        inputs = self.model.signatures["serving_default"].structured_input_signature[1]
        if "timestamps" in inputs:
            raise ValueError(f"--model_dir {model_dir}: the model reads timestamps, which "
                             f"--format lines does not carry")
        self.k, self.index = k, item_index.load(directory)
        if self.index is not None:
            with np.load(os.path.join(directory, EMBEDDINGS_FILE)) as saved:
                self.ids = saved["ids"]
            self.k = min(k, len(self.ids))
        else:
            exported = self.model.signatures["serving_default"].structured_outputs
            self.k = min(k, int(exported["top_k_ids"].shape[1] or k))

    def top_k(self, histories: np.ndarray) -> np.ndarray:
        """int64 [n, k] ids, best first (0 where the index found fewer)."""
        import tensorflow as tf
        ids = tf.constant(histories)
        if self.index is None:
            return self.model.signatures["serving_default"](item_ids=ids)[
                "top_k_ids"].numpy()[:, :self.k]
        queries = self.model.signatures["encode"](item_ids=ids)["query"].numpy()
        _, positions = item_index.search(self.index[0], queries, self.k)
        return np.where(positions >= 0, self.ids[np.maximum(positions, 0)], 0)


def serve(model_dir: str, src: str, layout: str, k: int, batch_size: int, out=sys.stdout):
    if layout not in FORMATS:
        raise ValueError(f"--format must be one of {list(FORMATS)}, found '{layout}'")
    if k < 1 or batch_size < 1:
        raise ValueError(f"--top_k and --batch_size must be at least 1, found {k} and "
                         f"{batch_size}")
    server = Server(model_dir, k)
    users, histories = read_histories(src)
    for start in range(0, len(histories), batch_size):
        answers = server.top_k(padded(histories[start:start + batch_size]))
        out.write("".join(f"{user} {' '.join(map(str, row))}\n"
                          for user, row in zip(users[start:start + batch_size], answers)))
    out.flush()


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model_dir", required=True,
                   help="retrieval.main's --output_dir (or its saved_model/)")
    p.add_argument("--src", required=True, help="histories, one per line")
    p.add_argument("--format", default="lines", choices=FORMATS,
                   help="lines: `user item item ...`, oldest first")
    p.add_argument("--top_k", type=int, default=10, help="ids per history")
    p.add_argument("--batch_size", type=int, default=256, help="histories per call")
    a = p.parse_args(argv)
    return run_cli(lambda: serve(a.model_dir, a.src, a.format, a.top_k, a.batch_size))


if __name__ == "__main__":
    sys.exit(main())
