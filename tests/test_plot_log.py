"""plot_log: the curves read from a DLLogger log, and one PNG panel per metric found."""
import pytest

from core import plot_log
from core.dllog import DLLogger


def write_log(path, with_map):
    logger = DLLogger(str(path), stdout=False)
    for step in (10, 20, 30):
        logger.log((0, step), {"loss": 1.0 / step})
    for epoch, step in ((0, 30), (1, 60)):
        metrics = {"auc": 0.6 + epoch / 10, "validation_loss": 0.5}
        if with_map:
            metrics["map12"] = 0.5 + epoch / 10
        logger.log((epoch, step), metrics)
    logger.log((), {"auc": 0.7})  # the final record is not a point of the curves
    logger.close()


@pytest.mark.parametrize("with_map", [False, True])
def test_curves_and_panels(tmp_path, with_map, monkeypatch):
    log = tmp_path / "log.json"
    write_log(log, with_map)
    loss, evals = plot_log.curves(plot_log.read_log(str(log)))
    assert loss == [(10, 0.1), (20, 0.05), (30, 1 / 30)]
    assert evals["auc"] == [(30, 0.6), (60, 0.7)]
    assert ("map12" in evals) == with_map
    if with_map:
        assert evals["map12"] == [(30, 0.5), (60, 0.6)]
    import matplotlib.pyplot as plt
    made = []
    real = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: made.append(a) or real(*a, **k))
    png = tmp_path / "curves.png"
    plot_log.plot(str(log), str(png))
    assert made == [(1, 3 if with_map else 2)]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_log_without_curves_is_an_error(tmp_path):
    log = tmp_path / "log.json"
    logger = DLLogger(str(log), stdout=False)
    logger.log((), {"throughput": 5.0})
    logger.close()
    with pytest.raises(ValueError, match="no loss"):
        plot_log.plot(str(log), str(tmp_path / "x.png"))


def test_the_kept_point_is_marked_and_the_loss_named(tmp_path, monkeypatch):
    """The final record's kept step becomes a marker on each metric panel (with the held-out
    test figure when there is one), and the loss axis says what the run's loss is."""
    log = tmp_path / "log.json"
    logger = DLLogger(str(log), stdout=False)
    logger.log((), {"loss_name": "total loss: BCE + auxiliary loss"})
    logger.log((0, 10), {"loss": 2.0})
    for epoch, step, auc in ((0, 10, 0.70), (1, 20, 0.80), (2, 30, 0.75)):
        logger.log((epoch, step), {"auc": auc, "map12": auc - 0.1})
    logger.log((), {"auc": 0.80, "kept_epoch": 1, "kept_step": 20, "best_epoch": 1,
                    "best_step": 20, "test_auc": 0.79, "test_map12": 0.68})
    logger.close()
    records = plot_log.read_log(str(log))
    assert plot_log.run_facts(records) == ("total loss: BCE + auxiliary loss",
                                           (20, "kept: epoch 1"),
                                           {"auc": 0.79, "map12": 0.68})
    import matplotlib.pyplot as plt
    figures = []
    real = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: figures.append(real(*a, **k)) or
                        figures[-1])
    monkeypatch.setattr(plt, "close", lambda fig: None)
    plot_log.plot(str(log), str(tmp_path / "curves.png"))
    axes = figures[0][1]
    assert axes[0].get_ylabel() == "total loss: BCE + auxiliary loss"
    assert axes[1].get_title() == "validation AUC"
    legends = [ax.get_legend().get_texts()[0].get_text() for ax in axes[1:]]
    assert legends == ["kept: epoch 1: 0.8000 (held-out test 0.7900)",
                       "kept: epoch 1: 0.7000 (held-out test 0.6800)"]
