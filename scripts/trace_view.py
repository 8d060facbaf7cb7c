"""Look at a trace in the MLflow UI as a person would, and screenshot RAIM's assessment there.

    python scripts/trace_view.py --tracking-uri sqlite:///mlflow.db --experiment raim-rag-demo --trace-id tr-… \
        --out trace.png [--assessment raim_hallucination] [--server-url http://127.0.0.1:5000]

It starts ``mlflow server`` on the store (unless ``--server-url`` names a running one) and headless Chromium
(Debian's ``chromium`` package, started as its documentation says for a headless container: no sandbox, no GPU,
no QUIC, no first-run, no background networking, no component update, no sync, a fresh profile), opens the
experiment's trace view on the trace, clicks the trace's "Assess" button (the assessments pane), waits until that
pane shows the assessment by name with its value, and writes the screenshot. Prints the pane's text; exits 1
when the assessment is not shown within ``--timeout`` seconds. Only the processes it started are stopped (by
their own ids). Driven over the DevTools protocol with aiohttp (an MLflow dependency): no browser driver to install.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
PANE = """(() => {
  const pane = [...document.querySelectorAll('div')].find(
    d => d.innerText && d.innerText.startsWith('Assessments\\n') && d.innerText.includes('Feedback'));
  return pane ? pane.innerText : '';
})()"""
CLOSE_EXTRAS = """(() => {
  for (const b of document.querySelectorAll('button[aria-label="Close guidance"]')) b.click();
  const title = [...document.querySelectorAll('span,div,h1,h2,h3,h4')].find(e => (e.innerText || '').trim()
    .startsWith('MLflow Assistant') && (e.innerText || '').length < 40);
  for (let up = title, i = 0; up && i < 4; up = up.parentElement, i++) {
    const b = up.querySelector('button[aria-label="Close"]');
    if (b) { b.click(); break; }  // the assistant's side panel, not the trace's
  }
})()"""
UNFOLD = """(() => {
  const unfold = 'button[data-component-id="shared.model-trace-explorer.toggle-assessment-expanded"]';
  for (const b of document.querySelectorAll(unfold)) b.click();  // each assessment: its rationale and metadata
})()"""
OPEN_PANE = """(() => {
  const b = [...document.querySelectorAll('button')].find(b => b.innerText.trim().startsWith('Assess'));
  if (b) { b.click(); return true; }
  return false;
})()"""


def browser() -> str:
    """Debian's Chromium, or one line saying how to install it."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise SystemExit("error: no chromium on PATH: install Debian's package (apt-get install -y chromium)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(tracking_uri: str, workdir: Path) -> Iterator[str]:
    """``mlflow server`` on the store, on a free local port, until the block ends (its process stopped by id)."""
    port = free_port()
    log = open(workdir / "mlflow-server.log", "w")
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri]
    cmd += ["--default-artifact-root", str(workdir / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/health", timeout=1).status == 200:
                    break
            if proc.poll() is not None:
                raise SystemExit(f"error: mlflow server exited ({(workdir / 'mlflow-server.log').read_text()[-500:]})")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, 15)  # its own process group: the server and its workers, nothing else
        proc.wait(timeout=30)
        log.close()


@contextlib.contextmanager
def chromium(profile: Path, width: int, height: int) -> Iterator[str]:
    """Headless Chromium with a fresh profile and the DevTools protocol on a free port: yields the page's socket."""
    cmd = [browser(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]
    proc = subprocess.Popen(
        [*cmd, "--remote-debugging-port=0", "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    active = profile / "DevToolsActivePort"
    try:
        for _ in range(200):
            if active.exists() and active.read_text().strip():
                break
            time.sleep(0.1)
        port = active.read_text().split()[0]
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def look(devtools: str, url: str, expect: list[str], out: Path, timeout: float) -> str:
    """Open ``url``, open the assessments pane, wait for every string of ``expect`` in it, screenshot."""
    import aiohttp  # imported here, not at start-up: only a look needs it

    async with aiohttp.ClientSession() as s:
        page = next(t for t in await (await s.get(f"{devtools}/json")).json() if t["type"] == "page")
        async with s.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            seq = 0

            async def call(method: str, **params):
                nonlocal seq
                seq += 1
                await ws.send_json({"id": seq, "method": method, "params": params})
                while True:
                    msg = await ws.receive_json()
                    if msg.get("id") == seq:
                        return msg.get("result", {})

            async def js(expression: str):
                return (await call("Runtime.evaluate", expression=expression, returnByValue=True))["result"].get(
                    "value"
                )

            await call("Page.enable")
            await call("Page.navigate", url=url)
            text, deadline = "", time.monotonic() + timeout
            while time.monotonic() < deadline and not all(e in text for e in expect):
                await asyncio.sleep(1.0)
                text = await js(PANE)
                if not text:
                    await js(OPEN_PANE)
            await js(CLOSE_EXTRAS)
            await asyncio.sleep(1.0)
            if not await js(PANE):
                await js(OPEN_PANE)
                await asyncio.sleep(1.0)
            await js(UNFOLD)
            await asyncio.sleep(1.0)
            text = await js(PANE) or text
            shot = await call("Page.captureScreenshot", format="png")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(base64.b64decode(shot["data"]))
            return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tracking-uri", help="the store (default $MLFLOW_TRACKING_URI)")
    ap.add_argument("--server-url", help="a running MLflow server instead of starting one")
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--trace-id", required=True)
    ap.add_argument("--assessment", default="raim_hallucination")
    ap.add_argument("--expect", action="append", default=[], help="also wait for this text in the pane")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size", default="1600,1000")
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args(argv)
    import mlflow

    uri = a.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(a.experiment)
    if exp is None:
        raise SystemExit(f"error: no experiment {a.experiment!r} in {uri}")
    width, height = (int(x) for x in a.size.split(","))
    with tempfile.TemporaryDirectory(prefix="raim-ui-") as tmp:
        tmp_path = Path(tmp)
        server = contextlib.nullcontext(a.server_url) if a.server_url else mlflow_server(uri, tmp_path)
        with server as base, chromium(tmp_path / "profile", width, height) as devtools:
            url = f"{base}/#/experiments/{exp.experiment_id}/traces?selectedEvaluationId={a.trace_id}"
            text = asyncio.run(look(devtools, url, [a.assessment, *a.expect], a.out, a.timeout))
    print(text)
    shown = a.assessment in text and all(e in text for e in a.expect)
    print(f"{'shown' if shown else 'NOT shown'}: {a.assessment} on {a.trace_id}; screenshot {a.out}", file=sys.stderr)
    return 0 if shown else 1


if __name__ == "__main__":
    raise SystemExit(main())
