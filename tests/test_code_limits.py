"""The house rules of issue 31, read from the source: short functions, small constructors, two front doors that do
not lean on each other. A check that fails names the place and the figure."""

from __future__ import annotations

import ast
from pathlib import Path

import mindwatch

PACKAGE = Path(mindwatch.__file__).resolve().parent
MAX_LINES = 80  # any function of the package
MAX_LINES_SESSION = 60  # session.py's: the wiring a newcomer reads first
MAX_PARAMS = 9  # a constructor's, self left out: more is a settings object waiting to be named


def _functions() -> list[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """Every function of the package with its file and qualified name (``Class.method``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    found.append((path, child, prefix + child.name))
                    stack.append((child, f"{prefix}{child.name}."))
                elif isinstance(child, ast.ClassDef):
                    stack.append((child, f"{prefix}{child.name}."))
    return found


def _lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    return (fn.end_lineno or fn.lineno) - first + 1


def test_no_function_is_longer_than_80_lines_and_none_in_session_py_longer_than_60():
    functions = _functions()
    assert len(functions) > 500, "the scan found the package's functions"
    too_long = []
    for path, fn, name in functions:
        limit = MAX_LINES_SESSION if path.name == "session.py" and path.parent == PACKAGE else MAX_LINES
        if _lines(fn) > limit:
            too_long.append(f"{path.relative_to(PACKAGE.parent)}:{fn.lineno} {name}: {_lines(fn)} lines (limit {limit})")
    assert not too_long, "split these:\n" + "\n".join(too_long)


def test_no_constructor_takes_more_than_9_parameters():
    too_many = []
    for path, fn, name in _functions():
        if fn.name != "__init__":
            continue
        a = fn.args
        count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - 1 + (a.vararg is not None) + (a.kwarg is not None)
        if count > MAX_PARAMS:
            too_many.append(f"{path.relative_to(PACKAGE.parent)}:{fn.lineno} {name}: {count} parameters")
    assert not too_many, "group these into a settings object:\n" + "\n".join(too_many)


def _imported_modules(path: Path) -> set[str]:
    """The modules a file imports, relative imports resolved against the package."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_the_two_front_doors_do_not_import_each_other():
    loop, callback = PACKAGE / "mindspore" / "loop.py", PACKAGE / "mindspore" / "callback.py"
    assert "mindwatch.mindspore.callback" not in _imported_modules(loop), "loop.py imports callback.py"
    assert "mindwatch.mindspore.loop" not in _imported_modules(callback), "callback.py imports loop.py"
