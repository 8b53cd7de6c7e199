"""What a library others install owes them: a license that matches its metadata, dependency ranges
(never litellm 1.107.0), one pinned set for CI inside those ranges, and a source tree that imports
whole."""

from __future__ import annotations

import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ROOT

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements(extra: str | None = None) -> list[Requirement]:
    specs = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return [Requirement(s) for s in specs]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt pins exact versions: {line!r}"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_the_license_file_is_the_one_pyproject_names():
    assert PROJECT["license"] == "Apache-2.0" and "LICENSE" in PROJECT["license-files"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10_000, "the full text, not a pointer to it"


def test_dependencies_are_ranges_and_never_the_compromised_litellm():
    everything = _requirements() + [r for extra in PROJECT["optional-dependencies"] for r in _requirements(extra)]
    for req in everything:
        if req.name == "pager":
            continue
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{req} is pinned; give a range"
        assert any(s.operator in ("<", "~=") for s in req.specifier), f"{req} has no upper bound"
    litellm = next(r for r in _requirements() if r.name == "litellm")
    assert "!=1.107.0" in str(litellm.specifier), "exclude litellm 1.107.0 explicitly"
    assert not litellm.specifier.contains("1.107.0")


def test_the_pinned_set_lies_inside_the_ranges_and_leaves_pager_out():
    pins = _pins()
    assert "pager" not in pins
    for extra in (None, "bench", "test", "lint"):
        for req in _requirements(extra):
            if req.name == "pager":
                continue
            name = canonicalize_name(req.name)
            assert name in pins, f"constraints.txt lacks {req.name}"
            assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} is outside {req}"


def test_the_demo_needs_no_bench_package():
    names = {canonicalize_name(r.name) for r in _requirements()}
    assert not names & {"matplotlib", "rank-bm25", "nltk"}, "bench-only packages belong in the bench extra"
    assert {canonicalize_name(r.name) for r in _requirements("bench")} == {"matplotlib", "rank-bm25", "nltk"}


def test_the_source_tree_imports_whole_without_an_editable_install():
    """The README's quick start is `pip install .` in a clone; a newcomer then runs its Python example
    with python started in the clone's root, where the working folder comes first on sys.path and
    `import pager` is the source tree's pager/, which has no prompts/, tools/ or cli/:
    `pager.build` failed with "No module named 'pager.prompts'". The test's own editable install would
    hide this, so the child drops its finder first."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
            "import pager, pager.prompts, pager.tools, pager.cli.app, pager.context; "
            "assert pager.__file__.startswith(sys.argv[1]), pager.__file__")
    done = subprocess.run([sys.executable, "-c", code, str(root)], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
