"""What DLRM and DCNv2 read: the split-binary format's channels (categorical, numerical,
label), and the shapes of NVIDIA's synthetic Criteo variants."""
from __future__ import annotations

from core.feature_spec import (CATEGORICAL_CHANNEL, CHANNELS, LABEL_CHANNEL, LABEL_DTYPES,
                               NUMERICAL_CHANNEL, SPLIT_BINARY, ChannelContract, ChannelRule,
                               FeatureSpec, FeatureSpecError)


def _check_split_binary_chunk(spec: "FeatureSpec", where: str, features: list) -> None:
    """Split-binary layout: one channel per file, categorical features and the label alone,
    the numerical block whole and in channel order."""
    channels = {spec.channel_of(n) for n in features}
    if len(channels) > 1:
        raise FeatureSpecError(f"{where}: features {features} mix channels "
                               f"{sorted(channels)}; each chunk holds one channel")
    channel = channels.pop()
    if channel in (CATEGORICAL_CHANNEL, LABEL_CHANNEL) and len(features) != 1:
        raise FeatureSpecError(f"{where}: a {channel} feature must be alone in its "
                               f"chunk, found {features}")
    numerical = spec.channel(NUMERICAL_CHANNEL)
    if channel == NUMERICAL_CHANNEL and features != numerical:
        raise FeatureSpecError(f"{where}: all numerical features must be in one chunk "
                               f"in channel order {numerical}, found {features}")


# The split-binary format's layout: what DLRM reads and what SplitBinaryReader/Writer check.
DLRM_CONTRACT = ChannelContract(
    model="DLRM", chunk_types=(SPLIT_BINARY,),
    channels={CATEGORICAL_CHANNEL: ChannelRule("categorical"),
              NUMERICAL_CHANNEL: ChannelRule("numerical", same_dtype=True),
              LABEL_CHANNEL: ChannelRule("label", 1, 1, dtypes=LABEL_DTYPES)},
    required_channels=CHANNELS, nonempty_any=(CATEGORICAL_CHANNEL, NUMERICAL_CHANNEL),
    check_chunk=_check_split_binary_chunk)

# Cardinalities of the 26 categorical features of the Criteo 1TB click logs after
# preprocessing with frequency thresholds 15, 3 and 0 (values seen fewer times than the
# threshold share one id), in the feature order NVIDIA's DLRM_and_DCNv2 TensorFlow 2 example
# uses for its synthetic variants criteo_t15/t3/t0_synthetic (checked against the `variants`
# table of TensorFlow2/Recommendation/DLRM_and_DCNv2/dataloading/generate_feature_spec.py in
# NVIDIA/DeepLearningExamples, commit d53419f). Their t3 and t0 lists are not in the t15
# (C1..C26) order; they are kept exactly as published so that the shapes match.
CRITEO_CARDINALITIES = {
    15: [7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469, 245828, 11,
         2209, 10667, 104, 4, 968, 15, 8165896, 2675940, 7156453, 302516, 12022, 97, 35],
    3: [45833188, 36747, 1572176, 345139, 11, 2209, 11268, 128, 4, 975, 15, 48937457, 17246,
        11316796, 40094537, 452104, 12607, 105, 36, 7414, 20244, 4, 7115, 1442, 63, 29275261],
    0: [227605432, 39061, 3067956, 405283, 11, 2209, 11939, 155, 4, 977, 15, 292775614, 17296,
        40790948, 187188510, 590152, 12974, 109, 37, 7425, 20266, 4, 7123, 1544, 64,
        130229467],
}
CRITEO_NUM_NUMERICAL = 13
CRITEO_VARIANTS = {f"criteo_t{t}_synthetic": t for t in CRITEO_CARDINALITIES}


def criteo_variant(variant: str) -> FeatureSpec:
    """The split-binary spec of one of NVIDIA's synthetic Criteo variants."""
    if variant not in CRITEO_VARIANTS:
        raise FeatureSpecError(f"unknown feature spec variant '{variant}', expected one of "
                               f"{sorted(CRITEO_VARIANTS)}")
    return FeatureSpec.get_default(CRITEO_NUM_NUMERICAL,
                                   CRITEO_CARDINALITIES[CRITEO_VARIANTS[variant]])
