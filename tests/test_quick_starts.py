"""Every command the READMEs' quick starts show runs, at smoke size: `make demo`,
`make demo-wd`, `make demo-sim` (their scripts with DEMO_SMOKE=1) and the families'
step-by-step command lines, read from the READMEs themselves, so that a changed README is
what gets tested. Each must exit 0 and print its headline figure."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import HOROVODRUN, ROOT, bash_lines, bounded_run, require_or_skip

README_QUICK_STARTS = ["README.md", "wide_and_deep/README.md", "sim/README.md",
                       "retrieval/README.md", "recommend/README.md"]
DEMO_SCRIPTS = {"demo": "tools/demo.sh", "demo-wd": "tools/demo_wd.sh",
                "demo-sim": "tools/demo_sim.sh", "demo-retrieval": "tools/demo_retrieval.sh"}
FIGURE = r"\d+\.\d+"
DEMO_HEADLINES = {"demo": rf"demo result: test AUC {FIGURE} over [\d,]+ rows",
                  "demo-wd": rf"demo result: test AUC {FIGURE}, MAP@12 {FIGURE}",
                  "demo-sim": rf"\nHSTU +whole history \(HSTU layers\) +{FIGURE} +\d+\n(.|\n)*"
                              rf"demo result: test AUC SIM {FIGURE} vs DIEN {FIGURE} .*DIN.* "
                              rf"{FIGURE}; the HSTU ranker.* {FIGURE}\); inference [\d,]+ "
                              rf"samples/s",
                  "demo-retrieval": rf"demo result: test NDCG@10 SASRec {FIGURE} \(epoch \d+\), "
                                    rf"HSTU {FIGURE}(.|\n)*two-stage result: test NDCG@10 "
                                    rf"{FIGURE} vs HSTU retrieval alone {FIGURE}"}
# Amazon Beauty (the retrieval quick start's data), as the demo finds it
BEAUTY = next((p for p in (os.path.join(os.path.dirname(ROOT), "shared", "data", "sequential",
                                        "Beauty.txt"),
                           "/work/shared/data/sequential/Beauty.txt") if os.path.isfile(p)),
              "")


def files_in_tree() -> set:
    """The paths `git status` reports beside the committed files (untracked, not ignored)."""
    listed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {line[3:] for line in listed.splitlines()}


@pytest.fixture(scope="module", autouse=True)
def tree_before():
    return files_in_tree()


def quick_start_commands(readme: str) -> list:
    """The commands (argument lists) of the bash blocks under a README's "## Quick start"
    heading: continuation lines joined, comments dropped, optional `[...]` parts kept."""
    text = open(os.path.join(ROOT, readme)).read()
    section = text.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    return [shlex.split(re.sub(r"\[([^]]*)\]", r"\1", line)) for line in bash_lines(section)]


def test_the_makefile_demo_targets_run_the_demo_scripts():
    """`make demo*` = the set-up (which `make test` runs first) + the script tested below."""
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    for target, script in DEMO_SCRIPTS.items():
        recipe = re.search(rf"^{target}: setup\n\t@?(.*)$", makefile, re.M)
        assert recipe and recipe.group(1) == f"bash {script}", target
    # the front page shows every target (each family's README repeats its own)
    front_page = sorted(c[1] for c in quick_start_commands("README.md") if c[0] == "make")
    assert front_page == sorted(["test", *DEMO_SCRIPTS])
    shown = {c[1] for readme in README_QUICK_STARTS for c in quick_start_commands(readme)
             if c[0] == "make"}
    assert shown == set(front_page)


@pytest.mark.parametrize("target", list(DEMO_SCRIPTS))
def test_demo_runs_at_smoke_size(target, tmp_path):
    proc = bounded_run(["bash", DEMO_SCRIPTS[target]], timeout=600,
                       env={"DEMO_SMOKE": "1", "DEMO_OUT": str(tmp_path / "out")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(DEMO_HEADLINES[target], proc.stdout), proc.stdout[-2000:]


# ---- the families' step-by-step lines -------------------------------------------------------
TINY_DLRM = ["--cpu", "--batch_size", "128", "--valid_batch_size", "128", "--embedding_dim",
             "4", "--bottom_mlp_dims", "8,4", "--top_mlp_dims", "8,1", "--num_cross_layers", "1",
             "--cross_layer_projection_dim", "4", "--benchmark_warmup_steps", "1"]
# program -> ({flag: smoke value}, flags appended); a flag given None is dropped with its value
SMOKE = {
    # Criteo's 26 cardinalities (tens of millions of rows) -> three small tables
    "dataloading.generate_feature_spec": ({"--variant": None}, ["--cardinalities", "30,700,5",
                                                                "--num_numerical", "4"]),
    "dataloading.transcribe": ({"--max_batches_train": "4", "--max_batches_test": "1"},
                               ["--src_batch_size", "128"]),
    "dlrm.py": ({}, TINY_DLRM),
    "dcnv2.py": ({}, TINY_DLRM),
    "wide_and_deep.synthetic": ({"--train_rows": "2000", "--test_rows": "500"}, []),
    "wide_and_deep.main": ({"--num_epochs": "1", "--global_batch_size": "256"},
                           ["--eval_batch_size", "500", "--deep_hidden_units", "16", "16"]),
    "sim.synthetic": ({}, ["--users", "100"]),
    "sim.main": ({}, ["--epochs", "1", "--stage_one_mlp_dims", "16", "--stage_two_mlp_dims",
                      "16,8", "--aux_mlp_dims", "8"]),
    "retrieval.prepare_dataset": ({"--src": BEAUTY}, []),
    "retrieval.main": ({}, ["--epochs", "1", "--embedding_dim", "16", "--max_sequence_length",
                            "10", "--cpu"]),
    "recommend.main": ({}, ["--epochs", "1", "--max_steps", "20", "--candidates", "20",
                            "--cpu"]),
}
TRAINING_PROGRAMS = ("dlrm.py", "dcnv2.py", "wide_and_deep.main", "sim.main", "retrieval.main",
                     "recommend.main")


def headline(argv: list):
    """What a training program prints when it did its work: the training summary with its
    AUC, or the evaluation's AUC (--mode eval); None for the data tools."""
    if program(argv) not in TRAINING_PROGRAMS:
        return None
    mode = argv[argv.index("--mode") + 1] if "--mode" in argv else "train"
    if program(argv) in ("retrieval.main", "recommend.main"):
        return {"train": rf"done: step \d+, kept the best evaluation, epoch \d+ \(step \d+\): "
                         rf"ndcg@10 {FIGURE}",
                "export": r"exported \S+ \((top|retrieval's top) \d+ of \d+ items"}[mode]
    if mode == "eval":
        return rf"eval: auc {FIGURE}"
    return rf"done: step \d+, train_loss {FIGURE}\s+auc {FIGURE}"


def program(argv: list) -> str:
    """The module (`-m x`) or script a python command line runs."""
    python = next(i for i, a in enumerate(argv) if a.endswith("python"))
    rest = [a for a in argv[python + 1:] if a != "-u"]
    return rest[1] if rest[0] == "-m" else rest[0]


def smoke(argv: list, tmp_path) -> list:
    """A README command made runnable here at smoke size: this interpreter, the repository's
    scripts, absolute paths moved under tmp_path, and the SMOKE sizes."""
    overrides, extra = SMOKE.get(program(argv), ({}, []))
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in overrides:
            skip = True
            if overrides[arg] is not None:
                out += [arg, overrides[arg]]
            continue
        if arg.endswith("python"):
            arg = sys.executable
        elif arg == "horovodrun":
            arg = HOROVODRUN
        elif arg.endswith(".py") and os.path.exists(os.path.join(ROOT, arg)):
            arg = os.path.join(ROOT, arg)
        elif arg.startswith(("/data/", "/tmp/")):
            arg = f"{tmp_path}{arg}"
        out.append(arg)
    return out + extra


@pytest.mark.parametrize("readme", README_QUICK_STARTS)
def test_quick_start_command_lines_run_at_smoke_size(readme, tmp_path):
    """The README's commands in order, in an empty directory (relative paths land there)."""
    commands = [c for c in quick_start_commands(readme) if c[0] != "make"]
    assert commands, f"{readme}: no command in its quick start"
    if any(c[0] == "horovodrun" for c in commands):
        require_or_skip(os.path.exists(HOROVODRUN), f"horovodrun not found at {HOROVODRUN}")
    if any(program(c) == "retrieval.prepare_dataset" for c in commands if "-m" in c):
        require_or_skip(bool(BEAUTY), "needs Amazon Beauty (shared/data/sequential/Beauty.txt)")
    for command in commands:
        argv = smoke(command, tmp_path)
        proc = bounded_run(argv, timeout=300, cwd=str(tmp_path),
                           env={"PYTHONPATH": ROOT, "DLRM_DEVICE": "cpu"})
        shown = " ".join(command)
        assert proc.returncode == 0, f"{shown}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        expected = headline(command)
        assert expected is None or re.search(expected, proc.stdout), \
            f"{shown}: no headline figure\n{proc.stdout[-2000:]}"


def test_the_quick_starts_and_demos_leave_no_file_in_the_working_tree(tree_before):
    """Runs after this module's demos and README commands (pytest keeps a file's order): each
    writes under its own output directory, none in the repository (a run's log included)."""
    assert files_in_tree() - tree_before == set()
