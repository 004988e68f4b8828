"""Point the course at its public repository and version: every badge and install cell follows.

    python scripts/publish.py --repo OWNER/NAME [--version V]   # published at github.com/OWNER/NAME
    python scripts/publish.py --unpublished [--version V]       # back to "not published yet"

It writes the one setting, course_lib/publish_settings.py (COURSE_REPO, COURSE_VERSION); with
--version it also sets the package's version where Python and pip read it (pyproject.toml,
course_lib/__init__.py, autograder/__init__.py), so the wheel you build is the one the notebooks
pin. Then it runs scripts/generate_notebooks.py, which renders the badges and Colab install cells of
solutions/ from the setting and regenerates notebooks/.

What the notebooks then do on Colab: the badge opens notebooks/<A>/<A>.ipynb at the git tag v<V> of
the repository, and the first code cell pip-installs the wheel attached to the GitHub release v<V>
(https://github.com/OWNER/NAME/releases/download/v<V>/llm_serving_course-<V>-py3-none-any.whl).
The steps to make those links real are printed at the end (and in the README, "Publishing the course").
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate_notebooks  # noqa: E402
import notebook_cells  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = Path("course_lib/publish_settings.py")
# Where the version is written: (file, pattern whose group 2 is the version).
VERSION_SITES = [
    (Path("pyproject.toml"), re.compile(r'^(version = ")([^"]+)(")', re.M)),
    (Path("course_lib/__init__.py"), re.compile(r'^(__version__ = ")([^"]+)(")', re.M)),
    (Path("autograder/__init__.py"), re.compile(r'^(__version__ = ")([^"]+)(")', re.M)),
    (SETTINGS, re.compile(r'^(COURSE_VERSION = ")([^"]+)(")', re.M)),
]
REPO_LINE = re.compile(r"^COURSE_REPO = .*$", re.M)


def _replace_once(path: Path, pattern: re.Pattern, make) -> None:
    text = path.read_text()
    found = pattern.findall(text)
    if len(found) != 1:
        raise SystemExit(f"{path}: expected exactly one line matching {pattern.pattern!r}, found {len(found)}")
    path.write_text(pattern.sub(make, text, count=1))


def write_settings(root: Path, repo: str | None, version: str | None) -> None:
    _replace_once(root / SETTINGS, REPO_LINE, lambda m: f"COURSE_REPO = {repo!r}")
    if version is not None:
        for rel, pattern in VERSION_SITES:
            _replace_once(root / rel, pattern, lambda m: f"{m.group(1)}{version}{m.group(3)}")


def next_steps(repo: str | None, version: str) -> str:
    wheel = notebook_cells.wheel_name(version)
    if repo is None:
        return ("The notebooks now say the course is not published yet and how to run one on Colab by "
                f"uploading it with dist/{wheel}.")
    return f"""The notebooks now install {notebook_cells.release_wheel_url(repo, version)}
on Colab, and their badges open the notebooks at the tag v{version} of github.com/{repo}. To make that real:
  1. python -m build && python -m twine check dist/*      (dist/{wheel} and the sdist)
  2. commit, then: git tag v{version} && git push origin main v{version}
  3. on GitHub, make a release from the tag v{version} and attach dist/{wheel}
     (gh release create v{version} dist/{wheel} dist/llm_serving_course-{version}.tar.gz)
  4. open a badge from the README's table on github.com/{repo}: the first cell installs the wheel."""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--repo", help="the GitHub repository, OWNER/NAME")
    target.add_argument("--unpublished", action="store_true", help="no repository: the notebooks say so")
    parser.add_argument("--version", help="the package version the notebooks pin (default: the current one)")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this script's repo)")
    args = parser.parse_args(argv)

    if args.repo is not None and not notebook_cells.REPO_PATTERN.match(args.repo):
        parser.error(f"--repo must be OWNER/NAME as GitHub spells it (letters, digits, '-', '.', '_'), "
                     f"got {args.repo!r}")
    if args.version is not None and not notebook_cells.VERSION_PATTERN.match(args.version):
        parser.error(f"--version must be a release version like 0.1.0 or 1.2rc1, got {args.version!r}")

    write_settings(args.root, None if args.unpublished else args.repo, args.version)
    repo, version = notebook_cells.settings(args.root)
    print(f"course_lib/publish_settings.py: COURSE_REPO = {repo!r}, COURSE_VERSION = {version!r}")
    status = generate_notebooks.main(["--root", str(args.root)])
    if status == 0:
        print(next_steps(repo, version))
    return status


if __name__ == "__main__":
    sys.exit(main())
