"""The grader's cell runner is not a widget frontend (jupyter/nbclient#312): nbclient, mimicking one
for Output widgets (what `ipywidgets.interact` draws into), sends comm messages on the shell channel
while it waits on that channel for the cell's reply, and now and then the cell hangs until its timeout
(60 s lost in about one notebook of four with a slider under --jobs 2). The runner sends nothing but
its execute requests, and what an interact prints still reaches the cell's outputs."""
from __future__ import annotations

import asyncio

import nbformat
import pytest

from autograder.grade import _Executor

pytest.importorskip("ipywidgets")

INTERACT = """import ipywidgets as widgets

def show(x):
    print("shown", x)

widgets.interact(show, x=widgets.IntSlider(value=3, min=0, max=9, continuous_update=False));"""


def test_a_slider_cell_sends_no_comm_message_and_its_output_reaches_the_cell(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(INTERACT), nbformat.v4.new_code_cell("1 + 1")])
    executor = _Executor(nb, str(tmp_path), "python3", 60)
    sent: list[str] = []
    start = executor._start

    async def start_and_listen():
        await start()
        channel = executor.client.kc.shell_channel
        send = channel.send

        def listening(msg):
            sent.append(msg["header"]["msg_type"])
            return send(msg)

        channel.send = listening

    executor._start = start_and_listen
    asyncio.run(executor.run())
    assert executor.status == {0: "ok", 1: "ok"}, executor.log
    assert set(sent) == {"execute_request"}, f"the runner sent {sorted(set(sent))}: it plays a widget frontend"
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("output_type") == "stream")
    assert "shown 3" in text, nb.cells[0].outputs
