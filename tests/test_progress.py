"""Progress bookkeeping: throughput and ETA against hand-computed values with a fake clock."""
from training.progress import Progress, format_seconds


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_throughput_and_eta_by_hand():
    clock = FakeClock()
    progress = Progress(total_steps=10, samples_per_step=50, clock=clock)
    for _ in range(4):
        progress.step_done()
    clock.now += 2.0  # 4 steps x 50 samples in 2 s = 100 samples/s
    report = progress.report(step=4)
    assert report["samples_per_second"] == 100.0
    assert report["eta_seconds"] == 6 * 50 / 100.0
    assert report["interval_steps"] == 4


def test_restart_interval_forgets_steps_and_time_together():
    clock = FakeClock()
    progress = Progress(total_steps=10, samples_per_step=10, clock=clock)
    progress.step_done()
    progress.step_done()
    clock.now += 1.0
    progress.restart_interval()  # an evaluation happened: neither its time nor steps count
    clock.now += 5.0
    progress.restart_interval()
    progress.step_done()
    clock.now += 0.5
    assert progress.report(step=3)["samples_per_second"] == 10 / 0.5


def test_line_and_format_seconds():
    clock = FakeClock()
    progress = Progress(total_steps=5, samples_per_step=2, clock=clock)
    progress.step_done()
    clock.now += 1.0
    line = progress.line(1, progress.report(1), loss=0.25, epoch=0)
    assert line.startswith("step 1/5  loss 0.25  epoch 0  samples/s 2  ETA 0:00:04")
    assert format_seconds(3725) == "1:02:05"
