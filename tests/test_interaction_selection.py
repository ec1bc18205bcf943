"""Which dot interaction runs: the CUDA op only with a GPU and a loadable op, the TensorFlow
reference otherwise, and clear errors for impossible requests."""
import importlib.util
import os
import sys

import pytest
import tensorflow as tf

import interaction
from conftest import drop_cli_flags
from interaction import dot_interact_tf, select_dot_implementation


class FakeOpModule:
    """Stands in for the CUDA op (computes with the reference)."""

    @staticmethod
    def dot_based_interact(x, bottom):
        return dot_interact_tf(x, bottom)


class BrokenOpModule:
    """Loads, but fails at launch (e.g. a driver older than the op's CUDA runtime)."""

    @staticmethod
    def dot_based_interact(x, bottom):
        raise tf.errors.InternalError(None, None, "CUDA driver version is insufficient")


class WrongOpModule:
    @staticmethod
    def dot_based_interact(x, bottom):
        return dot_interact_tf(x, bottom) + 1.0


def pretend_gpu(monkeypatch, present=True):
    real = tf.config.list_logical_devices
    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda kind=None: (["GPU:0"] if present else [])
                        if kind == "GPU" else real(kind))


def test_tensorflow_is_always_possible(monkeypatch):
    pretend_gpu(monkeypatch)
    assert select_dot_implementation("tensorflow") is dot_interact_tf


def test_auto_uses_tensorflow_on_cpu():
    assert select_dot_implementation("auto", use_cpu=True) is dot_interact_tf
    if not tf.config.list_logical_devices("GPU"):
        assert select_dot_implementation("auto") is dot_interact_tf


def test_auto_uses_the_op_when_loaded_and_on_gpu(monkeypatch):
    pretend_gpu(monkeypatch)
    monkeypatch.setattr(interaction, "_load_cuda_op", lambda: (FakeOpModule, None))
    assert select_dot_implementation("auto") is FakeOpModule.dot_based_interact
    assert select_dot_implementation("custom_cuda") is FakeOpModule.dot_based_interact
    for bad in (BrokenOpModule, WrongOpModule):  # a test launch guards auto
        monkeypatch.setattr(interaction, "_load_cuda_op", lambda: (bad, None))
        assert select_dot_implementation("auto") is dot_interact_tf
    monkeypatch.setattr(interaction, "_load_cuda_op", lambda: (None, "library not built"))
    assert select_dot_implementation("auto") is dot_interact_tf
    with pytest.raises(ValueError, match="cannot be loaded: library not built"):
        select_dot_implementation("custom_cuda")


def test_custom_cuda_errors():
    with pytest.raises(ValueError, match="cannot be combined with --cpu"):
        select_dot_implementation("custom_cuda", use_cpu=True)
    with pytest.raises(ValueError, match="must be one of"):
        select_dot_implementation("cuda")


def test_custom_cuda_without_gpu_is_an_error(monkeypatch):
    pretend_gpu(monkeypatch, present=False)
    with pytest.raises(ValueError, match="needs a GPU"):
        select_dot_implementation("custom_cuda")


def test_xla_keeps_the_op_out_with_a_logged_reason(monkeypatch, capsys):
    pretend_gpu(monkeypatch)
    monkeypatch.setattr(interaction, "_load_cuda_op", lambda: (FakeOpModule, None))
    assert select_dot_implementation("auto", xla=True) is dot_interact_tf
    assert "--xla compiles the interaction and the CUDA op has no XLA kernel" in \
        capsys.readouterr().err
    with pytest.raises(ValueError, match="custom_cuda cannot be combined with --xla"):
        select_dot_implementation("custom_cuda", xla=True)


def test_deploy_exports_the_tensorflow_interaction_unless_asked(monkeypatch, capsys):
    pretend_gpu(monkeypatch)
    monkeypatch.setattr(interaction, "_load_cuda_op", lambda: (FakeOpModule, None))
    assert select_dot_implementation("auto", export=True) is dot_interact_tf
    assert "loads without the op library" in capsys.readouterr().err
    assert select_dot_implementation("custom_cuda", export=True) is \
        FakeOpModule.dot_based_interact


def test_main_passes_xla_and_deploy_to_the_selection(monkeypatch):
    drop_cli_flags("sim.main")  # if an earlier test imported SIM's CLI (same absl flags)
    import main
    seen = {}

    def spy(requested, use_cpu, xla, export):
        seen.update(requested=requested, xla=xla, export=export)
        return dot_interact_tf

    monkeypatch.setattr(main, "select_dot_implementation", spy)  # main.build calls it
    from core.feature_spec import FeatureSpec
    spec = FeatureSpec.get_default(2, [10, 20])
    small = ["--embedding_dim", "4", "--bottom_mlp_dims", "4", "--top_mlp_dims", "4,1", "--cpu"]
    from core.parallel.comm import Communicator
    for args, expected in ((["--mode", "deploy", "--xla"], (False, True)),
                           (["--mode", "train", "--xla"], (True, False)),
                           (["--mode", "eval", "--xla"], (False, False))):
        main.FLAGS.unparse_flags()
        main.FLAGS(["main.py", *small, *args])
        main.build(Communicator(), spec)
        assert (seen["xla"], seen["export"]) == expected, args
    main.FLAGS.unparse_flags()


class LoadableLibrary:
    """The package's loader, with the library present or absent."""

    def __init__(self, loaded):
        self.loaded = loaded

    def load_op(self):
        return object() if self.loaded else None

    def load_error(self):
        return None if self.loaded else "library not built: no _dot_based_interact_ops.so"


def test_source_tree_op_package_is_found_and_reports_its_library(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("tensorflow_dot_based_interact")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if os.path.abspath(p) != interaction.CUDA_OP_SOURCE_DIR])
    installed = importlib.util.find_spec("tensorflow_dot_based_interact")
    module, reason = interaction._load_cuda_op()
    import tensorflow_dot_based_interact as pkg
    if installed is None:  # found in the source tree
        assert pkg.__file__.startswith(interaction.CUDA_OP_SOURCE_DIR + os.sep)
    else:
        assert pkg.__file__ == installed.origin
    assert (module is None) == (reason is not None)
    for loaded in (True, False):
        fake = LoadableLibrary(loaded)
        monkeypatch.setattr(pkg, "load_op", fake.load_op)
        monkeypatch.setattr(pkg, "load_error", fake.load_error)
        module, reason = interaction._load_cuda_op()
        assert (module, reason) == ((pkg, None) if loaded else (None, fake.load_error()))
