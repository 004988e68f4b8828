"""docs/architecture.md's table of the files one step runs is true: this runs the doc's own example
under a profiler limited to course_lib, for each build of the forward pass the table names, and
compares the files that ran with the table's rows for that build.

Only calls made inside `LLMEngine.add_request` and `LLMEngine.step` count (loading the model and
building the engine are not the step). A C file counts when a module that ran holds a
`course_lib.native.Kernel` built from it: ctypes calls are invisible to a profiler, and such a
module is the only way into its kernel."""
from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest
import torch

import course_lib
from course_lib.engine import LLMEngine
from course_lib.native import Kernel

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
PACKAGE = Path(course_lib.__file__).resolve().parent
# The builds the table's "runs in" column names, and the EngineConfig settings that ask for each.
BUILDS = {
    "cpu/cpu": dict(forward="cpu", attention_backend="cpu"),
    "eager/torch": dict(forward="eager", attention_backend="torch"),
    "eager/cpu": dict(forward="eager", attention_backend="cpu"),
}
STEP_ENTRIES = (LLMEngine.add_request.__code__, LLMEngine.step.__code__)


def _between(text: str, name: str) -> str:
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    assert text.count(start) == 1 and text.count(end) == 1, f"{DOC.name} must hold one {start} ... {end} block"
    return text.split(start, 1)[1].split(end, 1)[0]


def doc_example() -> str:
    block = _between(DOC.read_text(), "step-example")
    code = re.fullmatch(r"\s*```python\n(.*?)```\s*", block, re.S)
    assert code, "the step-example block must be one ```python fence"
    return code.group(1)


def doc_table() -> dict[str, set[str]]:
    """file (as `course_lib/...`) -> the builds it runs in, from the step-files table."""
    rows = {}
    for line in _between(DOC.read_text(), "step-files").strip().splitlines()[2:]:  # past header and rule
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) >= 4, f"a step-files row needs #, file, runs in, role: {line!r}"
        file = re.fullmatch(r"`(course_lib/[\w/]+\.(?:py|c))`", cells[1])
        assert file, f"the file cell must be one `course_lib/...` path: {line!r}"
        builds = {b.strip() for b in cells[2].split(",")}
        builds = set(BUILDS) if builds == {"all"} else builds
        assert builds <= set(BUILDS), f"'runs in' names unknown builds {builds - set(BUILDS)}: {line!r}"
        assert cells[3], f"a step-files row needs its role in the step: {line!r}"
        assert file.group(1) not in rows, f"{file.group(1)} is listed twice"
        rows[file.group(1)] = builds
    return rows


def _name(path) -> str:
    return "course_lib/" + Path(path).resolve().relative_to(PACKAGE).as_posix()


def files_the_step_runs(config_overrides: dict | None = None) -> tuple[set[str], str]:
    """Run the doc's example (its EngineConfig() given `config_overrides`); return the course_lib
    files its add_request / step calls ran, and the build the engine took."""
    ran_modules, depth = set(), [0]

    def profile(frame, event, arg):
        code = frame.f_code
        if code in STEP_ENTRIES:
            depth[0] += 1 if event == "call" else -1 if event == "return" else 0
        if event == "call" and depth[0] and code.co_filename.startswith(str(PACKAGE)):
            ran_modules.add(frame.f_globals.get("__name__"))

    config = course_lib.EngineConfig
    namespace: dict = {}
    previous = sys.getprofile()
    try:
        if config_overrides:  # the example builds `EngineConfig()`: give it this build's settings
            course_lib.EngineConfig = functools.partial(config, **config_overrides)
        sys.setprofile(profile)
        exec(compile(doc_example(), f"{DOC.name} step-example", "exec"), namespace)
    finally:
        sys.setprofile(previous)
        course_lib.EngineConfig = config
    files = set()
    for module in map(sys.modules.get, ran_modules):
        files.add(_name(module.__file__))
        for kernel in (v for v in vars(module).values() if isinstance(v, Kernel)):
            files.update(_name(source) for source in (kernel.source, *kernel.includes))
    runner = namespace["engine"].runner
    return files, f"{runner.forward}/{runner.attention_backend}"


def _compare(ran: set[str], build: str) -> None:
    listed = {f for f, builds in doc_table().items() if build in builds}
    assert ran == listed, (
        f"docs/architecture.md's step-files table is wrong for the {build} build: "
        f"it leaves out {sorted(ran - listed)} (the step runs them) and lists {sorted(listed - ran)} "
        "(the step does not run them)")


def _c_attention_builds() -> bool:
    from course_lib.attention.cpu_decode import KERNEL

    return KERNEL.available(torch.float64)[0]


def test_the_table_lists_exactly_the_files_the_default_step_runs():
    ran, build = files_the_step_runs()
    assert build in BUILDS, f"the default step took the {build} build, which the table does not describe"
    _compare(ran, build)


@pytest.mark.parametrize("build", ["eager/torch", "eager/cpu"])
def test_the_table_lists_exactly_the_files_each_eager_build_runs(build):
    if build == "eager/cpu" and not _c_attention_builds():
        pytest.skip("no C kernel here (needs a C compiler)")
    ran, took = files_the_step_runs(BUILDS[build])
    assert took == build
    _compare(ran, build)


def test_every_listed_file_exists():
    missing = [f for f in doc_table() if not (REPO / f).is_file()]
    assert not missing, f"docs/architecture.md lists files that do not exist: {missing}"
