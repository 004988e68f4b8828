"""The grader works wherever its Python lives (issue 23, deliverable 6), and `grade --doctor` says
what a sandbox will see.

A venv under /tmp used to score every notebook 0 ("the notebook runner exited with status 127"):
the sandbox's private /tmp was mounted over the venv's bind. Now the binds come after it, at the
same paths (and at the resolved ones, for links), and a Python installed where a sandbox must not
look (a folder holding the course repository) is refused with the reason and the fix.

The bind computation is tested without a sandbox (sys patched to describe a Python elsewhere);
then a venv is made under /tmp (`python -m venv --system-site-packages`, a few hundred ms) and
grades a real notebook with the instructor's seed key, and its doctor is asked.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder import sandbox as sb
from autograder import sandbox_python as sp
from autograder.hidden_seeds import derived_seed

from attack_cases import KV, honest, trimmed_source

ROOT = Path(__file__).resolve().parents[1]


def _fake_python(monkeypatch, prefix: Path, base: Path | None = None, path_entries=()):
    """Make the grader's Python look installed at `prefix` (a venv of `base`, if given)."""
    for folder in (prefix / "bin", prefix / "lib" / "python3.11" / "site-packages"):
        folder.mkdir(parents=True, exist_ok=True)
    (prefix / "bin" / "python").touch()
    base = base or prefix
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(sys, "exec_prefix", str(prefix))
    monkeypatch.setattr(sys, "base_prefix", str(base))
    monkeypatch.setattr(sys, "base_exec_prefix", str(base))
    monkeypatch.setattr(sys, "executable", str(prefix / "bin" / "python"))
    monkeypatch.setattr(sys, "path", ["", str(prefix / "lib" / "python3.11" / "site-packages"), *map(str, path_entries)])
    monkeypatch.setattr(sp.site, "getsitepackages", lambda: [str(prefix / "lib" / "python3.11" / "site-packages")])
    monkeypatch.setattr(sp.site, "ENABLE_USER_SITE", False)


def _binds_in_order(args: list[str]) -> list[tuple[str, str, int]]:
    return [(args[i + 1], args[i + 2], i) for i, a in enumerate(args) if a in ("--ro-bind", "--bind")]


def test_a_python_under_tmp_is_bound_after_the_private_tmp(monkeypatch, tmp_path):
    venv = tmp_path / "venv"
    _fake_python(monkeypatch, venv, base=Path(sys.base_prefix))
    assert str(venv).startswith("/tmp/")
    args = sb.bwrap_args(tmp_path / "job", None, sb.Limits())
    tmpfs = args.index("/tmp", args.index("--tmpfs"))
    binds = {dest: (src, i) for src, dest, i in _binds_in_order(args)}
    assert str(venv) in binds, f"the venv is not bound: {binds}"
    assert binds[str(venv)][0] == str(venv) and binds[str(venv)][1] > tmpfs, "bound after the private /tmp"
    assert args[binds[str(venv)][1]] == "--ro-bind", "read-only"
    assert os.path.realpath(sys.base_prefix) in binds, "the venv's base (its interpreter lives there) too"
    # its parent folders (pytest's are 0700 on the host) are made open to the sandbox's user
    for parent in (str(tmp_path), str(tmp_path.parent)):
        i = args.index(parent)
        assert args[i - 3:i] == ["--perms", "0755", "--dir"] and i < binds[str(venv)][1], parent


def test_a_link_is_bound_where_python_names_it_and_where_it_leads(monkeypatch, tmp_path):
    real = tmp_path / "real-env"
    _fake_python(monkeypatch, real)
    link = tmp_path / "link-env"
    link.symlink_to(real)
    monkeypatch.setattr(sys, "prefix", str(link))
    monkeypatch.setattr(sys, "executable", str(link / "bin" / "python"))
    found = {(b.source, b.dest) for b in sp.binds()}
    assert (str(real), str(link)) in found and (str(real), str(real)) in found, found


def test_folders_that_hold_the_grader_s_files_are_never_bound(monkeypatch, tmp_path):
    _fake_python(monkeypatch, tmp_path / "venv", path_entries=[ROOT, ROOT.parent, "/", "/tmp", ROOT / "scripts"])
    dests = [b.dest for b in sp.binds()]
    for private in (str(ROOT), str(ROOT.parent), "/", "/tmp", str(ROOT / "scripts")):
        assert private not in dests, f"{private} would be mounted in every sandbox"
    assert not any(ROOT.as_posix() + "/" in d + "/" for d in dests), dests
    assert any(str(ROOT) in s for s in sp.skipped())
    assert sp.problems(drops_to_uid=False) == [], "skipping an entry is not a reason to refuse"


def test_a_python_installed_over_the_repository_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(ROOT.parent))
    monkeypatch.setattr(sys, "exec_prefix", str(ROOT.parent))
    found = " ".join(sp.problems(drops_to_uid=False))
    assert "holds the course repository" in found and "python -m venv" in found, found
    assert not any(b.dest == str(ROOT.parent) for b in sp.binds())


def test_a_python_the_sandbox_user_cannot_read_is_refused(monkeypatch, tmp_path):
    venv = tmp_path / "private-venv"
    _fake_python(monkeypatch, venv)
    venv.chmod(0o700)
    found = " ".join(sp.problems(drops_to_uid=True))
    assert "not readable by other users" in found and f"chmod o+rx {venv}" in found, found
    venv.chmod(0o755)
    assert sp.problems(drops_to_uid=True) == []


def test_a_python_under_the_sandbox_s_own_folders_is_refused(monkeypatch):
    monkeypatch.setattr(sys, "prefix", "/proc/self")  # (a path that exists, under a folder the sandbox mounts itself)
    found = " ".join(sp.problems(drops_to_uid=False))
    assert "lies under /proc, which the sandbox uses for itself" in found, found


# ----------------------------------------------------------------------------- with real sandboxes


@pytest.fixture(scope="module")
def tmp_venv(tmp_path_factory):
    """A venv under /tmp (with this Python's packages, as `--system-site-packages` gives them)."""
    venv = tmp_path_factory.mktemp("venv-under-tmp") / "deeper" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    assert str(venv).startswith("/tmp/")
    return venv / "bin" / "python"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AUTOGRADER_SEED_KEY", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def test_a_venv_under_tmp_grades_a_notebook_with_derived_hidden_seeds(tmp_venv, tmp_path):
    source = trimmed_source(KV)
    (tmp_path / "src" / KV[0]).mkdir(parents=True)
    nbformat.write(source, tmp_path / "src" / KV[0] / f"{KV[0]}.ipynb")
    submission = tmp_path / "submitted" / "alice" / KV[0] / f"{KV[0]}.ipynb"
    submission.parent.mkdir(parents=True)
    nbformat.write(honest(source), submission)
    key = "a course's secret"
    done = subprocess.run([str(tmp_venv), "-m", "autograder", "grade", str(submission), "--json", str(tmp_path / "g.json"),
                           "--source-dir", str(tmp_path / "src"), "--html", str(tmp_path / "html"), "--quiet",
                           "--seed-key", key], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    entry = json.loads((tmp_path / "g.json").read_text())["notebooks"][0]
    assert entry["sandbox"] == "bwrap" and not entry["errors"], entry["errors"]
    assert (entry["score"], entry["max_score"]) == (1.0, 1.0), entry["cells"]
    derived = [derived_seed(key, KV[1], s) for s in (1, 2)]
    replayed = entry["replay"]
    assert [r["seed"] for r in replayed] == [0, None, None] and all(r["passed"] for r in replayed), replayed
    shown = json.dumps(entry) + Path(entry["html"]).read_text(encoding="utf-8")
    assert not any(str(s) in shown for s in derived), "a derived seed reached the feedback"


def test_the_doctor_of_a_venv_under_tmp_binds_it_and_imports_everything(tmp_venv):
    done = subprocess.run([str(tmp_venv), "-m", "autograder", "grade", "--doctor"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    venv = str(tmp_venv.parent.parent)
    assert f"read-only {venv}" in done.stdout, done.stdout
    for name in ("torch", "course_lib", "autograder", "ipykernel"):
        assert f"import {name}: ok" in done.stdout, done.stdout
    assert f"(/course/course_lib/__init__.py)" in done.stdout
    assert "the internet is NOT reachable" in done.stdout and "instructor's files: none visible" in done.stdout
    assert f"{sys.version.split()[0]}" in done.stdout and "uid" in done.stdout and "limits" in done.stdout
    assert "replay isolation: " in done.stdout and done.stdout.rstrip().endswith("grading would work here")


def test_the_doctor_says_why_grading_would_not_work(tmp_path):
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", "--doctor"], cwd=ROOT,
                          env=_env(AUTOGRADER_BWRAP=str(tmp_path / "no-such-bwrap")), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no-such-bwrap not found" in done.stdout and "grading would NOT work here" in done.stdout


def test_grade_still_wants_notebooks_and_json_without_the_doctor():
    done = subprocess.run([sys.executable, "-m", "autograder", "grade"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "--json" in done.stderr, done.stderr


def test_the_sandbox_loads_the_graders_compiled_kernels_instead_of_compiling(tmp_path):
    """The grader's kernel cache is mounted read-only and looked in first: a notebook's C kernel is the
    grader's build (before, every notebook compiled its own in its private /tmp: ~2 s each)."""
    if sb.available() is not None:
        pytest.skip(f"no sandbox here: {sb.available()}")
    from course_lib.model import cpu_forward

    assert cpu_forward.available()[0], "the grader builds its kernels first (as verdict._prepare_replay does)"
    job = tmp_path / "job"
    probe = ("from course_lib.model import cpu_forward; import torch; "
             "lib = cpu_forward.KERNEL.load(torch.float32); print(lib._name)")
    result = sb.run_job(job, [sys.executable, "-c", probe], budget_s=120)
    where = result.report.decode().strip()
    assert result.rc == 0, result.log_tail
    assert where.startswith(sb.PREBUILT_KERNELS + "/"), f"the sandbox compiled its own kernel: {where}"
