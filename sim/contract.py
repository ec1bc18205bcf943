"""The channels SIM, DIN and DIEN read from a FeatureSpec (TFRecord data)."""
from feature_spec import (LABEL_CHANNEL, TFRECORD, ChannelContract, ChannelRule,
                          FeatureSpecError)

USER_CHANNEL = "user_features"
TARGET_CHANNEL = "target_item_features"
POSITIVE_CHANNEL = "positive_history"
NEGATIVE_CHANNEL = "negative_history"


def _check_item_channels(spec) -> None:
    """Target item and both histories describe the same item features in the same order:
    feature i of each looks up table i, so counts and cardinalities must agree, and the two
    histories must be equally long."""
    target = spec.channel(TARGET_CHANNEL)
    for channel in (POSITIVE_CHANNEL, NEGATIVE_CHANNEL):
        history = spec.channel(channel)
        if len(history) != len(target):
            raise FeatureSpecError(f"channel_spec: '{channel}' lists {len(history)} features "
                                   f"{history} but '{TARGET_CHANNEL}' lists {len(target)} "
                                   f"{target}; they must match one to one (shared tables)")
        for item_feature, history_feature in zip(target, history):
            if spec.cardinality(item_feature) != spec.cardinality(history_feature):
                raise FeatureSpecError(
                    f"feature '{history_feature}' of '{channel}' has cardinality "
                    f"{spec.cardinality(history_feature)} but shares its table with "
                    f"'{item_feature}' of cardinality {spec.cardinality(item_feature)}")
    lengths = {f: spec.dimension(f)
               for f in spec.channel(POSITIVE_CHANNEL) + spec.channel(NEGATIVE_CHANNEL)}
    if len(set(lengths.values())) > 1:
        raise FeatureSpecError(f"history features must share one length (dimensions), found "
                               f"{lengths}")


SIM_CONTRACT = ChannelContract(
    model="SIM", chunk_types=(TFRECORD,),
    channels={USER_CHANNEL: ChannelRule("categorical"),
              TARGET_CHANNEL: ChannelRule("categorical", 1),
              POSITIVE_CHANNEL: ChannelRule("categorical", 1, shape="multi"),
              NEGATIVE_CHANNEL: ChannelRule("categorical", 1, shape="multi"),
              LABEL_CHANNEL: ChannelRule("label", 1, 1)},
    required_channels=(LABEL_CHANNEL, TARGET_CHANNEL, POSITIVE_CHANNEL, NEGATIVE_CHANNEL),
    check_spec=_check_item_channels, ids_from_one=True)
