"""The channels Wide & Deep reads from a FeatureSpec (parquet data)."""
from feature_spec import (COLUMNAR_NUMERICAL_DTYPES, LABEL_CHANNEL, NUMERICAL_CHANNEL, PARQUET,
                          TEST_MAPPING, ChannelContract, ChannelRule)

ONEHOT_CHANNEL = "onehot_categorical"
MULTIHOT_CHANNEL = "multihot_categorical"
MAP_CHANNEL = "map"

WIDE_DEEP_CONTRACT = ChannelContract(
    model="Wide & Deep", chunk_types=(PARQUET,),
    channels={ONEHOT_CHANNEL: ChannelRule("categorical"),
              MULTIHOT_CHANNEL: ChannelRule("categorical", shape="multi"),
              NUMERICAL_CHANNEL: ChannelRule("numerical", dtypes=COLUMNAR_NUMERICAL_DTYPES),
              LABEL_CHANNEL: ChannelRule("label", 1, 1),
              # the display id that groups test rows for MAP@12; read from the test data only
              MAP_CHANNEL: ChannelRule("id", 0, 1, mappings=(TEST_MAPPING,))},
    required_channels=(LABEL_CHANNEL,),
    nonempty_any=(ONEHOT_CHANNEL, MULTIHOT_CHANNEL, NUMERICAL_CHANNEL))
