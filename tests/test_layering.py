"""The layers of docs/ARCHITECTURE.md hold: every module sits in one, and no import that runs goes up
a layer or round in a circle."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"pager": ROOT / "pager", "pager.cli": ROOT / "cli", "pager.tools": ROOT / "tools"}


def modules() -> dict[str, Path]:
    """Every module of the package, named as it is imported (pager.cli is the cli/ folder)."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _annotations_only(tree: ast.AST) -> set[int]:
    """The nodes under `if TYPE_CHECKING:`: imports for type hints, which run nothing."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def imports(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(the modules it imports that run, at module level or in a function; those only for annotations)."""
    tree = ast.parse(path.read_text())
    hints = _annotations_only(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    running, annotating = set(), set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for target in targets:
            if target in known and target != name:
                (annotating if id(node) in hints else running).add(target)
    return running, annotating


def layers() -> dict[str, int]:
    """module → its layer's number, from the table in docs/ARCHITECTURE.md."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    placed = {}
    for number, names in re.findall(r"^\| (\d+)\. [^|]+\| ([^|]+) \|", text, re.M):
        for short in re.findall(r"`([^`]+)`", names):
            module = "pager" if short == "pager" else f"pager.{short}"
            assert module not in placed, f"{module} is in two layers of docs/ARCHITECTURE.md"
            placed[module] = int(number)
    return placed


def test_every_module_is_in_one_layer_of_the_map():
    placed, known = layers(), modules()
    assert placed, "no layer table found in docs/ARCHITECTURE.md"
    assert sorted(set(known) - set(placed)) == [], "modules the map does not place: add them to docs/ARCHITECTURE.md"
    assert sorted(set(placed) - set(known)) == [], "the map names modules that do not exist"


def test_no_import_that_runs_goes_up_a_layer():
    placed, known = layers(), modules()
    upward = []
    for name, path in known.items():
        running, _ = imports(name, path, known)
        upward += [f"{name} (layer {placed[name]}) imports {target} (layer {placed[target]})"
                   for target in sorted(running) if placed[target] > placed[name]]
    assert upward == [], "\n".join(upward)


def test_the_imports_that_run_make_no_circle():
    known = modules()
    graph = {name: imports(name, path, known)[0] for name, path in known.items()}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            raise AssertionError("an import circle: " + " -> ".join(trail[trail.index(name):] + [name]))
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, trail + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_an_upward_import_is_caught(tmp_path):
    """The check itself: a store that imported the session would be reported."""
    known = modules()
    fake = tmp_path / "store.py"
    fake.write_text("from .session import Session\n")
    running, _ = imports("pager.store", fake, known)
    assert "pager.session" in running and layers()["pager.session"] > layers()["pager.store"]
    fake.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .session import Session\n")
    running, annotating = imports("pager.store", fake, known)
    assert "pager.session" not in running and "pager.session" in annotating


def test_the_session_room_modules_do_not_import_one_another_at_run_time():
    """The rooms are read alone: each is handed the session, and none reaches into another by import."""
    known = modules()
    rooms = {"pager.paging", "pager.intake", "pager.tiers", "pager.memory_calls", "pager.retrieval"}
    for room in sorted(rooms):
        running, _ = imports(room, known[room], known)
        assert not running & rooms, f"{room} imports {sorted(running & rooms)}"


def test_the_names_the_map_gives_exist():
    """Every `Class.method` (or `module.name`) docs/ARCHITECTURE.md names is in the code."""
    known = modules()
    defined: dict[str, set[str]] = {}   # class or module → the names defined in it
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        short = name.rsplit(".", 1)[-1]
        defined.setdefault(short, set()).update(
            n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            defined.setdefault(cls.name, set()).update(
                n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = {(owner, attr) for owner, attr in re.findall(r"`(?:[a-z_]+\.)?([A-Za-z_]+)\.([a-z_]+)(?:\([^`]*\))?`", text)
             if f"pager.{owner}.{attr}" not in known and f"{owner}.{attr}" not in known}   # modules are no names
    assert len(named) > 20
    missing = sorted(f"{owner}.{attr}" for owner, attr in named if owner in defined and attr not in defined[owner])
    unknown = sorted(f"{owner}.{attr}" for owner, attr in named if owner not in defined)
    assert missing == [] and unknown == [], (missing, unknown)
