import os
import subprocess
import sys
import threading
import time
from pathlib import Path

DRIVER = Path(__file__).with_name("driver.py")


def kills(request, short: int, long: int) -> int:
    return long if request.config.getoption("--long") else short


def run_until_killed(home: Path, session: str, seed: int, mode: str, seconds: float) -> list[tuple[int, str]]:
    """Start the driver, SIGKILL it after `seconds`, return the turns it acknowledged."""
    proc = subprocess.Popen([sys.executable, str(DRIVER), str(home), session, str(seed), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    time.sleep(seconds)
    proc.kill()
    proc.wait()
    reader.join(timeout=10)
    acked = []
    for line in lines:
        if line.endswith("\n") and line.startswith("ack "):
            _, turn, text = line.rstrip("\n").split(" ", 2)
            acked.append((int(turn), text))
    return acked
