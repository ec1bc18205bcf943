"""The house as the README's layout table draws it: every path in the table exists, every
module of the root, the core and the engine is in it, and imports only go down the layers
(core -> engine -> families -> tools)."""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = {"generate_feature_spec", "transcribe", "transcode", "gen_csv", "gen_embedding_sizes",
         "dataloading", "preprocessing", "bench", "tools"}
FAMILIES = ("wide_and_deep", "sim")
MAX_ROOT_MODULES = 22


def layout_rows():
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    return [r.split("|")[1:4] for r in section.splitlines() if r.startswith("| ")
            and not r.startswith("| layer")]


def table_text():
    return " ".join(" ".join(cells) for cells in layout_rows())


def modules(folder):
    return sorted(f for f in os.listdir(os.path.join(ROOT, folder))
                  if f.endswith(".py") and f != "__init__.py")


def test_every_path_in_the_table_exists():
    for _, paths, _ in layout_rows():
        for path in re.findall(r"`([^`]+)`", paths):
            assert os.path.exists(os.path.join(ROOT, path)), f"README layout: {path} missing"


def test_every_module_is_in_the_table():
    text = table_text()
    root = modules(".")
    assert len(root) <= MAX_ROOT_MODULES, root
    for name in root:
        assert f"`{name}`" in text, f"root module {name} is not in the README layout"
    for folder in ("core", "core/parallel", "training"):
        for name in modules(folder):
            assert f"`{folder}/{name}`" in text or f"`{name}`" in text, \
                f"{folder}/{name} is not in the README layout"


def layer_of(module: str, path: str = "") -> str:
    top = module.split(".")[0]
    if top in ("core", "training"):
        return top
    if top in FAMILIES:
        return top
    if top in TOOLS:
        return "tools"
    if os.path.exists(os.path.join(ROOT, top + ".py")) or top == "preproc":
        return "dlrm"
    return "external"


ALLOWED = {"core": {"core"}, "training": {"core", "training"},
           "dlrm": {"core", "training", "dlrm"}, "wide_and_deep": {"core", "training",
                                                                   "wide_and_deep"},
           "sim": {"core", "training", "sim"}}


def imported(path: str):
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


def test_imports_go_down_the_layers():
    bad = []
    for folder, _, files in os.walk(ROOT):
        rel = os.path.relpath(folder, ROOT)
        if rel.startswith((".", "tests", "tensorflow-dot-based-interact", "build")):
            continue
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            own = layer_of(os.path.join(rel, f).replace(os.sep, ".").lstrip("."))
            if own not in ALLOWED:
                continue  # tools may use every layer
            for module in imported(path):
                theirs = layer_of(module)
                if theirs != "external" and theirs not in ALLOWED[own]:
                    bad.append(f"{os.path.relpath(path, ROOT)} ({own}) imports {module} "
                               f"({theirs})")
    assert not bad, "\n".join(bad)
