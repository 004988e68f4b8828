"""The conda environment, the pip project and the CI script agree with each other and the README."""
import re
import tomllib
from pathlib import Path

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
