"""Build the course's wheel and sdist from a copy of the files git would commit.

    python scripts/build_package.py [--outdir dist]

Equivalent to `python -m build` in a clean clone, but without a clone: the files `git ls-files`
lists (tracked, plus untracked ones not ignored) under course_lib/, autograder/ and the packaging
files are copied to a temporary directory and built there with this environment's setuptools
(`--no-isolation`: no download), so a build never writes build/ or egg-info into the checkout.
tests/test_packaging.py and scripts/colab_like.py use it.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGED = ["course_lib", "autograder", "pyproject.toml", "README.md", "MANIFEST.in"]


def shippable_files(root: Path = ROOT) -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *PACKAGED],
                            cwd=root, capture_output=True, text=True, check=True).stdout.splitlines()
    return [f for f in listed if f and (root / f).is_file()]


def build(outdir: Path, root: Path = ROOT) -> tuple[Path, Path]:
    """(wheel, sdist) written into `outdir`."""
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="course-build-") as tmp:
        source = Path(tmp) / "source"
        for rel in shippable_files(root):
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, source / rel)
        done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir), str(source)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"python -m build failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    version = _version(root)
    wheel = outdir / f"llm_serving_course-{version}-py3-none-any.whl"
    sdist = outdir / f"llm_serving_course-{version}.tar.gz"
    for path in (wheel, sdist):
        if not path.is_file():
            raise RuntimeError(f"the build did not write {path.name} (found {sorted(p.name for p in outdir.iterdir())})")
    return wheel, sdist


def _version(root: Path) -> str:
    import tomllib

    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--outdir", type=Path, default=ROOT / "dist")
    args = parser.parse_args(argv)
    for path in build(args.outdir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
