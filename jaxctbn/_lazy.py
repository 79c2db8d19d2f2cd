"""A package's public names imported on first use (PEP 562), so that `import jaxctbn` and the
command line's `--help` and argument errors import no JAX.

The package's `__init__.py` states its names once, as imports inside `if typing.TYPE_CHECKING:`
(what type checkers, editors and the docs read); `lazy_exports` reads that block from the file
and returns the module's `__getattr__` and `__dir__`. The first access of a name imports the
module that defines it and keeps the value as a module attribute, so later accesses are plain
attribute reads."""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from typing import Any


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def exported_names(init_file: str) -> dict[str, tuple[str, str | None]]:
    """`{public name: (relative module, attribute or None for a submodule)}` from the
    `from ... import ... as ...` statements inside the file's `if TYPE_CHECKING:` blocks."""
    with open(init_file, encoding="utf-8") as f:
        tree = ast.parse(f.read(), init_file)
    table: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for statement in node.body:
            if not isinstance(statement, ast.ImportFrom) or statement.level < 1:
                raise ImportError(f"{init_file}: only relative `from . import` statements here.")
            for alias in statement.names:
                name = alias.asname or alias.name
                if statement.module is None:  # `from . import panel`: a submodule
                    table[name] = ("." * statement.level + alias.name, None)
                else:
                    table[name] = ("." * statement.level + statement.module, alias.name)
    return table


def lazy_exports(
    package: str, init_file: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of the package `package` whose `__init__.py` is
    `init_file` (see the module docstring)."""
    table = exported_names(init_file)

    def __getattr__(name: str) -> Any:
        try:
            module, attribute = table[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = importlib.import_module(module, package)
        if attribute is not None:
            value = getattr(value, attribute)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(table) | set(vars(sys.modules[package])))

    return __getattr__, __dir__
