"""Every speed figure the READMEs quote comes from a committed bench/results/ file that the same
paragraph, table row or list item names: each decimal ratio (1.34x, 1.34×, both ends of
1.26-1.82x) and each "N % of the ... peak" must be printed in one of the files it names, and each
named file's header states the TensorFlow version and the machine kind it was measured on. A
figure measured on an older TensorFlow than the current one says so where it is quoted."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READMES = ("README.md", "sim/README.md", "wide_and_deep/README.md", "preproc/README.md",
           "retrieval/README.md", "recommend/README.md",
           "tensorflow-dot-based-interact/README.md")
REQUIREMENTS = open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8").read()
CURRENT_TF = re.search(r"^tensorflow-cpu==(\d+\.\d+)", REQUIREMENTS, re.M).group(1)
NUMBER = r"\d+\.\d+"
# a decimal (optionally the end of a range) right before x or ×: "1.34x", "1.34 ×", "1.26-1.82x";
# integers ("26 × 1000", "2x") and words ("1.5xla") are not ratios
RATIO = re.compile(rf"(?<![\d.])({NUMBER})(?:\s?[-–]\s?({NUMBER}))?\s?[x×](?![\w])")
PERCENT = r"\d+(?:\.\d+)?\s?%"
PEAK = re.compile(rf"((?:{PERCENT}\s?(?:/|-|–|,|and)\s?)*{PERCENT})\s+of\s+(?:the\s+)?"
                  r"(?:[\w'-]+\s+){0,3}peak")
RESULTS = re.compile(r"bench/results/([\w.-]+)")
MACHINE = re.compile(r"AMD EPYC|Intel Xeon|H100|H200")
TF_VERSION = re.compile(r"TensorFlow (\d+\.\d+)")


def units(text):
    """Paragraphs, table rows, list items and headings, each as one string."""
    out, current = [], []
    for line in text.splitlines():
        starts_unit = re.match(r"\||#|\s{0,3}([-*]|\d+\.)\s", line)
        if not line.strip() or starts_unit or current[:1] and current[0].startswith("#"):
            out.append(" ".join(current))
            current = []
        current.append(line.strip())
    out.append(" ".join(current))
    return [u for u in out if u]


def ratios(text):
    return {n for m in RATIO.finditer(text) for n in m.groups() if n}


def peak_percents(text):
    return {re.sub(r"\s", "", p) for m in PEAK.finditer(text)
            for p in re.findall(PERCENT, m.group(1))}


def file_figures(name):
    text = open(os.path.join(ROOT, "bench", "results", name), encoding="utf-8").read()
    return ratios(text) | {re.sub(r"\s", "", p) for p in re.findall(PERCENT, text)}


def header(name):
    """The file's comment lines: where it states the command, the machine and the versions."""
    with open(os.path.join(ROOT, "bench", "results", name), encoding="utf-8") as f:
        return "".join(line for line in f if line.startswith("#"))


def quoted():
    """(readme, unit, figures, named files) for every unit quoting a speed figure."""
    for readme in READMES:
        for unit in units(open(os.path.join(ROOT, readme), encoding="utf-8").read()):
            figures = ratios(unit) | peak_percents(unit)
            if figures:
                yield readme, unit, figures, sorted(set(RESULTS.findall(unit)))


def test_units_and_figures_are_found():
    text = ("## Speed 1.1x\nIntro 1.34× naive Keras (`bench/results/a.txt`).\n\n"
            "| x | 1.26-1.82x |\n"
            "- 76.6 % / 78.3 % of the float32 matmul peak\n  continued 2.0 x\n\n"
            "26 × 1000 tables, 2x faster, --xla 1.5xla, 21.6 % of the steps")
    found = [(ratios(u) | peak_percents(u)) for u in units(text)]
    assert found == [{"1.1"}, {"1.34"}, {"1.26", "1.82"}, {"76.6%", "78.3%", "2.0"}, set()]


QUOTED = list(quoted())


@pytest.mark.parametrize("readme,unit,figures,files", QUOTED,
                         ids=[f"{q[0]}-{i}" for i, q in enumerate(QUOTED)])
def test_each_figure_is_in_a_named_results_file(readme, unit, figures, files):
    assert files, f"{readme}: speed figures {sorted(figures)} name no bench/results/ file: {unit}"
    in_files = set()
    for name in files:
        path = os.path.join(ROOT, "bench", "results", name)
        assert os.path.isfile(path), f"{readme} names a missing results file {name}: {unit}"
        head = header(name)
        assert MACHINE.search(head), f"bench/results/{name}: header names no machine kind"
        versions = TF_VERSION.findall(head)
        assert versions, f"bench/results/{name}: header names no TensorFlow version"
        for version in set(versions) - {CURRENT_TF}:
            assert version in unit, (f"{readme} quotes bench/results/{name} (TensorFlow {version})"
                                     f" without saying so: {unit}")
        in_files |= file_figures(name)
    missing = sorted(figures - in_files)
    assert not missing, f"{readme}: {missing} not in {files}: {unit}"
