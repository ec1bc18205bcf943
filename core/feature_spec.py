"""FeatureSpec: what a dataset is (features, files, channels), loaded from yaml and validated.

The yaml has four sections:
  feature_spec:  name -> {dtype, cardinality (categorical only), dimensions: [d] or
                 max_hotness: d (values per row of a multi-hot or sequence feature; NVIDIA's
                 Wide & Deep spells it max_hotness, both are read and the tools write both)}
  source_spec:   mapping ('train', 'test', optionally 'validation') -> list of chunks
                 {type: split_binary, features: [...], files: [...]}
  channel_spec:  channel ('categorical', 'numerical', 'label') -> list of feature names
  metadata:      free-form (e.g. row counts written by the tools)
File paths are relative to the directory holding the yaml.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

import numpy as np
import yaml

from core.files import atomic_write_text

CATEGORICAL_CHANNEL = "categorical"
NUMERICAL_CHANNEL = "numerical"
LABEL_CHANNEL = "label"
CHANNELS = (CATEGORICAL_CHANNEL, NUMERICAL_CHANNEL, LABEL_CHANNEL)

TRAIN_MAPPING = "train"
TEST_MAPPING = "test"
VALIDATION_MAPPING = "validation"
REQUIRED_MAPPINGS = (TRAIN_MAPPING, TEST_MAPPING)
KNOWN_MAPPINGS = (TRAIN_MAPPING, TEST_MAPPING, VALIDATION_MAPPING)

SPLIT_BINARY = "split_binary"
CSV = "csv"
PARQUET = "parquet"
TFRECORD = "tfrecord"
CHUNK_TYPES = (SPLIT_BINARY, CSV, PARQUET, TFRECORD)
AUTO_CARDINALITY = "auto"
CATEGORICAL_DTYPES = ("int8", "int16", "int32", "int64")
# float16 is the format's type; float32 is accepted for tools that want exact values.
NUMERICAL_DTYPES = ("float16", "float32")
# Columnar files keep numerical values as written (NVIDIA's Wide & Deep writes float64).
COLUMNAR_NUMERICAL_DTYPES = NUMERICAL_DTYPES + ("float64",)
MAX_HOTNESS = "max_hotness"  # NVIDIA's Wide & Deep name of dimensions[0]
LABEL_DTYPES = ("bool", "int8")
# Columnar formats store labels as they come (0/1 in any integer or float column).
COLUMNAR_LABEL_DTYPES = ("bool", "int8", "int16", "int32", "int64", "float32")

DEFAULT_FILENAME = "feature_spec.yaml"
# The dtype of a feature whose spec gives none and whose file has no schema, by channel kind
# (NVIDIA's Wide & Deep specs carry no dtypes).
DYNAMIC = "dynamic"  # a categorical feature whose table learns its ids (core/dynamic.py)
EVICTION_POLICIES = ("lru",)

DEFAULT_DTYPES = {"categorical": "int64", "id": "int64", "numerical": "float32", "label": "int8"}

class FeatureSpecError(ValueError):
    """A FeatureSpec that this model cannot use; the message names the culprit."""


@dataclass(frozen=True)
class DynamicSpec:
    """A feature's `dynamic` mapping: its table maps any int64 id to a row as training sees
    it (core/dynamic.py); `cardinality` is then the table's capacity in rows. pending_per_row:
    the ids waiting for min_count a table remembers, per row of capacity (the pending ring;
    about 66 bytes each)."""
    min_count: int = 1
    eviction: str = "lru"
    pending_per_row: int = 4

    @classmethod
    def parse(cls, name: str, value) -> "DynamicSpec":
        if value is None or value is True:
            value = {}
        if not isinstance(value, dict) or set(value) - set(cls.__dataclass_fields__):
            raise FeatureSpecError(f"feature '{name}': dynamic must be a mapping with "
                                   f"min_count, eviction and pending_per_row, found {value!r}")
        spec = cls(**value)
        for key in ("min_count", "pending_per_row"):
            if not _is_positive_int(getattr(spec, key)):
                raise FeatureSpecError(f"feature '{name}': dynamic {key} must be an integer "
                                       f">= 1, found {getattr(spec, key)!r}")
        if spec.eviction not in EVICTION_POLICIES:
            raise FeatureSpecError(f"feature '{name}': dynamic eviction must be one of "
                                   f"{list(EVICTION_POLICIES)}, found {spec.eviction!r}")
        return spec


def narrowest_int_dtype(cardinality: int) -> str:
    """Smallest signed integer type holding ids 0..cardinality-1."""
    largest_id = max(int(cardinality) - 1, 0)
    for dtype in CATEGORICAL_DTYPES:
        if largest_id <= np.iinfo(dtype).max:
            return dtype
    raise FeatureSpecError(f"cardinality {cardinality} does not fit in int64")


def _plain(value):
    """Numpy scalars and tuples inside a spec -> plain Python values that yaml.safe_dump takes."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.dtype):
        return str(value)
    return value


def _is_positive_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
        and value >= 1


def dtype_name(value):
    """Canonical numpy name of a dtype given in a spec, or None if it is not a dtype."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return str(np.dtype(value))
    except (TypeError, ValueError):
        return None


def hotness(props) -> object:
    """Values per row from `dimensions: [d]` or `max_hotness: d` (None when neither is given);
    FeatureSpecError when they are malformed or disagree. props: one feature's mapping."""
    props = props or {}
    dims, hot = props.get("dimensions"), props.get(MAX_HOTNESS)
    if dims is not None and not (isinstance(dims, list) and len(dims) == 1
                                 and _is_positive_int(dims[0])):
        raise FeatureSpecError(f"dimensions must be a list of one positive integer (e.g. [3]), "
                               f"found {dims!r}")
    if hot is not None and not _is_positive_int(hot):
        raise FeatureSpecError(f"{MAX_HOTNESS} must be a positive integer, found {hot!r}")
    if dims is not None and hot is not None and int(dims[0]) != int(hot):
        raise FeatureSpecError(f"dimensions {dims} and {MAX_HOTNESS} {hot} disagree")
    if dims is not None:
        return int(dims[0])
    return None if hot is None else int(hot)


def feature_hotness(name: str, props, where: str = "feature_spec: ") -> object:
    """hotness(props) with the error naming the feature."""
    try:
        return hotness(props)
    except FeatureSpecError as e:
        raise FeatureSpecError(f"{where}feature '{name}': {e}") from None


def allowed_dtype(value, allowed):
    """The numpy name of dtype `value` if it is one of `allowed`, else None."""
    try:
        name = str(np.dtype(value))
    except (TypeError, ValueError):
        return None
    return name if name in allowed else None


def read_spec_yaml(path: str) -> dict:
    """The top-level mapping of a feature-spec yaml file (FeatureSpecError otherwise)."""
    if not os.path.isfile(path):
        raise FeatureSpecError(f"feature spec file not found: {path}")
    with open(path) as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise FeatureSpecError(f"{path}: not valid yaml ({e})".replace("\n", " ")) from None
    if not isinstance(raw, dict):
        raise FeatureSpecError(f"{path}: expected a mapping with sections feature_spec, "
                               f"source_spec, channel_spec, metadata")
    return raw


def check_mapping_names(source_spec: dict, where: str = "") -> None:
    """train and test present, nothing but train/test/validation."""
    for mapping in REQUIRED_MAPPINGS:
        if mapping not in source_spec:
            raise FeatureSpecError(f"{where}source_spec: mapping '{mapping}' is required, found "
                                   f"{sorted(source_spec)}")
    for mapping in source_spec:
        if mapping not in KNOWN_MAPPINGS:
            raise FeatureSpecError(f"{where}source_spec: unknown mapping '{mapping}', expected "
                                   f"some of {list(KNOWN_MAPPINGS)}")


@dataclass
class FeatureSpec:
    feature_spec: dict
    source_spec: dict
    channel_spec: dict
    metadata: dict = field(default_factory=dict)
    base_directory: str = "."
    # The contract of the last validate(): its id convention bounds the readers' id checks.
    contract: object = field(default=None, repr=False, compare=False)

    # ---- loading and saving -------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str) -> "FeatureSpec":
        raw = read_spec_yaml(path)
        missing = [s for s in ("feature_spec", "source_spec", "channel_spec") if s not in raw]
        if missing:
            raise FeatureSpecError(f"{path}: missing section(s) {', '.join(missing)}")
        return cls(feature_spec=raw["feature_spec"] or {}, source_spec=raw["source_spec"] or {},
                   channel_spec=raw["channel_spec"] or {}, metadata=raw.get("metadata") or {},
                   base_directory=os.path.dirname(os.path.abspath(path)))

    def to_dict(self) -> dict:
        return {"feature_spec": copy.deepcopy(self.feature_spec),
                "source_spec": copy.deepcopy(self.source_spec),
                "channel_spec": copy.deepcopy(self.channel_spec),
                "metadata": copy.deepcopy(self.metadata)}

    def to_yaml(self, path: str) -> None:
        atomic_write_text(path, yaml.safe_dump(_plain(self.to_dict()), sort_keys=False))

    def copy(self) -> "FeatureSpec":
        return FeatureSpec(**self.to_dict(), base_directory=self.base_directory,
                           contract=self.contract)

    # ---- accessors ----------------------------------------------------------------------
    @property
    def categorical_features(self) -> list:
        return list(self.channel_spec.get(CATEGORICAL_CHANNEL) or [])

    @property
    def numerical_features(self) -> list:
        return list(self.channel_spec.get(NUMERICAL_CHANNEL) or [])

    @property
    def label_feature(self) -> str:
        return self.channel_spec[LABEL_CHANNEL][0]

    @property
    def cardinalities(self) -> list:
        return [int(self.feature_spec[f]["cardinality"]) for f in self.categorical_features]

    def dtype(self, feature: str) -> np.dtype:
        return np.dtype(self.feature_spec[feature]["dtype"])

    def channel(self, name: str) -> list:
        """Features of a channel, in channel order (empty when the channel is absent)."""
        return list(self.channel_spec.get(name) or [])

    def dimension(self, feature: str):
        """Values per row of a multi-hot or sequence feature (`dimensions: [d]` or
        `max_hotness: d`); None for a scalar feature."""
        return hotness(self.feature_spec[feature])

    def cardinality(self, feature: str) -> int:
        return int(self.feature_spec[feature]["cardinality"])

    def id_limit(self, feature: str):
        """Largest valid id of a feature with an integer cardinality under the id convention
        of the contract the spec was validated with: cardinality - 1, or cardinality where
        ids count from 1 and 0 pads (SIM); None for a feature without a cardinality."""
        card = (self.feature_spec.get(feature) or {}).get("cardinality")
        if not _is_positive_int(card) or self.dynamic(feature):
            return None  # a dynamic table takes any int64 id
        return int(card) if self.ids_from_one else int(card) - 1

    def dynamic(self, feature: str):
        """The DynamicSpec of a dynamic feature, None for a static one."""
        props = self.feature_spec.get(feature) or {}
        return DynamicSpec.parse(feature, props[DYNAMIC]) if DYNAMIC in props else None

    def with_dynamic(self, features, spec: DynamicSpec = DynamicSpec()) -> "FeatureSpec":
        """A copy whose `features` (names of features with a cardinality, or ['all']) are
        dynamic with `spec`: turns an existing spec's chosen tables into open-vocabulary ones."""
        out = self.copy()
        tables = [f for f, props in self.feature_spec.items() if "cardinality" in (props or {})]
        names = tables if list(features) == ["all"] else list(features)
        for name in names:
            if name not in tables:
                raise FeatureSpecError(f"dynamic feature '{name}' has no table (features with "
                                       f"a cardinality: {tables})")
            entry = {"min_count": spec.min_count, "eviction": spec.eviction}
            if spec.pending_per_row != DynamicSpec.pending_per_row:  # else specs read as before
                entry["pending_per_row"] = spec.pending_per_row
            out.feature_spec[name] = dict(out.feature_spec[name], dynamic=entry)
        return out

    @property
    def ids_from_one(self) -> bool:
        return bool(getattr(self.contract, "ids_from_one", False))

    @property
    def id_convention(self) -> str:
        return ("ids 1..cardinality, 0 = padding" if self.ids_from_one
                else "ids 0..cardinality-1")

    @property
    def mappings(self) -> list:
        return list(self.source_spec.keys())

    def chunk_path(self, chunk: dict) -> str:
        return os.path.join(self.base_directory, chunk["files"][0])

    def feature_files(self, mapping: str) -> dict:
        """For one mapping: {'numerical': path, 'label': path, 'categorical': [path per feature
        in channel order]}. Assumes a validated spec."""
        by_feature = {}
        for chunk in self.source_spec[mapping]:
            for feature in chunk["features"]:
                by_feature[feature] = self.chunk_path(chunk)
        numerical = self.numerical_features
        return {"numerical": by_feature[numerical[0]] if numerical else None,
                "label": by_feature[self.label_feature],
                "categorical": [by_feature[f] for f in self.categorical_features]}

    # ---- validation ---------------------------------------------------------------------
    def validate(self, contract: "ChannelContract" = None) -> "FeatureSpec":
        """Raise FeatureSpecError (one line naming the culprit) unless the spec is well formed
        and fits the channel contract (a model family's or a format's; None: the structural
        checks only, any chunk type, no channel rules)."""
        self.contract = contract
        self._validate_features()
        if contract is not None:
            contract.check_channels(self)
        if not isinstance(self.source_spec, dict):
            raise FeatureSpecError("source_spec: expected a mapping of mapping names")
        check_mapping_names(self.source_spec)
        for mapping in self.source_spec:
            self._validate_mapping(mapping, contract)
        return self

    def _validate_features(self) -> None:
        fs = self.feature_spec
        if not isinstance(fs, dict) or not fs:
            raise FeatureSpecError("feature_spec: expected a non-empty mapping of feature names")
        for name, props in fs.items():
            if not isinstance(name, str) or not name:
                raise FeatureSpecError(f"feature_spec: feature names must be non-empty strings, "
                                       f"found {name!r}")
            if not isinstance(props, dict) or "dtype" not in props:
                raise FeatureSpecError(f"feature_spec: feature '{name}' needs a dtype")
            if dtype_name(props["dtype"]) is None:
                raise FeatureSpecError(f"feature_spec: feature '{name}' has unknown dtype "
                                       f"{props['dtype']!r}")
            feature_hotness(name, props)
            if DYNAMIC in props:
                DynamicSpec.parse(name, props[DYNAMIC])
        if not isinstance(self.metadata, dict):
            raise FeatureSpecError(f"metadata: expected a mapping, found "
                                   f"{type(self.metadata).__name__}")

    def _validate_mapping(self, mapping: str, contract: "ChannelContract") -> None:
        chunks = self.source_spec[mapping]
        if not isinstance(chunks, list) or not chunks:
            raise FeatureSpecError(f"source_spec: mapping '{mapping}' must be a non-empty "
                                   f"list of chunks")
        present, file_owner = {}, {}
        for index, chunk in enumerate(chunks):
            where = f"source_spec: mapping '{mapping}' chunk {index}"
            if isinstance(chunk, dict) and isinstance(chunk.get("files"), list) \
                    and len(chunk["files"]) == 1 and isinstance(chunk["files"][0], str) \
                    and chunk["files"][0]:
                where += f" ({chunk['files'][0]})"
            if not isinstance(chunk, dict):
                raise FeatureSpecError(f"{where}: expected a mapping with type, features, files")
            types, reader = ((contract.chunk_types, contract.model) if contract
                             else (CHUNK_TYPES, "a FeatureSpec"))
            if chunk.get("type") not in types:
                raise FeatureSpecError(f"{where}: type must be one of {list(types)} for "
                                       f"{reader}, found {chunk.get('type')!r}")
            self._check_chunk_files(chunk, where, mapping, index, file_owner)
            features = chunk.get("features")
            if not isinstance(features, list) or not features:
                raise FeatureSpecError(f"{where}: features must be a non-empty list")
            for name in features:
                if not isinstance(name, str):
                    raise FeatureSpecError(f"{where}: features must be names, found {name!r}")
                if name in present:
                    raise FeatureSpecError(f"{where}: feature '{name}' appears twice in "
                                           f"mapping '{mapping}'")
                if name not in self.feature_spec:
                    raise FeatureSpecError(f"{where}: feature '{name}' is not described in "
                                           f"feature_spec")
                present[name] = index
            stray = [n for n in features if self.channel_of(n) is None]
            if stray:
                raise FeatureSpecError(f"{where}: feature(s) {stray} belong to no channel")
            if contract and contract.check_chunk:
                contract.check_chunk(self, where, features)
        for channel, rule in (contract.channels if contract else {}).items():
            if rule.mappings is not None and mapping not in rule.mappings:
                continue
            for name in self.channel(channel):
                if name not in present:
                    raise FeatureSpecError(f"source_spec: mapping '{mapping}' lacks feature "
                                           f"'{name}' of channel '{channel}'")

    @staticmethod
    def _check_chunk_files(chunk: dict, where: str, mapping: str, index: int,
                           file_owner: dict) -> None:
        files = chunk.get("files")
        if chunk["type"] == SPLIT_BINARY:  # the format: one feature block per file
            if not isinstance(files, list) or len(files) != 1:
                raise FeatureSpecError(f"{where}: exactly one file per chunk, found {files!r}")
        elif not isinstance(files, list) or not files:
            raise FeatureSpecError(f"{where}: files must be a non-empty list, found {files!r}")
        for name in files:
            if not isinstance(name, str) or not name.strip():
                raise FeatureSpecError(f"{where}: file name must be a non-empty string, found "
                                       f"{name!r}")
            if name in file_owner:
                raise FeatureSpecError(f"{where}: file '{name}' is already used by chunk "
                                       f"{file_owner[name]} of mapping '{mapping}'")
            file_owner[name] = index

    def channel_of(self, feature: str):
        for channel, names in self.channel_spec.items():
            if feature in (names or []):
                return channel
        return None

    # ---- generators ---------------------------------------------------------------------
    @classmethod
    def get_default(cls, num_numerical: int, cardinalities, mappings=REQUIRED_MAPPINGS,
                    numerical_dtype: str = "float16", label_dtype: str = "bool",
                    categorical_dtypes=None, numerical_names=None, categorical_names=None,
                    label_name: str = "label") -> "FeatureSpec":
        """The standard split-binary layout: <mapping>/numerical.bin, label.bin, cat_<i>.bin.

        Feature names default to num_<i>, cat_<i> and label; categorical dtypes default to the
        narrowest integer type holding each cardinality. File names depend only on the
        position of a feature, so any feature name is safe."""
        cardinalities = [int(c) for c in cardinalities]
        numerical = (list(numerical_names) if numerical_names is not None
                     else [f"num_{i}" for i in range(num_numerical)])
        if len(numerical) != num_numerical:
            raise FeatureSpecError(f"{len(numerical)} numerical names for {num_numerical} "
                                   f"numerical features")
        categorical = (list(categorical_names) if categorical_names is not None
                       else [f"cat_{i}" for i in range(len(cardinalities))])
        if len(categorical) != len(cardinalities):
            raise FeatureSpecError(f"{len(categorical)} categorical names for "
                                   f"{len(cardinalities)} cardinalities")
        cat_dtypes = (list(categorical_dtypes) if categorical_dtypes is not None
                      else [narrowest_int_dtype(c) for c in cardinalities])
        feature_spec = {name: {"dtype": str(np.dtype(numerical_dtype))} for name in numerical}
        for name, card, dtype in zip(categorical, cardinalities, cat_dtypes):
            feature_spec[name] = {"dtype": str(np.dtype(dtype)), "cardinality": card}
        feature_spec[label_name] = {"dtype": str(np.dtype(label_dtype))}
        source_spec = {}
        for mapping in mappings:
            chunks = []
            if numerical:
                chunks.append({"type": SPLIT_BINARY, "features": list(numerical),
                               "files": [f"{mapping}/numerical.bin"]})
            chunks.append({"type": SPLIT_BINARY, "features": [label_name],
                           "files": [f"{mapping}/label.bin"]})
            for i, name in enumerate(categorical):
                chunks.append({"type": SPLIT_BINARY, "features": [name],
                               "files": [f"{mapping}/cat_{i}.bin"]})
            source_spec[mapping] = chunks
        channel_spec = {CATEGORICAL_CHANNEL: categorical, NUMERICAL_CHANNEL: numerical,
                        LABEL_CHANNEL: [label_name]}
        return cls(feature_spec, source_spec, channel_spec, {})


# ---- channel contracts: what a model family reads ---------------------------------------
@dataclass(frozen=True)
class ChannelRule:
    """What a channel may hold.

    kind: 'categorical' (integer ids below an integer cardinality), 'numerical' (floats),
    'label' (0/1) or 'id' (any integer, e.g. a display id used to group rows).
    shape: 'scalar' (no dimensions), 'multi' (dimensions required) or 'any'.
    mappings: the mappings that must carry the channel's features (None: every mapping).
    """
    kind: str
    min_features: int = 0
    max_features: int = None
    shape: str = "scalar"
    dtypes: tuple = None
    mappings: tuple = None
    same_dtype: bool = False

    def allowed_dtypes(self) -> tuple:
        if self.dtypes is not None:
            return self.dtypes
        return {"categorical": CATEGORICAL_DTYPES, "id": CATEGORICAL_DTYPES,
                "numerical": NUMERICAL_DTYPES, "label": COLUMNAR_LABEL_DTYPES}[self.kind]

    def count_text(self) -> str:
        if self.min_features == self.max_features:
            return "exactly one feature" if self.min_features == 1 else \
                f"exactly {self.min_features} features"
        if self.max_features is not None:
            return f"at most {self.max_features} feature(s)"
        return f"at least {self.min_features} feature(s)"


@dataclass(frozen=True)
class ChannelContract:
    """A model family's channels and the chunk types it reads. check_chunk(spec, where,
    features) and check_spec(spec) add rules that span several features or channels.
    ids_from_one: the family's ids lie in 1..cardinality with 0 the padding (NVIDIA's SIM),
    instead of 0..cardinality-1; the readers check ids against it."""
    model: str
    chunk_types: tuple
    channels: dict
    required_channels: tuple = ()
    nonempty_any: tuple = ()
    check_chunk: object = None
    check_spec: object = None
    ids_from_one: bool = False

    def check_channels(self, spec: "FeatureSpec") -> None:
        cs = spec.channel_spec
        if not isinstance(cs, dict):
            raise FeatureSpecError(f"channel_spec: expected a mapping of channels "
                                   f"{list(self.channels)}, found {cs!r}")
        unknown = [c for c in cs if c not in self.channels]
        if unknown:
            raise FeatureSpecError(f"channel_spec: unknown channel(s) {unknown} for "
                                   f"{self.model}; expected the channels {list(self.channels)}")
        missing = [c for c in self.required_channels if c not in cs]
        if missing:
            raise FeatureSpecError(f"channel_spec: {self.model} needs the channels "
                                   f"{list(self.required_channels)}, missing {missing}")
        self._check_names(spec)
        for channel, rule in self.channels.items():
            self._check_channel(spec, channel, rule)
        if self.nonempty_any and not any(spec.channel(c) for c in self.nonempty_any):
            raise FeatureSpecError(f"channel_spec: no features in any of the channels "
                                   f"{list(self.nonempty_any)}")
        if self.check_spec:
            self.check_spec(spec)

    def _check_names(self, spec: "FeatureSpec") -> None:
        seen = {}
        for channel in self.channels:
            names = spec.channel_spec.get(channel) or []
            if not isinstance(names, list):
                raise FeatureSpecError(f"channel_spec: channel '{channel}' must be a list")
            for name in names:
                if not isinstance(name, str):
                    raise FeatureSpecError(f"channel_spec: channel '{channel}' lists {name!r}; "
                                           f"expected feature names")
                if name in seen:
                    raise FeatureSpecError(f"channel_spec: feature '{name}' appears twice "
                                           f"(in '{seen[name]}' and '{channel}')")
                seen[name] = channel
                if name not in spec.feature_spec:
                    raise FeatureSpecError(f"channel_spec: feature '{name}' of channel "
                                           f"'{channel}' is not described in feature_spec")

    def _check_channel(self, spec: "FeatureSpec", channel: str, rule: ChannelRule) -> None:
        names = spec.channel(channel)
        if len(names) < rule.min_features or \
                (rule.max_features is not None and len(names) > rule.max_features):
            raise FeatureSpecError(f"channel_spec: channel '{channel}' must hold "
                                   f"{rule.count_text()}, found {len(names)}: {names}")
        for name in names:
            _check_feature(spec, name, channel, rule, self.model)
        dtypes = {dtype_name(spec.feature_spec[n]["dtype"]) for n in names}
        if rule.same_dtype and len(dtypes) > 1:
            first = dtype_name(spec.feature_spec[names[0]]["dtype"])
            odd = [n for n in names if dtype_name(spec.feature_spec[n]["dtype"]) != first]
            raise FeatureSpecError(f"{channel} features must share one dtype, found "
                                   f"{sorted(dtypes)}: '{names[0]}' is {first} but {odd} are "
                                   f"not")


def with_dtypes(spec: "FeatureSpec", contract: ChannelContract, found: dict) -> "FeatureSpec":
    """A copy of spec in which every channel feature lacking a dtype has one: found[name] (the
    data's own type, e.g. from a parquet schema) when its channel allows that type, else the
    channel kind's DEFAULT_DTYPES entry (ids stored as floats are read as int64)."""
    out = spec.copy()
    for channel, rule in contract.channels.items():
        for name in out.channel(channel):
            if name not in out.feature_spec or \
                    not isinstance(out.feature_spec[name] or {}, dict):
                continue  # validation names the culprit
            props = dict(out.feature_spec[name] or {})
            if "dtype" not in props:
                own = dtype_name(found.get(name))
                props["dtype"] = own if own in rule.allowed_dtypes() else \
                    DEFAULT_DTYPES[rule.kind]
            out.feature_spec[name] = props
    return out


def _check_feature(spec: "FeatureSpec", name: str, channel: str, rule: ChannelRule,
                   model: str) -> None:
    props = spec.feature_spec[name]
    dtype = dtype_name(props["dtype"])
    allowed = rule.allowed_dtypes()
    if dtype not in allowed:
        raise FeatureSpecError(f"feature '{name}': {rule.kind} dtype must be one of "
                               f"{list(allowed)}, found '{props['dtype']}'")
    if rule.kind == "categorical":
        card = props.get("cardinality")
        if not _is_positive_int(card):
            raise FeatureSpecError(f"feature '{name}': cardinality must be a positive "
                                   f"integer, found {card!r}")
        if DYNAMIC not in props and int(card) - 1 > np.iinfo(dtype).max:
            raise FeatureSpecError(f"feature '{name}': cardinality {card} does not fit "
                                   f"dtype {props['dtype']}")
    width = hotness(props)
    if rule.shape == "scalar" and width:
        raise FeatureSpecError(f"feature '{name}' of channel '{channel}': {model} reads one "
                               f"value per row here, found dimensions [{width}]")
    if rule.shape == "multi" and not width:
        raise FeatureSpecError(f"feature '{name}' of channel '{channel}': {model} needs "
                               f"dimensions [d] or max_hotness d (values per row), found none")
