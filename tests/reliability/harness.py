import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

DRIVER = Path(__file__).with_name("driver.py")


def kills(request, short: int, long: int) -> int:
    return long if request.config.getoption("--long") else short


def seed_for(*parts) -> int:
    """A seed derived stably from the test's own names (not hash(), which changes per process)."""
    return zlib.crc32(":".join(map(str, parts)).encode())


def run_until_killed(home: Path, session: str, seed: int, mode: str, delay: float,
                     first_ack_timeout: float = 300.0) -> list[tuple[int, str]]:
    """Start the driver, wait for its first acknowledgement (however slow the machine), then SIGKILL
    it `delay` seconds later; return the turns it acknowledged."""
    proc = subprocess.Popen([sys.executable, str(DRIVER), str(home), session, str(seed), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    first = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            first.set()
        first.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    acked_in_time = first.wait(first_ack_timeout)
    if acked_in_time and proc.poll() is None:
        time.sleep(delay)
    proc.kill()
    proc.wait()
    reader.join(timeout=30)
    err = proc.stderr.read()
    assert lines, f"seed {seed}: the driver acknowledged nothing before it was killed; stderr: {err[-2000:]}"
    acked = []
    for line in lines:
        if line.endswith("\n") and line.startswith("ack "):
            _, turn, text = line.rstrip("\n").split(" ", 2)
            acked.append((int(turn), text))
    return acked
