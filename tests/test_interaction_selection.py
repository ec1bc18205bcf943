"""Which dot interaction runs: the CUDA op only with a GPU and a loadable op, the TensorFlow
reference otherwise, and clear errors for impossible requests."""
import pytest
import tensorflow as tf

import interaction
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


def test_source_tree_op_package_is_found():
    module, reason = interaction._load_cuda_op()
    # importable from the source tree; the library itself may or may not be built
    import tensorflow_dot_based_interact as pkg
    assert pkg.__file__.startswith(interaction.CUDA_OP_SOURCE_DIR) or module is not None
    assert (module is None) == (reason is not None)
