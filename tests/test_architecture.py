"""The package layout (docs/architecture.md): one private sub-package per layer, in the order the
data flows; a module imports from another sub-package only names without a leading underscore
(that layer's internal interface), and no layer imports a later one."""

import ast
import inspect
import os
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jaxctbn"

#: The sub-packages, each layer after the ones it builds on.
LAYERS = (
    "_model",
    "_paths",
    "_master_equation",
    "_learning",
    "_panel",
    "_criteria",
    "_active_learning",
    "_experiments",
    "_cli",
)
#: Everything else at the top of the package: the public surface, cross-cutting single modules,
#: the shipped data.
TOP_LEVEL = {
    "__init__.py",
    "py.typed",
    "data",
    "_batching.py",
    "_compilation.py",
    "_errors.py",
    "_files.py",
    "_lazy.py",
    "_programs.py",
}
#: The public namespaces beside the top level (`jaxctbn.panel`, ...): re-exports only.
NAMESPACES = ("panel", "criteria", "experiments", "internal")


def _modules(root: pathlib.Path):
    """`(dotted name relative to the package, path, is a package __init__)` of every module."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        init = parts[-1] == "__init__"
        yield (parts[:-1] if init else parts), path, init


def _imports(root: pathlib.Path):
    """`(importer, imported module, imported names, line)` for every import of a module of the
    package (module level or inside functions); modules as tuples of names relative to the
    package, names as given (a module itself for `from package import module`)."""
    for name, path, init in _modules(root):
        package = name if init else name[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    target = base + tuple(node.module.split(".") if node.module else ())
                elif (node.module or "").split(".")[0] == "jaxctbn":
                    target = tuple(node.module.split(".")[1:])  # pyright: ignore[reportOptionalMemberAccess]
                else:
                    continue
                yield name, target, [a.name for a in node.names], node.lineno
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "jaxctbn":
                        yield name, tuple(alias.name.split(".")[1:]), [], node.lineno


def _unit(module: tuple[str, ...]) -> str | None:
    """The sub-package (or top-level module) a module belongs to; `None` for the package itself."""
    return module[0] if module else None


def private_imports_across(root: pathlib.Path) -> list[str]:
    """Imports of underscore names, or through underscore modules below the sub-package, from
    another sub-package."""
    found = []
    for importer, target, names, line in _imports(root):
        source, unit = _unit(importer), _unit(target)
        if unit is None or unit == source:
            continue
        where = f"jaxctbn/{'/'.join(importer)}.py:{line}"
        private_path = [p for p in target[1:] if p.startswith("_")]
        if private_path:
            found.append(f"{where}: imports module {'.'.join(target)}")
        private = [n for n in names if n.startswith("_")]
        if private:
            found.append(f"{where}: imports {private} from {'.'.join(target)}")
    return found


def upward_imports(root: pathlib.Path) -> list[str]:
    """Imports of a later layer (against the data flow)."""
    found = []
    for importer, target, _, line in _imports(root):
        source, unit = _unit(importer), _unit(target)
        if source in LAYERS and unit in LAYERS and LAYERS.index(unit) > LAYERS.index(source):
            found.append(f"jaxctbn/{'/'.join(importer)}.py:{line}: {source} imports {unit}")
    return found


def top_level_entries(root: pathlib.Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.name != "__pycache__"}


def test_the_package_is_its_layers():
    """A new module goes into the sub-package of its layer, not next to them."""
    namespaces = {f"{n}.py" for n in NAMESPACES}
    assert top_level_entries(PACKAGE) == TOP_LEVEL | set(LAYERS) | namespaces
    for layer in LAYERS:
        assert (PACKAGE / layer / "__init__.py").is_file(), layer


def test_no_private_names_cross_sub_packages():
    assert private_imports_across(PACKAGE) == []


def test_layers_build_only_on_earlier_layers():
    assert upward_imports(PACKAGE) == []


def _public_names(module) -> set[str]:
    """Public attributes (those imported on first use included: `dir`), less modules (the
    namespaces, `typing`, and `jaxtyping` where the tests' import hook adds it)."""
    return {
        n for n in dir(module) if not n.startswith("_") and not inspect.ismodule(getattr(module, n))
    }


#: The most public names over the top level and the namespaces (lowered as names fold into
#: Modules and methods; issue 62's target is 150).
MAX_PUBLIC_NAMES = 150


def test_a_small_public_surface_and_every_name_in_one_place():
    """About sixty names at the top level for what a user of the paper needs; the rest in the
    namespaces, each name in one place only, each namespace a module of re-exports."""
    import importlib

    import jaxctbn

    top = _public_names(jaxctbn)
    assert 55 <= len(top) <= 85, len(top)
    seen = {name: "jaxctbn" for name in top}
    for namespace in NAMESPACES:
        module = importlib.import_module(f"jaxctbn.{namespace}")
        assert getattr(jaxctbn, namespace) is module
        names = _public_names(module)
        assert names, namespace
        for name in names:
            assert name not in seen, f"{name} in jaxctbn.{namespace} and {seen[name]}"
            seen[name] = f"jaxctbn.{namespace}"
            value = getattr(module, name)
            assert not callable(value) or value.__module__.startswith("jaxctbn._"), name
        tree = ast.parse((PACKAGE / f"{namespace}.py").read_text())
        body = [node for node in tree.body if not isinstance(node, ast.Expr)]  # the docstring
        assert all(isinstance(node, ast.ImportFrom) for node in body), namespace
    # the surface only shrinks: issue 62 aims at 150 names over all namespaces
    assert len(seen) <= MAX_PUBLIC_NAMES, len(seen)


def test_the_architecture_page_lists_every_module():
    """docs/architecture.md's module table names every module of every sub-package, in its
    sub-package, and no module that is gone (a page that cannot go stale)."""
    import re

    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    listed: dict[str, set[str]] = {}
    package = None
    for line in page.splitlines():
        row = re.match(r"\|\s*(?:`(_\w+)`|\(top level\))?\s*\|\s*(.+?)\s*\|.+\|\s*$", line)
        if row is None or "`" not in row.group(2):
            continue
        package = row.group(1) or (None if line.startswith("| (top level)") else package)
        listed.setdefault(package or "", set()).update(re.findall(r"`(\w+\.py)`", row.group(2)))
    actual: dict[str, set[str]] = {}
    for path in PACKAGE.glob("_*/*.py"):
        if path.name != "__init__.py":
            actual.setdefault(path.parent.name, set()).add(path.name)
    actual[""] = {p.name for p in PACKAGE.glob("_*.py")} - {"__init__.py"}
    for package in sorted(set(actual) | set(listed)):
        missing = sorted(actual.get(package, set()) - listed.get(package, set()))
        stale = sorted(listed.get(package, set()) - actual.get(package, set()))
        assert not missing and not stale, (package or "(top level)", missing, stale)


#: The outcome classes: their behaviour lives in their methods (`_criteria/outcomes.py`), so a
#: new outcome is one Module, not a new branch wherever outcomes are used.
OUTCOME_CLASSES = {"AbstractOutcome", "CompletePath", "PanelOutcome"}


def outcome_type_tests(root: pathlib.Path) -> list[str]:
    """`isinstance`/`issubclass`/`type(...) is` tests naming an outcome class outside the
    module that defines them."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "_criteria/outcomes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
            ):
                continue
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if named & OUTCOME_CLASSES:
                found.append(f"jaxctbn/{path.relative_to(root)}:{node.lineno}")
    return found


def test_outcomes_are_dispatched_by_their_methods(tmp_path):
    assert outcome_type_tests(PACKAGE) == []
    # the check finds what it looks for
    (tmp_path / "m.py").write_text("def f(o):\n    return isinstance(o, (int, c.PanelOutcome))\n")
    assert outcome_type_tests(tmp_path) == ["jaxctbn/m.py:2"]


#: The most lines a module holds: one concept per module, split along its seams.
MAX_MODULE_LINES = 600
#: Modules still over the bound (issue 62 splits them; the list only shrinks) and the argument
#: tables, which are excepted: one flag per entry, read top to bottom.
OVER_THE_BOUND = {
    "_cli/arguments.py",  # the command line's argument table (excepted)
}


def test_modules_stay_small():
    sizes = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    over = {name for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert over <= OVER_THE_BOUND, sorted(over - OVER_THE_BOUND)
    # a split module leaves the list (so that it cannot grow back unnoticed)
    assert {
        name for name in OVER_THE_BOUND if name in sizes and sizes[name] <= MAX_MODULE_LINES
    } <= {"_cli/arguments.py"}, "remove the modules now within the bound from OVER_THE_BOUND"


def test_the_tests_mirror_the_package():
    """Each folder of tests/ is named after the layer it tests (`tests/panel/` for
    `jaxctbn/_panel/`); the files at the top are the cross-cutting checks (the architecture,
    the surface's types and checks, compilation counts, devices, the README and notebooks)."""
    tests = pathlib.Path(__file__).resolve().parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= {layer.lstrip("_") for layer in LAYERS}, folders
    for folder in folders:
        assert any((tests / folder).glob("test_*.py")), folder


def test_names_are_imported_on_first_use_and_are_the_defining_modules_objects():
    """`import jaxctbn` and the command line's parser (`--help`, argument errors) import no JAX
    (a fresh interpreter's `sys.modules`); every top-level name is the object its module defines
    (the `TYPE_CHECKING` imports of `__init__.py` read by `_lazy`, against `importlib` of each
    module), `dir` lists them all, and an unknown name is an `AttributeError`."""
    import importlib
    import subprocess
    import sys

    import pytest

    import jaxctbn
    from jaxctbn._lazy import exported_names

    script = (
        "import sys, contextlib, io\n"
        "import jaxctbn\n"
        "from jaxctbn._cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--help']) == 0\n"
        "with contextlib.redirect_stderr(io.StringIO()):\n"
        "    assert main(['fit', '--max-iterations', 'x']) == 2\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "    ('jax', 'jaxlib', 'equinox', 'numpy', 'pandas', 'scipy', 'diffrax', 'optax')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)},
    ).stdout
    assert out.strip() == "[]", out
    table = exported_names(str(PACKAGE / "__init__.py"))
    assert len(table) > 60
    for name, (module, attribute) in table.items():
        defined = importlib.import_module(module, "jaxctbn")
        assert getattr(jaxctbn, name) is (
            defined if attribute is None else getattr(defined, attribute)
        )
    assert set(table) <= set(dir(jaxctbn))
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        jaxctbn.nonexistent  # noqa: B018
