"""Start, wait for and stop SGLang server processes (used by launch/, bench/ and the server tests).

Each server runs in its own process group (``start_new_session``), so ``stop()`` ends the launcher
and every process it spawned (scheduler, detokenizer) together.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct"


def sse_events(response):
    """The JSON events of a streamed SGLang/OpenAI response (``data: {...}`` lines, up to ``[DONE]``)."""
    for line in response.iter_lines():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def preset_args(kind: str, *, device: str = "cpu", draft: str | None = None, num_draft_tokens: int | None = None,
                max_total_tokens: int | None = None, dtype: str | None = None) -> list[str]:
    """Server flags for ``kind`` in {"baseline", "domino", "ngram"} on ``device`` in {"cpu", "cuda"}."""
    args: list[str] = []
    if device == "cpu":
        args += ["--device", "cpu", "--max-total-tokens", str(max_total_tokens or 16384), "--sleep-on-idle"]
        args += ["--dtype", dtype or "float32"]
    else:
        if max_total_tokens:
            args += ["--max-total-tokens", str(max_total_tokens)]
        if dtype:
            args += ["--dtype", dtype]
    if kind == "domino":
        if not draft:
            raise ValueError("a DOMINO server needs a draft checkpoint (--draft)")
        args += ["--speculative-algorithm", "DOMINO", "--speculative-draft-model-path", str(draft)]
        if num_draft_tokens:
            args += ["--speculative-num-draft-tokens", str(num_draft_tokens)]
    elif kind == "ngram":
        args += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(num_draft_tokens or 8)]
    elif kind != "baseline":
        raise ValueError(f"unknown server kind {kind!r}")
    return args


class PortInUse(RuntimeError):
    """The server could not bind its HTTP port: something took it after ``free_port`` chose it (another
    process, or the internal ports an SGLang server picks for itself)."""


@dataclasses.dataclass
class Server:
    model: str
    port: int
    args: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    log_path: str | None = None
    host: str = "127.0.0.1"
    python: str = sys.executable
    proc: subprocess.Popen | None = None
    log_offset: int = 0  # where this start's output begins in log_path (logs are appended to)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def command(self) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", "--model-path", self.model, "--host", self.host,
                "--port", str(self.port), *self.args]

    def start(self) -> "Server":
        env = dict(os.environ)
        if "--device" in self.args and self.args[self.args.index("--device") + 1] == "cpu":
            env.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        env.update(self.env)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.log_offset = log.tell() if self.log_path else 0
        self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, TimeoutError):
            return False

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])

    def _port_taken(self) -> bool:
        if not self.log_path or not os.path.exists(self.log_path):
            return False
        with open(self.log_path, "rb") as f:
            f.seek(self.log_offset)
            return b"error while attempting to bind on address" in f.read()

    def wait_healthy(self, timeout: float = 600) -> "Server":
        """Wait for /health; a server that exits, or cannot bind its port (``PortInUse``, the server
        stopped), raises at once with the end of its log."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.alive():
                raise RuntimeError(f"server on port {self.port} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return self
            if self._port_taken():  # uvicorn says so and SGLang keeps running without HTTP
                tail = self.log_tail()
                self.stop()
                raise PortInUse(f"server could not bind port {self.port}:\n{tail}")
            time.sleep(2)
        raise TimeoutError(f"server on port {self.port} not healthy after {timeout}s:\n{self.log_tail()}")

    def wait_exit(self, timeout: float = 300) -> int:
        """For servers expected to fail at startup: their exit code."""
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 30) -> None:
        if self.proc is None:
            return
        try:
            pgid = os.getpgid(self.proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    continue
                # children of the group may outlive the launcher briefly
                deadline = time.time() + wait
                while time.time() < deadline and _group_alive(pgid):
                    time.sleep(0.5)
                if not _group_alive(pgid):
                    break
        self.proc = None

    def get(self, path: str, timeout: float = 30):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return json.loads(r.read())


def start_all(servers: list[Server], timeout: float = 600, attempts: int = 3) -> list[Server]:
    """Start the servers side by side and wait until each is healthy; one whose port was taken meanwhile
    (``PortInUse``) starts again on a fresh ``free_port()``, up to ``attempts`` times in all."""
    for server in servers:
        server.start()
    for server in servers:
        for attempt in range(attempts):
            try:
                server.wait_healthy(timeout)
                break
            except PortInUse:
                if attempt == attempts - 1:
                    raise
                server.port = free_port()
                server.start()
    return servers


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies still count for killpg; check /proc for live members
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
            except (OSError, IndexError, ValueError):
                continue
    return False
