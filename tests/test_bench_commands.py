"""The bench commands the READMEs show, read from the READMEs themselves (a renamed script or
flag fails here, not in a user's hands). Every command is parsed by its script: each flag
the README gives must be one the script accepts. Each script then runs at toy size, its
sizes swapped for small ones and BENCH_SMOKE=1 set (bench/rates.py: the shapes that have no
flag), once per command that no other of its commands covers; it must exit 0 and print
figures. Two kinds run parsed only: those that drive NVIDIA's reference beside ours (they
need ../shared/peer/sim set up, and minutes per model), and those whose work is the Spark
preprocessing (a minute of Spark jobs even at toy size; that pipeline is what
test_preproc.py runs on the same real rows)."""
import glob
import os
import re
import shlex
import sys

import pytest

from conftest import ROOT, bash_lines, bounded_run

READMES = ["README.md", *sorted(glob.glob("*/README.md", root_dir=ROOT)),
           *sorted(glob.glob("bench/*.md", root_dir=ROOT))]
PARSED_ONLY = {"sim_vs_reference.py", "sim_variants.py",  # the reference beside ours
               "criteo_real_auc.py", "preproc_throughput.py",  # Spark preprocessing
               # needs an export with an index: tests/test_retrieval_scale.py runs it on one
               "retrieval_serving.py"}
SMALL_RUN = {"--steps": "1", "--rounds": "1"}
# script -> {flag: toy value}: replaces the README's value, or is appended
TOY = {
    "train_throughput.py": {**SMALL_RUN, "--batch_sizes": "64"},
    "wd_train_throughput.py": {**SMALL_RUN, "--batch_size": "64", "--warmup": "1",
                               "--scale": "0.0001"},
    "retrieval_scale.py": {**SMALL_RUN, "--warmup": "1"},
    "retrieval_throughput.py": {**SMALL_RUN, "--batch_size": "16", "--warmup": "1"},
    "sim_train_throughput.py": {**SMALL_RUN, "--batch_size": "16", "--warmup": "1",
                                "--inference_steps": "2"},
    "hybrid_throughput.py": {**SMALL_RUN, "--batch_size": "64", "--tables": "3",
                             "--rows": "100", "--dim": "8"},
    "loader_throughput.py": {"--rows": "20000", "--batch_size": "1024", "--repeats": "1",
                             "--raw_buffer_kb": "256", "--parquet_rows": "2000",
                             "--tfrecord_rows": "2000"},
    "sim_step_profile.py": {"--batch_sizes": "16", "--steps": "1"},
    "dynamic_admission_memory.py": {"--steps": "2", "--capacity": "40", "--tables": "2",
                                    "--batch_size": "64", "--admission_steps": "20"},
    "recommend_latency.py": {"--requests": "3", "--rounds": "1"},
    "hstu_ranker_scoring.py": {"--calls": "2", "--rounds": "1"},
}
FIGURES = r"\d\s?(%|samples/s|rows/s|lines/s|ms\b|x\b)|\"ms\": \d"


def bench_commands() -> list:
    """(readme, argv after `python`) of every bench command line in the READMEs' bash blocks
    and inline code: continuation lines joined, comments, optional `[...]` parts and `...`
    dropped; each distinct command once."""
    found = {}
    for readme in READMES:
        text = open(os.path.join(ROOT, readme)).read()
        inline = re.findall(r"`([^`\n]*bench/\w+\.py[^`\n]*)`",
                            re.sub(r"```.*?```", "", text, flags=re.S))
        for line in bash_lines(text) + inline:
            command = re.search(r"python3? (bench/\w+\.py.*)", line)
            if command:
                argv = shlex.split(re.sub(r"\[[^]]*\]|\.\.\.", "", command.group(1)))
                found.setdefault(tuple(argv), readme)
    return [(readme, list(argv)) for argv, readme in found.items()]


def flags_of(argv: list) -> dict:
    """{flag: value, or True for a flag without one} of a command's arguments."""
    flags, i = {}, 1
    while i < len(argv):
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        flags.setdefault(argv[i], argv[i + 1] if has_value else True)
        i += 1 + has_value
    return flags


def at_toy_size(argv: list) -> dict:
    return {**flags_of(argv), **TOY[os.path.basename(argv[0])]}


def covers(wide: dict, narrow: dict) -> bool:
    """Whether running `wide` runs what `narrow` would: every flag of narrow with the same
    value, except that no --variants (all of them) or a larger list covers a smaller one."""
    def same(flag, value):
        if flag == "--variants":
            return flag not in wide or set(value.split(",")) <= set(wide[flag].split(","))
        return wide.get(flag) == value
    all_variants = "--variants" not in narrow
    return all(same(flag, value) for flag, value in narrow.items()) and \
        not (all_variants and "--variants" in wide)


def toy_runs(commands: list) -> list:
    """(readme, argv at toy size) of the commands no other command of their script covers
    at toy size (of equal ones, the first)."""
    runs = [(readme, argv[0], at_toy_size(argv)) for readme, argv in commands
            if os.path.basename(argv[0]) not in PARSED_ONLY]
    return [(readme, [script] + [a for flag, value in flags.items()
                                 for a in ([flag] if value is True else [flag, value])])
            for i, (readme, script, flags) in enumerate(runs)
            if not any(other_script == script and covers(other, flags)
                       and (not covers(flags, other) or j < i)
                       for j, (_, other_script, other) in enumerate(runs) if j != i)]


COMMANDS = bench_commands()
TOY_RUNS = toy_runs(COMMANDS)


def shown(argv: list) -> str:
    return " ".join(argv) if isinstance(argv, list) else argv


def test_every_bench_script_the_readmes_show_has_a_toy_size_or_is_parsed_only():
    """A script dropped from the READMEs, or a new one shown, changes this list."""
    scripts = {os.path.basename(argv[0]) for _, argv in COMMANDS}
    assert scripts == set(TOY) | PARSED_ONLY
    assert {os.path.basename(argv[0]) for _, argv in TOY_RUNS} == set(TOY)


def test_a_command_covers_the_commands_it_runs_the_work_of():
    run = {"--rounds": "1", "--steps": "1"}
    assert covers(run, {"--steps": "1"}) and not covers({"--steps": "1"}, run)
    assert covers({**run, "--amp": True}, run) and not covers(run, {**run, "--amp": True})
    assert covers(run, {**run, "--variants": "ours,naive_keras"})
    assert covers({**run, "--variants": "ours,naive_keras"}, {**run, "--variants": "ours"})
    assert not covers({**run, "--variants": "ours"}, {**run, "--variants": "naive_keras"})
    assert not covers({**run, "--variants": "ours"}, run)  # no --variants: all of them
    assert not covers(run, {**run, "--profile": True, "--variants": "ours"})


@pytest.mark.parametrize("readme,argv", COMMANDS, ids=shown)
def test_a_bench_command_parses(readme, argv):
    proc = bounded_run([sys.executable, argv[0], "--help"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    accepted = set(re.findall(r"--\w+", proc.stdout))
    assert set(flags_of(argv)) <= accepted, (readme, proc.stdout)


@pytest.fixture(scope="module")
def reference_layout_data(tmp_path_factory):
    """A small dataset in the reference's TFRecord layout (what sim_step_profile reads)."""
    import test_sim_tfrecord as reference
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reference, "D", 100)  # the bench's shape: histories of 100
        return reference.write_reference_layout(
            tmp_path_factory.mktemp("sim") / "data",
            {"train": reference.reference_rows(64), "test": reference.reference_rows(32)})


@pytest.mark.parametrize("readme,argv", TOY_RUNS, ids=shown)
def test_a_bench_command_runs_at_toy_size(readme, argv, request):
    if "--dataset_dir" in argv:
        argv = list(argv)
        argv[argv.index("--dataset_dir") + 1] = request.getfixturevalue("reference_layout_data")
    proc = bounded_run([sys.executable, *argv], timeout=600, env={"BENCH_SMOKE": "1"})
    assert proc.returncode == 0, (readme, argv, proc.stdout[-3000:], proc.stderr[-3000:])
    assert re.search(FIGURES, proc.stdout), proc.stdout[-3000:]
