"""The package's layout: the core imports no engine and no subpackage, a
subpackage imports the core and never another subpackage, and a module path
of cxltier 0.1 that moved fails naming where it went."""

import ast
import os
import subprocess
import sys

import pytest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cxltier")
SUBPACKAGES = ("sglang", "vllm", "cluster")
ENGINES = ("sglang", "vllm", "torch", "mooncake", "zmq")


def modules():
    for root, _, files in os.walk(PKG):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, PKG)
                sub = rel.split(os.sep)[0] if os.sep in rel else ""
                yield rel, sub, ast.parse(open(path).read(), path)


def imports(tree, sub):
    """(absolute name, top level?) of every import in a module of
    subpackage sub ("" for the core), relative ones resolved."""
    for node in ast.walk(tree):
        top = node in tree.body
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, top
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.module, top
                continue
            base = ["cxltier"] + ([sub] if sub else [])
            base = base[: len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
            if node.module:
                yield mod, top
            else:
                for a in node.names:
                    yield f"{mod}.{a.name}", top


def test_the_core_imports_no_subpackage_and_no_engine_at_its_top():
    bad = []
    for rel, sub, tree in modules():
        if sub:
            continue
        for name, top in imports(tree, sub):
            parts = name.split(".")
            if parts[0] == "cxltier" and len(parts) > 1 and parts[1] in SUBPACKAGES:
                bad.append(f"{rel} imports {name}")
            if top and parts[0] in ENGINES:
                bad.append(f"{rel} imports {name} at its top")
    assert not bad, bad


def test_a_subpackage_imports_the_core_never_another_subpackage():
    bad, seen = [], set()
    for rel, sub, tree in modules():
        if not sub:
            continue
        seen.add(sub)
        for name, _ in imports(tree, sub):
            parts = name.split(".")
            if parts[0] == "cxltier" and len(parts) > 1 and parts[1] in SUBPACKAGES and parts[1] != sub:
                bad.append(f"{rel} imports {name}")
    assert seen == set(SUBPACKAGES)
    assert not bad, bad


def test_the_importer_sees_what_it_checks():
    """The two tests above would pass on a parser that found nothing."""
    found = {name for rel, sub, tree in modules() if rel == os.path.join("sglang", "linker.py")
             for name, _ in imports(tree, sub)}
    assert {"cxltier.kvpool", "cxltier.sglang.hicache", "cxltier.sglang.pagekeys"} <= found


@pytest.mark.parametrize("old,new", [
    ("cxltier.hicache", "cxltier.sglang.hicache"),
    ("cxltier.linker", "cxltier.sglang.linker"),
    ("cxltier.uplink", "cxltier.cluster.uplink"),
    ("cxltier.kvevents", "cxltier.cluster.kvevents"),
])
def test_a_moved_path_names_its_new_one(old, new):
    code = f"import importlib\ntry:\n    importlib.import_module({old!r})\nexcept ModuleNotFoundError as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(PKG)), check=True).stdout
    assert f"{old} moved to {new}" in out


def test_python_m_of_a_moved_path_says_where_it_went():
    p = subprocess.run([sys.executable, "-m", "cxltier.uplink", "--help"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.dirname(PKG)))
    assert p.returncode != 0
    assert "cxltier.cluster.uplink" in p.stderr


def test_an_unknown_module_is_still_a_plain_miss():
    with pytest.raises(ModuleNotFoundError, match="No module named 'cxltier.nosuch'"):
        __import__("cxltier.nosuch")
