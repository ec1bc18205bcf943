"""--dynamic_features and its admission flags, as the absl tools define them (DLRM's main.py
keeps its own definitions: NVIDIA-style bounds checks with their own messages)."""
from __future__ import annotations

from absl import flags

from core.feature_spec import DynamicSpec


def define_dynamic_flags(features_help: str, module_name: str) -> None:
    """Defines the flags as module_name's (the tool's own: its --helpshort, the parameters
    it logs, and a test's drop_cli_flags find them there)."""
    flags.DEFINE_list("dynamic_features", [], features_help, module_name=module_name)
    flags.DEFINE_integer("dynamic_min_count", 1, "--dynamic_features: occurrences before an "
                         "id gets a row of its own", lower_bound=1, module_name=module_name)
    flags.DEFINE_integer("dynamic_pending_per_row", DynamicSpec.pending_per_row,
                         "--dynamic_min_count > 1: ids waiting for it that a table remembers, "
                         "per row of its capacity (about 66 bytes each; the oldest is "
                         "forgotten)", lower_bound=1, module_name=module_name)


def with_dynamic_flags(spec, values=flags.FLAGS):
    """The spec with the --dynamic_features tables turned dynamic."""
    if not values.dynamic_features:
        return spec
    return spec.with_dynamic(values.dynamic_features, DynamicSpec(
        values.dynamic_min_count, pending_per_row=values.dynamic_pending_per_row))
