"""Device configuration: the local rank's GPU with memory growth, or none with --cpu.
(That it runs before TensorFlow's first op is checked under horovodrun in test_hybrid.)"""
import tensorflow as tf

from core.parallel import comm


def test_local_rank_gets_its_gpu_with_memory_growth(monkeypatch):
    calls = []
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["gpu0", "gpu1"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices",
                        lambda devices, kind=None: calls.append(("visible", devices, kind)))
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth",
                        lambda device, on: calls.append(("growth", device, on)))
    comm.configure_devices(cpu=False, local_rank=3)
    assert calls == [("visible", "gpu1", "GPU"), ("growth", "gpu1", True)]
    calls.clear()
    comm.configure_devices(cpu=True, local_rank=3)
    assert calls == [("visible", [], "GPU")]
