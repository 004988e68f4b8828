"""The runner inside the sandbox: a notebook executed cell by cell in one kernel, surviving timeouts
and kernel deaths, within the notebook's time budget (`autograder.sandbox_exec` drives it)."""
from __future__ import annotations

import asyncio
import copy
import os
import time
from pathlib import Path

import nbformat

from .notebook_cells import is_test_cell


DEFAULT_TIMEOUT = 60
SETUP_TIMEOUT = 300  # the setup cell imports torch and the checks: slow on a busy machine
MAX_KERNEL_RESTARTS = 3
PROBE_TIMEOUT = 15


def _kernel_env(stage: Path | None = None) -> dict:
    env = dict(os.environ)
    if stage is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(stage)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
                "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "COURSE_AUTOGRADE": "1"})
    env.pop("PYTHONSTARTUP", None)
    return env


def _error_output(ename: str, evalue: str):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class _Executor:
    """Runs a notebook cell by cell in one kernel, surviving timeouts and kernel deaths.

    A cell's outputs are what it printed while it ran: a later cell's display update
    (`update_display`, or a display with the same display_id) does not rewrite them (it would
    carry what the code saw in the cells between into an earlier cell's outputs)."""

    def __init__(self, nb, cwd: str, kernel_name: str, timeout: int, deadline: float | None = None, on_cell=None,
                 budget_s: float | None = None, skip_from: int | None = None):
        from nbclient import NotebookClient

        self.nb, self.cwd, self.kernel_name, self.timeout = nb, cwd, kernel_name, timeout
        self.deadline, self.on_cell = deadline, on_cell
        self.budget_s = budget_s
        self.skip_from = skip_from  # cells from here on are not run (unneeded_from)
        self.timings: dict[str, float] = {}  # cell index -> seconds (finding slow cells)
        self.client = NotebookClient(
            nb, kernel_name=kernel_name, timeout=timeout, allow_errors=True, interrupt_on_timeout=False,
            record_timing=False, startup_timeout=180, iopub_timeout=10, raise_on_iopub_timeout=False,
            timeout_func=self._timeout_of, resources={"metadata": {"path": cwd}},
            shutdown_kernel="immediate",  # (a graceful shutdown waits ~1 s; nothing of the kernel is kept)
            extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
        )
        self.client._update_display_id = lambda display_id, msg: None  # (no output changes after its cell)
        # No frontend for widgets: nbclient would mimic one for Output widgets (interact's) by sending
        # comm messages on the shell channel while it waits for the cell's reply on that channel, a race
        # that leaves the cell hanging until its timeout now and then (jupyter/nbclient#312: 60 s lost in
        # one notebook of four with a slider, under --jobs 2). What such a widget shows goes to the cell.
        self.client.comm_open_handlers = {"jupyter.widget": lambda msg: None}
        self.status: dict[int, str] = {}  # cell index -> ok | error | timeout | crashed | not_run | skipped
        self.runner_errors: dict[int, dict] = {}  # cell index -> the error output this runner added to it
        self.restarts = 0
        self.log: list[str] = []

    def _timeout_of(self, cell) -> int:
        limit = SETUP_TIMEOUT if cell.get("metadata", {}).get("autograder", {}).get("setup") else self.timeout
        if self.deadline is not None:
            limit = max(1, min(limit, int(self.deadline - time.monotonic())))
        return limit

    async def _start(self):
        client = self.client
        client.km = client.create_kernel_manager()
        env = _kernel_env()
        env.pop("AUTOGRADER_SEED_KEY", None)  # (the instructor's key: never the student's code's to read)
        await client.async_start_new_kernel(cwd=self.cwd, env=env)
        await client.async_start_new_kernel_client()

    async def _stop(self):
        try:
            if self.client.km is not None:
                await self.client._async_cleanup_kernel()
        except Exception:  # noqa: BLE001 - a dead kernel may fail to clean up; nothing to save
            pass

    @staticmethod
    def _cancel_stray_tasks():
        current = asyncio.current_task()
        for task in asyncio.all_tasks():
            if task is not current:
                task.cancel()

    async def _probe(self) -> bool:
        """After an interrupt: does the kernel answer a trivial request?"""
        kc = self.client.kc
        try:
            msg_id = kc.execute("pass", store_history=False)
            deadline = time.monotonic() + PROBE_TIMEOUT
            while time.monotonic() < deadline:
                try:
                    msg = await kc.shell_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - queue.Empty
                    break
                if msg.get("parent_header", {}).get("msg_id") == msg_id:
                    return True
        except Exception:  # noqa: BLE001
            return False
        return False

    async def _execute(self, index: int, cell) -> str:
        try:
            await self.client.async_execute_cell(cell, index)
        except Exception as exc:  # noqa: BLE001
            from nbclient.exceptions import CellTimeoutError, DeadKernelError

            self._cancel_stray_tasks()
            if isinstance(exc, CellTimeoutError):
                return "timeout"
            if isinstance(exc, DeadKernelError):
                return "crashed"
            raise
        return "error" if any(o.get("output_type") == "error" for o in cell.get("outputs", [])) else "ok"

    async def _recover(self, upto: int) -> bool:
        """A new kernel with the state of the cells before `upto` (tests and failed cells skipped)."""
        if self.restarts >= MAX_KERNEL_RESTARTS:
            return False
        self.restarts += 1
        await self._stop()
        try:
            await self._start()
        except Exception as exc:  # noqa: BLE001
            self.log.append(f"could not restart the kernel: {exc}")
            return False
        for index in range(upto):
            cell = self.nb.cells[index]
            if (cell.get("cell_type") != "code" or self.status.get(index) not in ("ok", "error")
                    or is_test_cell(cell)):
                continue
            original = self.nb.cells[index]
            replay = copy.deepcopy(original)
            try:
                status = await self._execute(index, replay)
            finally:
                self.nb.cells[index] = original
            if status in ("timeout", "crashed"):
                self.log.append(f"replaying cell {index} after a restart failed ({status})")
                return False
        return True

    async def run(self):
        try:
            await self._start()
        except Exception as exc:  # noqa: BLE001
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            self.log.append(f"could not start kernel {self.kernel_name!r}: {why}")  # (before any of the notebook ran)
            for index, cell in enumerate(self.nb.cells):
                if cell.get("cell_type") == "code":
                    self.status[index] = "not_run"
            return
        alive = True
        try:
            for index, cell in enumerate(self.nb.cells):
                if cell.get("cell_type") != "code" or not cell.get("source", "").strip():
                    continue
                if self.skip_from is not None and index >= self.skip_from:
                    self.status[index] = "skipped"
                    continue
                if not alive:
                    self.status[index] = "not_run"
                    continue
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self.status[index] = "not_run"
                    if "budget" not in " ".join(self.log[-1:]):
                        budget = f" of {self.budget_s:g} s" if self.budget_s else ""
                        self.log.append(f"the notebook's time budget{budget} was spent before cell {index}: "
                                        "the rest was not run (--budget)")
                    continue
                began = time.monotonic()
                status = await self._execute(index, cell)
                self.timings[str(index)] = round(time.monotonic() - began, 2)
                cell = self.nb.cells[index]
                self.status[index] = status
                if status == "timeout":
                    limit = self._timeout_of(cell)
                    self.runner_errors[index] = _error_output(
                        "CellTimeoutError", f"timed out after {limit} s (the kernel was interrupted)")
                    cell.setdefault("outputs", []).append(self.runner_errors[index])
                    self.log.append(f"cell {index} timed out after {limit} s")
                    try:
                        await self.client.km.interrupt_kernel()
                        recovered = await self._probe()
                    except Exception:  # noqa: BLE001 - a kernel that cannot be interrupted is replaced
                        recovered = False
                    if not recovered:
                        self.log.append("the kernel did not recover from the interrupt: restarting it")
                        alive = await self._recover(index)
                elif status == "crashed":
                    self.runner_errors[index] = _error_output(
                        "DeadKernelError", "the kernel died while running this cell (e.g. os._exit, "
                                           "a segfault, or out of memory)")
                    cell.setdefault("outputs", []).append(self.runner_errors[index])
                    self.log.append(f"the kernel died in cell {index}: restarting it")
                    alive = await self._recover(index)
                if not alive:
                    self.log.append("giving up on the rest of this notebook")
                if self.on_cell is not None:
                    self.on_cell(self, index)
        finally:
            await self._stop()
