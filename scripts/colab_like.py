"""Run every student notebook as a student on Colab would: fresh environment, the install cell, Run All.

    python scripts/colab_like.py [--venv DIR] [--notebook 03_paged_kv ...] [--notebooks DIR] [--json PATH]

1. Builds the wheel (scripts/build_package.py), as a release would, and generates the student
   notebooks from solutions/ (scripts/generate_notebooks.py, into a temporary folder; or takes
   them from `--notebooks DIR`, e.g. notebooks/).
2. Makes a fresh virtual environment (not --system-site-packages) with the packages Colab
   preinstalls that the course uses, at Colab's versions (COLAB_PACKAGES below; torch is the CPU
   wheel on this machine's disk). `--venv DIR` reuses one made before (it is checked, not trusted).
3. Starts each notebook's kernel from that environment with a stand-in `google.colab` module
   already imported, as Colab's kernel has it, so the notebooks take their Colab branch; the
   install cell then pip-installs the wheel (COURSE_WHEEL points it at the one just built; on the
   real Colab it installs the published one). The package is uninstalled again after each
   notebook, so every notebook's install cell really installs it, as in a fresh Colab runtime.
4. Executes the notebook top to bottom like Run All: an error stops the run unless its cell is
   tagged raises-exception (an unfinished exercise's test cell). The working directory is a copy
   of the notebook's folder, so nothing is imported from this checkout.

No GPU: this checks the Colab path on the CPU (fast mode); the GPU-only cells take their CPU
branch. It takes minutes (it prints each notebook's time), so it is a script, not part of the CI
suite; README "Publishing the course" says when to run it. Exit status 0 when every notebook
reached its last cell with only the tagged cells failing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_package  # noqa: E402
import generate_notebooks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KERNEL_NAME = "colab-like"
# What a Colab runtime has preinstalled, for the packages the course imports. Sources:
# googlecolab/backend-info pip-freeze.txt (ipywidgets 7.7.1, ipython 7.34.0), google-colab 1.0.0's
# own pins as pip reports them on Colab in 2025 (ipykernel==6.17.1, ipython==7.34.0), and 2025
# Colab listings (numpy 2.0.2, matplotlib 3.10.0, tqdm 4.67.1, safetensors 0.5.3). Colab runs
# Python 3.12 and a CUDA torch 2.x; here: this machine's Python and the CPU torch on disk.
COLAB_PACKAGES = [
    "torch==2.13.0",
    "numpy==2.0.2",
    "matplotlib==3.10.0",
    "tqdm==4.67.1",
    "safetensors==0.5.3",
    "ipython==7.34.0",
    "ipykernel==6.17.1",
    "ipywidgets==7.7.1",
    # Colab's CUDA torch brings the triton it was built with (notebook 04 imports it; on a CPU it
    # runs its kernels in the interpreter). Here: the triton paired with this torch, as in dev.
    "triton==3.9.0",
]
PACKAGE = "llm-serving-course"

STANDIN_COLAB = '''"""A stand-in for Colab's google.colab package: present, so code takes its Colab branch."""
'''
STANDIN_OUTPUT = '''"""google.colab.output, as far as notebooks call it."""


def enable_custom_widget_manager():
    """On Colab this lets third-party widgets render; here there is nothing to enable."""


def serve_kernel_port_as_iframe(port, path="/", width="100%", height="400", cache_in_notebook=False):
    """On Colab: an iframe showing what the kernel serves on `port`, through Colab's proxy. Here the
    same iframe, straight at localhost (nothing is proxied)."""
    from IPython.display import IFrame, display

    display(IFrame(f"http://localhost:{int(port)}{path}", width=width, height=height))


def serve_kernel_port_as_window(port, path="/", anchor_text=None):
    """On Colab: a link opening the kernel's `port` in a new tab. Here the same link, at localhost."""
    from IPython.display import HTML, display

    url = f"http://localhost:{int(port)}{path}"
    display(HTML(f'<a href="{url}" target="_blank">{anchor_text or url}</a>'))
'''
LAUNCHER = '''"""Start an IPython kernel the way Colab's starts: google.colab already imported."""
import google.colab  # noqa: F401
from ipykernel.kernelapp import launch_new_instance

launch_new_instance()
'''
WHERE_FROM = textwrap.dedent('''
    import course_lib, sys
    print("COLAB_LIKE_CHECK", course_lib.__file__, course_lib.__version__, "google.colab" in sys.modules)
''')


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def make_venv(venv: Path) -> None:
    """A fresh environment with COLAB_PACKAGES (reused when it already has exactly those)."""
    python = venv_python(venv)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    started = time.perf_counter()
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *COLAB_PACKAGES], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"installing {COLAB_PACKAGES} into {venv} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", PACKAGE], check=False,
                   capture_output=True)
    probe = subprocess.run([str(python), "-c", "import ipywidgets, sys; print(ipywidgets.__version__); "
                            "import importlib.util as u; sys.exit(u.find_spec('course_lib') is not None)"],
                           capture_output=True, text=True, cwd=tempfile.gettempdir())
    if probe.returncode != 0:
        raise SystemExit(f"{venv} already has course_lib, or is broken: {probe.stdout}{probe.stderr}")
    print(f"venv {venv}: {' '.join(COLAB_PACKAGES)} (ipywidgets {probe.stdout.strip()}), "
          f"{time.perf_counter() - started:.0f} s")


def write_kernel(home: Path, venv: Path, wheel: Path) -> dict:
    """The stand-in google.colab, a launcher importing it, and a kernelspec; the env for jupyter."""
    standin = home / "standin"
    (standin / "google" / "colab").mkdir(parents=True, exist_ok=True)
    (standin / "google" / "__init__.py").write_text("")
    (standin / "google" / "colab" / "__init__.py").write_text(STANDIN_COLAB)
    (standin / "google" / "colab" / "output.py").write_text(STANDIN_OUTPUT)
    (standin / "colab_kernel.py").write_text(LAUNCHER)
    spec_dir = home / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [str(venv_python(venv)), "-m", "colab_kernel", "-f", "{connection_file}"],
        "display_name": "Colab-like (CPU)",
        "language": "python",
        "env": {"PYTHONPATH": str(standin), "COURSE_WHEEL": str(wheel), "MPLBACKEND": "agg",
                # ipykernel 6.17's debugger warns about frozen modules at every start: noise here
                "PYDEVD_DISABLE_FILE_VALIDATION": "1",
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    return {"JUPYTER_PATH": str(home / "jupyter")}


def run_notebook(path: Path, work: Path, venv: Path, cell_timeout: int) -> dict:
    """Run All on a copy of `path`'s folder. {"notebook", "seconds", "reached_end", "errors", ...}."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    folder = work / path.parent.name
    shutil.copytree(path.parent, folder)
    nb = nbformat.read(folder / path.name, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(WHERE_FROM))
    client = NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=cell_timeout, allow_errors=False,
                            resources={"metadata": {"path": str(folder)}})
    started = time.perf_counter()
    stopped_by = None
    try:
        client.execute()
    except CellExecutionError as err:
        stopped_by = re.sub(r"\x1b\[[0-9;]*m", "", str(err).strip().splitlines()[-1])[:300]
    seconds = time.perf_counter() - started
    subprocess.run([str(venv_python(venv)), "-m", "pip", "uninstall", "-y", "-q", PACKAGE],
                   capture_output=True, check=False)
    errors = [f"cell {i}: {o.ename}" + ("" if "raises-exception" in c.metadata.get("tags", []) else " (untagged)")
              for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.output_type == "error"]
    where = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    installed_from_wheel = "COLAB_LIKE_CHECK" in where and str(venv) in where and " True" in where
    return {"notebook": path.parent.name, "seconds": round(seconds, 1), "reached_end": stopped_by is None,
            "stopped_by": stopped_by, "errors": errors, "installed_from_wheel": installed_from_wheel,
            "where": where.strip()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=Path, help="reuse (or create) this environment instead of a temporary one")
    parser.add_argument("--notebook", action="append", help="only this assignment (repeatable)")
    parser.add_argument("--notebooks", type=Path, help="student notebooks to run (default: freshly generated)")
    parser.add_argument("--json", type=Path, help="write the per-notebook results here")
    parser.add_argument("--cell-timeout", type=int, default=600, help="seconds one cell may take (default 600)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="colab-like-") as tmp:
        home = Path(tmp)
        started = time.perf_counter()
        wheel, _ = build_package.build(home / "dist")
        print(f"built {wheel.name} in {time.perf_counter() - started:.0f} s")
        notebooks = args.notebooks
        if notebooks is None:
            notebooks = home / "notebooks"
            sources = ROOT / generate_notebooks.SOURCE_DIR
            generate_notebooks.generate(sources, notebooks, generate_notebooks.assignments(sources))
        paths = sorted(notebooks.glob("*/*.ipynb"))
        if args.notebook:
            paths = [p for p in paths if p.parent.name in args.notebook]
            if len(paths) != len(args.notebook):
                parser.error(f"unknown assignment in {args.notebook}; known: "
                             f"{[p.parent.name for p in notebooks.glob('*/*.ipynb')]}")
        venv = args.venv or home / "venv"
        make_venv(venv)
        os.environ.update(write_kernel(home, venv, wheel))
        results = []
        for path in paths:
            result = run_notebook(path, home / "work", venv, args.cell_timeout)
            results.append(result)
            verdict = "reached the end" if result["reached_end"] else f"STOPPED: {result['stopped_by']}"
            print(f"{result['notebook']:<24} {result['seconds']:6.1f} s  {verdict}; "
                  f"errors: {', '.join(result['errors']) or 'none'}; "
                  f"course_lib from the wheel: {result['installed_from_wheel']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    ok = all(r["reached_end"] and r["installed_from_wheel"] for r in results)
    total = sum(r["seconds"] for r in results)
    print(f"{'all notebooks' if ok else 'NOT all notebooks'} ran through on the Colab-like setup "
          f"({len(results)} notebooks, {total:.0f} s of notebook time; no GPU)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
