"""A headless Chromium driven over the DevTools protocol (no WebDriver needed).

Starts ``chromium --headless`` on a free loopback port, opens one page and
offers what the dashboard test needs: navigate, read the page's visible text
(shadow roots included: Bokeh 3 renders its widgets in them), wait for text,
and take a PNG screenshot.  Uses tornado's websocket client (a dependency of
distributed), so the only extra is the browser itself
(``apt-get install chromium``).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

from tornado.websocket import websocket_connect

#: JavaScript returning the page's text, descending into shadow roots
PAGE_TEXT = """(() => {
  const out = [];
  const walk = (n) => {
    if (n.shadowRoot) walk(n.shadowRoot);
    for (const c of n.childNodes) {
      if (c.nodeType === 3) { const t = c.textContent.trim(); if (t) out.push(t); }
      else if ((c.nodeType === 1 && c.nodeName !== "STYLE" && c.nodeName !== "SCRIPT") || c.nodeType === 11) walk(c);
    }
  };
  walk(document.body);
  return out.join("\\n");
})()"""


def find_chromium() -> str | None:
    """Path of a Chromium binary, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with one page; use as an async context manager."""

    def __init__(self, binary: str, width: int = 1500, height: int = 1400):
        self.binary, self.width, self.height = binary, width, height
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Browser:
        self.profile = tempfile.mkdtemp(prefix="gear-flow-chromium-")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--headless=new",
                "--no-sandbox",  # CI runs as root
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        url = await asyncio.get_running_loop().run_in_executor(None, self._devtools_url)
        self.ws = await websocket_connect(url, max_message_size=256 * 2**20)
        target = (await self.send("Target.createTarget", url="about:blank"))["targetId"]
        self.session = (await self.send("Target.attachToTarget", targetId=target, flatten=True))["sessionId"]
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
            session=True,
        )
        return self

    def _devtools_url(self) -> str:
        deadline = time.monotonic() + 60
        for line in self.proc.stderr:
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                return m.group(1)
            if time.monotonic() > deadline:
                break
        raise RuntimeError(f"chromium did not start (exit code {self.proc.poll()})")

    async def __aexit__(self, *exc) -> None:
        self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    async def send(self, method: str, session: bool = False, **params) -> dict:
        """One DevTools command; its result (events in between are skipped)."""
        i = next(self._ids)
        msg = {"id": i, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        await self.ws.write_message(json.dumps(msg))
        while True:
            raw = await asyncio.wait_for(self.ws.read_message(), 60)
            if raw is None:
                raise RuntimeError("chromium closed the DevTools connection")
            reply = json.loads(raw)
            if reply.get("id") == i:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url, session=True)

    async def text(self) -> str:
        """The page's visible text, shadow roots included."""
        r = await self.send("Runtime.evaluate", expression=PAGE_TEXT, returnByValue=True, session=True)
        return r["result"].get("value") or ""

    async def wait_for(self, predicate, timeout: float = 60.0) -> str:
        """Poll the page's text until ``predicate(text)`` holds; the text, or TimeoutError with the last text."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = await self.text()
            if predicate(text):
                return text
            await asyncio.sleep(0.2)
        raise TimeoutError(f"the page never showed what was expected; it showed:\n{text[:3000]}")

    async def screenshot(self, path: str | os.PathLike) -> bytes:
        """Save a PNG of the viewport to ``path``; its bytes."""
        r = await self.send("Page.captureScreenshot", format="png", session=True)
        data = base64.b64decode(r["data"])
        with open(path, "wb") as f:
            f.write(data)
        return data
