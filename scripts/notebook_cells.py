"""The cells every course notebook shares, rendered from the one publishing setting
(course_lib/publish_settings.py): the "Open in Colab" badge in the first markdown cell and the
first code cell, which installs the course's package on Colab (and does nothing elsewhere).

scripts/generate_notebooks.py writes them into solutions/ and notebooks/; scripts/publish.py
changes the setting and runs the generator. Nothing else writes these cells.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PACKAGE = "llm-serving-course"
WHEEL_PREFIX = PACKAGE.replace("-", "_")
BADGE_BEGIN = "<!-- course-badge: written by scripts/generate_notebooks.py from course_lib/publish_settings.py -->"
BADGE_END = "<!-- /course-badge -->"
INSTALL_FIRST_LINE = "# Colab only: install the course's package (course_lib and the checks), pinned."
WHEEL_ENV = "COURSE_WHEEL"  # a local wheel to install instead (the Colab-like test, offline copies)


def settings(root: Path = ROOT) -> tuple[str | None, str]:
    """(repo or None, version) from `root`/course_lib/publish_settings.py, read as text (this
    checkout's settings, not an installed course_lib's; a rewritten file is seen at once)."""
    path = root / "course_lib" / "publish_settings.py"
    text = (path if path.is_file() else ROOT / "course_lib" / "publish_settings.py").read_text()
    namespace: dict = {}
    exec(compile(text, "publish_settings.py", "exec"), namespace)
    return namespace["COURSE_REPO"], namespace["COURSE_VERSION"]


def wheel_name(version: str) -> str:
    return f"{WHEEL_PREFIX}-{version}-py3-none-any.whl"


def release_wheel_url(repo: str, version: str) -> str:
    return f"https://github.com/{repo}/releases/download/v{version}/{wheel_name(version)}"


def colab_url(repo: str, version: str, notebook: str) -> str:
    """`notebook`: the path in the repository, e.g. notebooks/00_setup/00_setup.ipynb."""
    return f"https://colab.research.google.com/github/{repo}/blob/v{version}/{notebook}"


def badge_block(notebook: str, repo: str | None, version: str) -> str:
    if repo:
        body = (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                f"({colab_url(repo, version, notebook)})")
    else:
        body = ("> **Not published yet.** This course has no public repository yet, so there is no "
                "\"Open in Colab\" link. To run this notebook on Colab anyway: build the package in the "
                "course's repository (`python -m build`), open Colab, *File > Upload notebook* this "
                f"`.ipynb`, upload `dist/{wheel_name(version)}` to the session's files (the folder icon "
                "on the left), and run the first code cell: it installs that wheel.")
    return f"{BADGE_BEGIN}\n{body}\n{BADGE_END}"


def install_source(repo: str | None, version: str) -> str:
    if repo:
        return f'''{INSTALL_FIRST_LINE}
# Written by scripts/publish.py from course_lib/publish_settings.py; do not edit by hand.
import os
import subprocess
import sys

COURSE_PACKAGE = "{release_wheel_url(repo, version)}"
if "google.colab" in sys.modules:
    package = os.environ.get("{WHEEL_ENV}") or COURSE_PACKAGE  # {WHEEL_ENV}: a local wheel instead
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)'''
    return f'''{INSTALL_FIRST_LINE}
# The course is not published yet: upload {wheel_name(version)} (built with `python -m build`)
# to this Colab session's files, then run this cell. Written by scripts/publish.py; do not edit by hand.
import glob
import os
import subprocess
import sys

if "google.colab" in sys.modules:
    wheels = [os.environ["{WHEEL_ENV}"]] if os.environ.get("{WHEEL_ENV}") else glob.glob("/content/{wheel_name(version)}")
    if not wheels:
        raise FileNotFoundError("This course is not published yet, so there is nothing to install from the internet: "
                                "upload {wheel_name(version)} (built with `python -m build` in the course's "
                                "repository) to this session's files (the folder icon on the left), then run this cell again.")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", wheels[0]], check=True)'''


def is_install_cell(cell) -> bool:
    return cell.cell_type == "code" and "google.colab" in cell.source and "pip" in cell.source


def _with_badge(markdown: str, block: str) -> str:
    if BADGE_BEGIN in markdown and BADGE_END in markdown:
        head, rest = markdown.split(BADGE_BEGIN, 1)
        return head + block + rest.split(BADGE_END, 1)[1]
    lines = markdown.splitlines()
    for i, line in enumerate(lines):  # a hand-written badge (before the first publish)
        if "colab-badge.svg" in line:
            lines[i] = block
            return "\n".join(lines)
    title = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if title is None:
        return block + "\n\n" + markdown
    return "\n".join(lines[: title + 1] + ["", block] + lines[title + 1:])


def render(nb, notebook: str, repo: str | None, version: str):
    """Write the badge into the first markdown cell and the install cell's source, in place."""
    first_markdown = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first_markdown is not None:
        first_markdown.source = _with_badge(first_markdown.source, badge_block(notebook, repo, version))
    install = next((c for c in nb.cells if c.cell_type == "code"), None)
    if install is not None and is_install_cell(install):
        install.source = install_source(repo, version)
    return nb


REPO_PATTERN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")
VERSION_PATTERN = re.compile(r"^\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?$")
