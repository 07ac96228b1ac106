"""The import rules of README.md's Layout, read from the source: core is NumPy only, kernels
import triton and the core's decisions (never a framework, never a backend), the top-level
package imports no framework; data flows core -> kernels -> backends, never back."""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FRAMEWORKS = {"torch", "jax", "jaxlib", "jax_triton", "flax"}
RULES = {  # folder -> what its files must not import
    "core": FRAMEWORKS | {"triton", "kernels", "backends"},
    "kernels": FRAMEWORKS | {"backends"},
}


def imported_modules(path: pathlib.Path, source: str = None):
    """Top-level names of every module a file imports; a relative import inside the package
    is named by the package folder it reaches (``core``, ``kernels``, ``backends``)."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            # `from mamba_align.backends import x` names the package folder it reaches
            yield node.lineno, parts[1] if parts[0] == "mamba_align" and len(parts) > 1 \
                else parts[0]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            target = (base / (node.module or "").replace(".", "/")).resolve()
            parts = target.relative_to(ROOT).parts if ROOT in target.parents else ()
            for name in ([a.name for a in node.names] if not parts else [None]):
                if parts:
                    yield node.lineno, parts[0]
                elif name:  # `from .. import kernels`: the folder is the imported name
                    yield node.lineno, name


def test_scanner_sees_imports():
    # The scanner must catch every import form, or the rules below could never fail.
    source = ("import torch\nfrom jax import numpy\nimport numpy as np\ndef f():\n"
              "    import triton\nfrom ..kernels import plan\nfrom .. import backends\n"
              "from .config import CacheConfig\nfrom mamba_align.kernels import plan\n")
    # a file of core/ (not written: relative imports resolve from its folder)
    got = [m for _, m in sorted(imported_modules(ROOT / "core" / "probe.py", source))]
    assert got == ["torch", "jax", "numpy", "triton", "kernels", "backends", "core", "kernels"]


@pytest.mark.parametrize("folder", sorted(RULES))
def test_folder_imports(folder):
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"{folder}/ has no sources"
    bad = [
        f"{p.relative_to(ROOT)}:{line} imports {mod}"
        for p in files
        for line, mod in imported_modules(p)
        if mod in RULES[folder]
    ]
    assert not bad, "\n".join(bad)


def test_core_imports_only_numpy_and_stdlib():
    allowed = {"numpy", "core"} | set(sys.stdlib_module_names)
    bad = [
        f"{p.relative_to(ROOT)}:{line} imports {mod}"
        for p in sorted((ROOT / "core").rglob("*.py"))
        for line, mod in imported_modules(p)
        if mod not in allowed
    ]
    assert not bad, "\n".join(bad)


def test_top_level_import_loads_no_framework():
    code = (
        "import sys, mamba_align, mamba_align.core\n"
        "loaded = sorted(m for m in ('torch', 'jax', 'triton', 'jax_triton') if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_tests_folder_is_not_a_package():
    assert not (ROOT / "tests" / "__init__.py").exists()


PACKAGE_DIRS = ("core", "kernels", "backends")


def test_library_is_imported_once_under_its_own_name():
    # pytest must not import the repository root under the checkout folder's name (a
    # second copy of the library, or import errors in a folder such as ``mamba-align``):
    # every loaded module from the package's files is ``mamba_align.<path>``.
    import mamba_align.backends  # noqa: F401  (at least the package itself is loaded)

    bad = []
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if not f:
            continue
        path = pathlib.Path(f).resolve()
        if ROOT not in path.parents:
            continue
        rel = path.relative_to(ROOT).with_suffix("")
        if rel.parts[0] not in PACKAGE_DIRS + ("__init__",):
            continue  # tests, examples, benchmarks: not the package
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if name != ".".join(("mamba_align",) + parts):
            bad.append(f"{name} ({path.relative_to(ROOT)})")
    assert sys.modules["mamba_align"].__file__ == str(ROOT / "__init__.py")
    if ROOT.name != "mamba_align":
        bad += [m for m in sys.modules if m == ROOT.name or m.startswith(ROOT.name + ".")]
    assert not bad, "modules imported under another name: " + ", ".join(sorted(set(bad)))
