"""Run ``llama-server`` on loopback and ask it for completions: the consumer check and the llama.cpp bench use it.

:class:`LlamaServer` starts the binary on ``127.0.0.1`` and a free port, waits for ``/health``, logs to a file and
stops the process (and only it) on exit. :meth:`LlamaServer.complete` posts token ids to ``/completion`` at
temperature 0 and returns the server's tokens with its own timings, including the draft counts of speculative
decoding (``draft_n``, ``draft_n_accepted``). Only the standard library is used.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class LlamaServerError(RuntimeError):
    """llama-server did not start, died, or answered a request with an error."""


@dataclass
class Completion:
    """One ``/completion`` answer: the new tokens and llama-server's timings of them."""

    tokens: list[int]
    text: str
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def drafted(self) -> int:
        return int(self.timings.get("draft_n", 0))

    @property
    def accepted(self) -> int:
        return int(self.timings.get("draft_n_accepted", 0))

    @property
    def tokens_per_s(self) -> float:
        return float(self.timings.get("predicted_per_second", 0.0))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """``llama-server -m MODEL [extra args]`` on 127.0.0.1, as a context manager.

    Args:
        binary: the ``llama-server`` executable.
        model: the base GGUF file.
        args: further arguments (``-md draft.gguf --spec-type draft-eagle3 ...``).
        threads: ``-t`` (and ``-tb``; the draft's ``-td`` too when a draft is given).
        context: ``-c``.
        log: file for the server's output (default: ``os.devnull``).
        startup_timeout: seconds to wait for ``/health``.
        parallel: ``-np``, the slots decoded together (concurrent requests).
        port: a fixed port (default: a free one at each start); a restarted server keeps it.
    """

    def __init__(
        self,
        binary: str | Path,
        model: str | Path,
        args: list[str] | None = None,
        threads: int = 1,
        context: int = 4096,
        log: str | Path | None = None,
        startup_timeout: float = 180.0,
        parallel: int = 1,
        port: int | None = None,
    ) -> None:
        self.binary = str(binary)
        self.model = str(model)
        self.args = list(args or [])
        self.threads = threads
        self.context = context
        self.log = Path(log) if log else None
        self.startup_timeout = startup_timeout
        self.parallel = parallel
        self.port = port or 0
        self.fixed_port = port is not None
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        threads = ["-t", str(self.threads), "-tb", str(self.threads)]
        if "-md" in self.args:
            threads += ["-td", str(self.threads), "-tbd", str(self.threads)]
        return [
            self.binary, "-m", self.model, "--host", "127.0.0.1", "--port", str(self.port), "-c", str(self.context),
            "-np", str(self.parallel), "--no-webui", *threads, *self.args,
        ]  # fmt: skip

    def start(self) -> LlamaServer:
        if not Path(self.binary).is_file():
            raise LlamaServerError(f"no llama-server binary at {self.binary}")
        if not self.fixed_port:
            self.port = free_port()
        out = open(self.log, "ab") if self.log else open(os.devnull, "wb")  # noqa: SIM115 (closed in stop)
        self._out = out
        self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise LlamaServerError(f"llama-server exited with {self.process.returncode} at start (log: {self.log})")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        self.stop()
        raise LlamaServerError(f"llama-server did not answer /health within {self.startup_timeout:.0f} s")

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (in-flight requests lose their connection)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.stop()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if getattr(self, "_out", None) is not None:
            self._out.close()
            self._out = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def post(self, path: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise LlamaServerError(f"{path} answered {error.code}: {error.read()[:500]!r}") from error

    def complete(
        self, prompt: list[int], max_new_tokens: int, timeout: float = 600.0, cache_prompt: bool = False
    ) -> Completion:
        """Greedy completion of token ids (the server adds no BOS to an id prompt), timings included; with
        ``cache_prompt`` the slot reuses the longest cached prefix of ``prompt``."""
        body = {
            "prompt": prompt,
            "n_predict": max_new_tokens,
            "temperature": 0.0,
            "top_k": 1,
            "samplers": ["top_k"],
            "return_tokens": True,
            "cache_prompt": cache_prompt,
            "ignore_eos": False,
        }
        answer = self.post("/completion", body, timeout)
        return Completion(list(answer.get("tokens") or []), answer.get("content", ""), answer.get("timings") or {})

    def tokenize(self, text: str) -> list[int]:
        return list(self.post("/tokenize", {"content": text, "add_special": False})["tokens"])
