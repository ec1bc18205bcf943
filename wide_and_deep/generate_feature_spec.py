"""Write a Wide & Deep feature spec (no data files): the reference Outbrain shape, scaled,
or a custom one.

  python -m wide_and_deep.generate_feature_spec --dst spec/feature_spec.yaml [--scale 0.01]
  python -m wide_and_deep.generate_feature_spec --dst F --onehot 1000:16,50:8 \
      --multihot 200:16 --num_numerical 4
"""
from __future__ import annotations

import argparse
import sys

from core.cli import run_cli
from core.feature_spec import FeatureSpecError
from wide_and_deep.contract import build_spec, reference_spec


def parse_shapes(text: str, flag: str, prefix: str) -> list:
    """'card:dim,card:dim' -> [(name, dim, card)]"""
    out = []
    for i, item in enumerate(filter(None, text.split(","))):
        parts = item.split(":")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise FeatureSpecError(f"{flag}: expected cardinality:dim pairs of positive "
                                   f"integers, found '{item}'")
        out.append((f"{prefix}_{i}", int(parts[1]), int(parts[0])))
    return out


def write_spec(args) -> str:
    if args.scale <= 0:
        raise FeatureSpecError(f"--scale must be positive, found {args.scale}")
    if args.onehot is None:
        spec = reference_spec(args.scale)
    else:
        multihot = parse_shapes(args.multihot, "--multihot", "multihot")
        spec = build_spec(parse_shapes(args.onehot, "--onehot", "onehot"), multihot,
                          [f"num_{i}" for i in range(args.num_numerical)],
                          request_features=[n for n, _, _ in multihot],
                          hotness=args.hotness)
    spec.to_yaml(args.dst)
    return f"wrote {args.dst}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dst", required=True, help="feature_spec.yaml to write")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply the reference cardinalities (each stays >= 2)")
    p.add_argument("--onehot", help="custom shape: one-hot features as card:dim,...")
    p.add_argument("--multihot", default="", help="custom shape: multi-hot features")
    p.add_argument("--hotness", type=int, default=3, help="custom shape: multi-hot length")
    p.add_argument("--num_numerical", type=int, default=0, help="custom shape")
    args = p.parse_args(argv)
    return run_cli(lambda: write_spec(args))


if __name__ == "__main__":
    sys.exit(main())
