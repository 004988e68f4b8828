"""The conda environment, the pip project and the CI script agree with each other and the README;
the package builds (wheel and sdist), passes `twine check`, carries what the notebooks need and
nothing instructor-only, and works installed on its own."""
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"torch": "pytorch"}  # pip name -> conda name where they differ


def _names(requirements):
    return {re.split(r"[<>=!\[ ;]", r.strip(), maxsplit=1)[0].lower() for r in requirements if r.strip()}


def test_environment_yml_lists_what_pyproject_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = _names(project["dependencies"]) | _names(project["optional-dependencies"]["dev"])
    env = (ROOT / "environment.yml").read_text()
    listed = _names(re.findall(r"^\s*-\s+([A-Za-z][^\s#]*)", env, flags=re.M))
    missing = {n for n in needed if CONDA_NAMES.get(n, n) not in listed}
    assert not missing, f"environment.yml does not list {sorted(missing)} (needed by pyproject.toml)"
    assert "-e .[dev]" in env, "environment.yml must install the package itself in editable mode"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"^(bash scripts/setup\.sh && python3? -m pytest [^\n`]*)", readme, flags=re.M)
    assert command, "README must give the one-line test command"
    assert command.group(1).replace("python -m", "python3 -m") in ci.replace("python -m", "python3 -m")


def test_torch_is_never_asked_for_with_a_bare_requirement_before_the_pinned_wheel():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert setup.index('"torch==2.13.0"') < setup.index('-e ".[dev]"')


def test_shell_scripts_parse():
    """The scripts CI never runs end to end (gpu_check.sh needs a GPU) at least parse."""
    import subprocess

    for script in ("setup.sh", "gpu_check.sh"):
        result = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"


def test_package_data_ships_the_files_the_code_opens():
    """A wheel carries only .py files and what package-data lists: the C kernels' sources and the
    tiny model's files must be in that list, or an installed course_lib cannot find them."""
    from fnmatch import fnmatch

    from course_lib.attention import cpu_decode
    from course_lib.model import cpu_forward
    from course_lib.model.tiny import TINY_DIR

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["course_lib"]
    tiny_files = (TINY_DIR / f for f in ("config.json", "tokenizer.json", "model.safetensors"))
    needed = [cpu_decode.SOURCE, cpu_forward.SOURCE, *tiny_files]
    for path in needed:
        rel = path.relative_to(ROOT / "course_lib").as_posix()
        assert any(fnmatch(rel, p) for p in patterns), f"{rel} is not in [tool.setuptools.package-data]"


# ----------------------------------------------------------------------------------- the built package
# Built once (wheel + sdist) by scripts/build_package.py: from a copy of the files git would commit,
# with this environment's setuptools (no download), never writing into the checkout.
INSTRUCTOR_ONLY = ("autograder/reference/", "autograder/mutants/", "autograder/controls/", "solutions/", "notebooks/", "tests/")
ANSWER_REGION = re.compile(r"^\s*### BEGIN (SOLUTION|HIDDEN TESTS)\s*$", re.M)  # a region, not the word


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{"wheel": Path, "sdist": Path}."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import build_package

    wheel, sdist = build_package.build(tmp_path_factory.mktemp("dist"))
    return {"wheel": wheel, "sdist": sdist}


def _wheel_names(wheel) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def _sdist_names(sdist) -> list[str]:
    import tarfile

    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        return [n[len(top) + 1:] for n in archive.getnames() if n.startswith(top + "/")]


def test_twine_check_passes(built):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(built["wheel"]), str(built["sdist"])],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_package_carries_what_notebooks_need_and_nothing_instructor_only(built, kind):
    import zipfile

    names = _wheel_names(built["wheel"]) if kind == "wheel" else _sdist_names(built["sdist"])
    needed = ["course_lib/model/tiny/model.safetensors", "course_lib/model/tiny/config.json",
              "course_lib/model/tiny/tokenizer.json", "course_lib/attention/cpu_decode.c",
              "course_lib/model/cpu_forward.c", "course_lib/course.py", "autograder/_checking.py",
              "autograder/fixtures.py"]
    needed += [p.relative_to(ROOT).as_posix() for p in (ROOT / "autograder" / "checks").rglob("*.py")]
    needed += [p.relative_to(ROOT).as_posix() for p in (ROOT / "course_lib" / "serve" / "static").rglob("*")
               if p.is_file()]  # the dashboard's page, when there is one
    missing = sorted(set(needed) - set(names))
    assert not missing, f"the {kind} lacks {missing}"
    leaked = sorted(n for n in names if n.startswith(INSTRUCTOR_ONLY) or n.endswith(".ipynb"))
    assert not leaked, f"the {kind} ships instructor-only files: {leaked[:10]}"
    if kind == "wheel":
        with zipfile.ZipFile(built["wheel"]) as archive:
            for name in names:
                if name.endswith(".py"):
                    text = archive.read(name).decode()
                    assert not ANSWER_REGION.search(text), f"{name} holds solutions or hidden tests"


def test_the_wheel_ships_no_hidden_seed(built, tmp_path):
    """The hidden tests' seeds live only in solutions/ (autograder/hidden_seeds.py): the installed
    table of exercises has none, and asking it for them says where they are."""
    import subprocess
    import sys
    import zipfile

    with zipfile.ZipFile(built["wheel"]) as archive:
        table = archive.read("autograder/exercises.py").decode()
        archive.extractall(tmp_path / "site")
    assert "hidden_seeds=" not in table and "(1, 2)" not in table
    code = ("import dataclasses\n"
            "from autograder.exercises import EXERCISES, Exercise\n"
            "from autograder.hidden_seeds import NoSolutions\n"
            "assert [f.name for f in dataclasses.fields(Exercise) if 'seed' in f.name] == ['visible_seed']\n"
            "try:\n"
            "    EXERCISES[0].graded_seeds\n"
            "except NoSolutions as e:\n"
            "    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(tmp_path / "site")})
    assert done.returncode == 0 and "live only in the instructor's notebook" in done.stdout, done.stdout + done.stderr


def test_installed_wheel_loads_the_model_and_imports_every_check(built, tmp_path):
    """The wheel on its own (unpacked first on the path, run outside the checkout): the tiny model
    loads, a C source is found, and every check module imports without the answer key."""
    import subprocess
    import sys
    import zipfile

    site = tmp_path / "site"
    with zipfile.ZipFile(built["wheel"]) as archive:
        archive.extractall(site)
    code = (
        "import importlib, pkgutil, course_lib, autograder.checks as checks\n"
        "assert course_lib.__file__.startswith(%r), course_lib.__file__\n"
        "model, tokenizer = course_lib.load_tiny()\n"
        "from course_lib.attention import cpu_decode\n"
        "assert cpu_decode.SOURCE.is_file()\n"
        "for m in pkgutil.walk_packages(checks.__path__, 'autograder.checks.'):\n"
        "    importlib.import_module(m.name)\n"
        "print('ok', model.config.vocab_size)\n"
    ) % str(site)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(site)})
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout + done.stderr[-3000:]


def test_one_version_everywhere():
    """The version the notebooks pin (publish_settings) is the one pip builds and Python reports."""
    import autograder
    import course_lib
    from course_lib import publish_settings

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert course_lib.__version__ == autograder.__version__ == publish_settings.COURSE_VERSION == version
