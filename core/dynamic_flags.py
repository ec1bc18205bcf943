"""--dynamic_features and its admission flags, as the absl tools define them (DLRM's main.py
keeps its own definitions: NVIDIA-style bounds checks with their own messages)."""
from __future__ import annotations

from absl import flags

from core.feature_spec import DynamicSpec

# the flags defined here belong to the tool that calls define_dynamic_flags (its --helpshort,
# the parameters it logs, tests' drop_cli_flags), not to this module
flags.disclaim_key_flags()


def define_dynamic_flags(features_help: str) -> None:
    flags.DEFINE_list("dynamic_features", [], features_help)
    flags.DEFINE_integer("dynamic_min_count", 1, "--dynamic_features: occurrences before an "
                         "id gets a row of its own", lower_bound=1)
    flags.DEFINE_integer("dynamic_pending_per_row", DynamicSpec.pending_per_row,
                         "--dynamic_min_count > 1: ids waiting for it that a table remembers, "
                         "per row of its capacity (about 66 bytes each; the oldest is "
                         "forgotten)", lower_bound=1)


def with_dynamic_flags(spec, values=flags.FLAGS):
    """The spec with the --dynamic_features tables turned dynamic."""
    if not values.dynamic_features:
        return spec
    return spec.with_dynamic(values.dynamic_features, DynamicSpec(
        values.dynamic_min_count, pending_per_row=values.dynamic_pending_per_row))
