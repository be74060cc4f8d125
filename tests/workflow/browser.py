"""A real headless browser for the report tests: Debian's ``chromium`` driven over the DevTools
protocol on a pipe (``--remote-debugging-pipe``: JSON messages ending in NUL on file descriptors 3
and 4, https://chromedevtools.github.io/devtools-protocol/), and ``tesseract`` reading the
screenshot back. `make host` installs both (as root); without them the tests skip."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

CHROMIUM = next((b for b in ("chromium", "chromium-browser") if shutil.which(b)), None)
TESSERACT = shutil.which("tesseract")
MISSING = [
    name for name, found in (("chromium", CHROMIUM), ("tesseract-ocr", TESSERACT)) if not found
]


class Browser:
    """One headless chromium, one page; every call waits for its own answer."""

    def __init__(self, profile: Path, size: tuple[int, int] = (1600, 1000)):
        to_chrome, self._write = os.pipe()
        self._read, from_chrome = os.pipe()
        cmd = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # as root in a container, chromium's own sandbox cannot start
            "--disable-gpu",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            "about:blank",
        ]

        def fds():
            # chromium reads the protocol on fd 3 and writes it on fd 4; moved above 4 first, so
            # that placing one never closes the other. Set after subprocess would close them: the
            # pipes close on exec, fds 3 and 4 stay (close_fds=False).
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_chrome, from_chrome)]
            for fd, at in zip(high, (3, 4), strict=True):
                os.dup2(fd, at)

        self.proc = subprocess.Popen(
            cmd,
            close_fds=False,
            preexec_fn=fds,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome)
        os.close(from_chrome)
        self._next, self._buffer, self.session = 0, b"", None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def call(self, method: str, **params) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._read, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium ended while answering {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._next:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"{expression} stayed false for {timeout} s")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        os.close(self._write)
        os.close(self._read)
        self.proc.terminate()
        self.proc.wait(timeout=30)


def ocr(png: Path) -> str:
    """The text tesseract reads in ``png``."""
    return subprocess.run(
        [TESSERACT, str(png), "stdout"], capture_output=True, text=True, check=True
    ).stdout
