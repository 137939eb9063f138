"""The side processes (vitrine/web/sideproc.py) outlive nothing: when the API process dies however it
ends (kill -9 included), its side processes exit too, instead of waiting for jobs forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PARENT = """
import asyncio, sys, time
from vitrine.settings import FeedbackSettings
from vitrine.web import sideproc

proc = sideproc.SideProcess("intake", sys.argv[1], FeedbackSettings(), nice=0, idle=False)
print(asyncio.run(proc.run(sideproc.identity))[0], flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone too (its parent, the killed API, can no longer reap it)
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def test_a_side_process_exits_when_the_api_process_is_killed(tmp_path):
    api = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "events.sqlite")], stdout=subprocess.PIPE,
                           text=True)
    try:
        line = api.stdout.readline() if api.stdout else ""
        assert line.strip().isdigit(), line
        child = int(line)
        assert child != api.pid and alive(child)
        api.send_signal(signal.SIGKILL)
        api.wait(30)
        deadline = time.monotonic() + 30  # a bound on a liveness wait, not a timing assertion
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), f"side process {child} outlived its API process"
    finally:
        if api.poll() is None:
            api.kill()
