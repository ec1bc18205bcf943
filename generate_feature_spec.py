#!/usr/bin/env python3
"""Write a feature_spec.yaml describing a split-binary dataset's shape.

Either a named Criteo variant (13 numerical features and the 26 cardinalities of Criteo 1TB
preprocessed with frequency threshold 15, 3 or 0):
    python generate_feature_spec.py --variant criteo_t15_synthetic --dst feature_spec.yaml
or a custom shape:
    python generate_feature_spec.py --num_numerical 4 --cardinalities 100,2000,5 --dst fs.yaml

The spec uses the default layout (<mapping>/numerical.bin, label.bin, cat_<i>.bin for the
train and test mappings), float16 numerical features, a bool label and, per categorical
feature, the narrowest integer dtype holding its ids. transcribe.py reads it to know what
shape of synthetic data to produce.
"""
from __future__ import annotations

import argparse
import sys

from core.cli import run_cli
from dlrm_contract import CRITEO_VARIANTS, DLRM_CONTRACT, criteo_variant
from core.feature_spec import (FeatureSpec, FeatureSpecError, KNOWN_MAPPINGS, LABEL_DTYPES,
                               NUMERICAL_DTYPES, REQUIRED_MAPPINGS)


def _cardinalities(text: str) -> list:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, found '{text}'")
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"cardinalities must be >= 1, found '{text}'")
    return values


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    shape = p.add_mutually_exclusive_group(required=True)
    shape.add_argument("--variant", choices=sorted(CRITEO_VARIANTS),
                       help="a named Criteo 1TB shape (frequency threshold 15, 3 or 0)")
    shape.add_argument("--cardinalities", type=_cardinalities,
                       help="custom shape: comma-separated cardinality of each categorical "
                            "feature, e.g. 1000,20,7")
    p.add_argument("--num_numerical", type=int, default=None,
                   help="custom shape: number of numerical features (default 13); with "
                        "--variant it must be 13 or left out")
    p.add_argument("--dst", default="feature_spec.yaml",
                   help="output yaml path (default: feature_spec.yaml); written atomically")
    p.add_argument("--numerical_dtype", choices=NUMERICAL_DTYPES, default="float16",
                   help="dtype of the numerical features (default float16)")
    p.add_argument("--label_dtype", choices=LABEL_DTYPES, default="bool",
                   help="dtype of the label (default bool)")
    p.add_argument("--mappings", default=",".join(REQUIRED_MAPPINGS),
                   help="comma-separated mappings to describe, from "
                        f"{','.join(KNOWN_MAPPINGS)} (default train,test)")
    return p.parse_args(argv)


def build_spec(args) -> FeatureSpec:
    mappings = [m for m in args.mappings.split(",") if m]
    if args.variant:
        base = criteo_variant(args.variant)
        num_numerical = len(base.numerical_features)
        if args.num_numerical not in (None, num_numerical):
            raise FeatureSpecError(f"--num_numerical {args.num_numerical} contradicts variant "
                                   f"{args.variant} ({num_numerical} numerical features)")
        cardinalities = base.cardinalities
    else:
        num_numerical = 13 if args.num_numerical is None else args.num_numerical
        cardinalities = args.cardinalities
        if num_numerical < 0:
            raise FeatureSpecError(f"--num_numerical must be >= 0, found {num_numerical}")
    spec = FeatureSpec.get_default(num_numerical, cardinalities, mappings=mappings,
                                   numerical_dtype=args.numerical_dtype,
                                   label_dtype=args.label_dtype)
    if args.variant:
        spec.metadata["variant"] = args.variant
    return spec.validate(DLRM_CONTRACT)


def main(argv=None) -> int:
    args = parse_args(argv)

    def work():
        spec = build_spec(args)
        spec.to_yaml(args.dst)
        return (f"wrote {args.dst}: {len(spec.numerical_features)} numerical, "
                f"{len(spec.categorical_features)} categorical features "
                f"(total cardinality {sum(spec.cardinalities):,}), mappings {spec.mappings}")
    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
