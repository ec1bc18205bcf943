#!/usr/bin/env python3
"""Write random embedding sizes for the categorical features of a Wide & Deep feature spec.

    python gen_embedding_sizes.py --feature_spec_in SPEC.yaml --output SIZES.json
                                  [--max_size 256] [--seed S]

As NVIDIA's Wide & Deep tool of the same name: every feature of the channels
onehot_categorical and multihot_categorical gets a size drawn uniformly from 1..--max_size,
written as JSON {feature: size} for `python -m wide_and_deep.main --embedding_sizes_file`.
--seed makes the draw repeatable (NVIDIA's draws anew each run, as does no --seed here).
"""
from __future__ import annotations

import argparse
import json
import random
import sys

from core.cli import run_cli
from core.feature_spec import FeatureSpec, FeatureSpecError
from core.files import atomic_write_text
from wide_and_deep.contract import MULTIHOT_CHANNEL, ONEHOT_CHANNEL


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--feature_spec_in", default="feature_spec.yaml",
                   help="path of the feature spec (default feature_spec.yaml)")
    p.add_argument("--output", required=True, help="JSON file to write")
    p.add_argument("--max_size", type=int, default=256,
                   help="largest size drawn (default 256)")
    p.add_argument("--seed", type=int, help="random seed (default: none, a new draw each run)")
    return p.parse_args(argv)


def embedding_sizes(spec: FeatureSpec, max_size: int, seed=None) -> dict:
    if max_size < 1:
        raise FeatureSpecError(f"--max_size must be at least 1, found {max_size}")
    rng = random.Random(seed)
    return {name: rng.randint(1, max_size)
            for name in spec.channel(ONEHOT_CHANNEL) + spec.channel(MULTIHOT_CHANNEL)}


def main(argv=None) -> int:
    args = parse_args(argv)

    def work():
        spec = FeatureSpec.from_yaml(args.feature_spec_in)
        sizes = embedding_sizes(spec, args.max_size, args.seed)
        atomic_write_text(args.output, json.dumps(sizes, indent=1) + "\n")
        return f"wrote {args.output}: {len(sizes)} embedding sizes"
    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
