"""What an OpenAI-compatible server says about its model: the context window, tool support.

Self-hosted servers publish the window they really run with, each in its own place:

- llama.cpp: ``GET {root}/props`` → ``default_generation_settings.n_ctx`` (the window of
  one slot, what a request gets), ``modalities.vision`` (a vision projector is loaded)
  and ``chat_template_caps.supports_tools`` (whether the
  model's chat template can take tool schemas). ``GET {base}/models`` also carries
  ``data[].meta.n_ctx``, but that is the whole context shared by every slot, so it is only
  the fallback when ``/props`` does not answer.
- vLLM: ``GET {base}/models`` → ``data[].max_model_len`` for the model id.
- Ollama: ``POST {root}/api/show {"model": id}``. The window Ollama runs with is its
  ``num_ctx`` option (in the ``parameters`` text when the model file sets it, else the
  server's default, 4096 in current Ollama), not the trained length in
  ``model_info["<arch>.context_length"]``: the effective window is the smaller of the two.
  ``capabilities`` lists ``"tools"`` when the template supports them.

``base`` is the configured base URL (``/v1`` included), ``root`` the server root (the
base URL without its trailing ``/v1``). OpenAI itself publishes no window and is not
probed.

Parsing is strict about what it accepts and tolerant of everything else: a figure that
is not a positive integer, a flag that is not a boolean, JSON that does not parse, a 404
or an unreachable server each mean "not said", never an error. Every probe is bounded;
``discover_openai_compat`` never raises for anything the server does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import aiohttp

from parley.core.providers.base import ModelFacts

log = logging.getLogger("parley.core.providers.discovery")

DEFAULT_DISCOVERY_TIMEOUT_SECONDS = 5.0
# Ollama's num_ctx when neither the model file nor the request sets it (Ollama 0.6 on).
# A server started with OLLAMA_CONTEXT_LENGTH runs with another one, which the API does
# not show; the source string says when this default was assumed.
OLLAMA_DEFAULT_NUM_CTX = 4096
# /props carries the chat template and /api/show the licence: tens of KiB. Anything far
# bigger is not a props answer.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
# A window figure above this is garbage, not a model.
MAX_PLAUSIBLE_WINDOW = 100_000_000

_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)\s*$", re.M)


# -- strict readers ---------------------------------------------------------------------


def _window(value: object) -> int | None:
    """A window figure: a positive integer (a bool is not one), else not said."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 < value <= MAX_PLAUSIBLE_WINDOW else None


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _model_entries(payload: object) -> list[Mapping[str, Any]]:
    """The ``data`` list of a ``/v1/models`` answer, objects only."""
    data = _mapping(payload).get("data")
    if not isinstance(data, list):
        return []
    return [entry for entry in data if isinstance(entry, Mapping)]


def _pick_model(entries: list[Mapping[str, Any]], model: str) -> Mapping[str, Any] | None:
    """The entry for ``model`` (by id, vLLM's ``root`` or llama.cpp's aliases), or the
    only entry when the server serves one model whatever the id says."""
    for entry in entries:
        aliases = entry.get("aliases")
        names = [entry.get("id"), entry.get("root")]
        if isinstance(aliases, list):
            names.extend(aliases)
        if model and any(isinstance(name, str) and name == model for name in names):
            return entry
    return entries[0] if len(entries) == 1 else None


# -- parsers, one per answer --------------------------------------------------------------


def parse_llamacpp_props(payload: object) -> ModelFacts | None:
    """llama.cpp's ``/props``; ``None`` when it is not one."""
    settings = _mapping(_mapping(payload).get("default_generation_settings"))
    window = _window(settings.get("n_ctx"))
    if window is None:
        return None
    caps = _mapping(_mapping(payload).get("chat_template_caps"))
    modalities = _mapping(_mapping(payload).get("modalities"))
    return ModelFacts(
        context_window=window,
        source="llama.cpp /props",
        supports_tools=_flag(caps.get("supports_tools")),
        # A server started with a vision projector (--mmproj) says so.
        supports_vision=_flag(modalities.get("vision")),
        prompt_only_window=True,
        server="llama.cpp",
    )


def parse_models(payload: object, model: str) -> ModelFacts | None:
    """A ``/v1/models`` answer: vLLM's ``max_model_len``, else llama.cpp's ``meta.n_ctx``;
    ``None`` when it says neither for ``model``."""
    entry = _pick_model(_model_entries(payload), model)
    if entry is None:
        return None
    window = _window(entry.get("max_model_len"))
    if window is not None:
        return ModelFacts(
            context_window=window,
            source="vllm /v1/models",
            prompt_only_window=False,  # vLLM refuses prompt + max_tokens over the window
            server="vllm",
        )
    window = _window(_mapping(entry.get("meta")).get("n_ctx"))
    if window is not None and entry.get("owned_by") == "llamacpp":
        return ModelFacts(
            context_window=window,
            source="llama.cpp /v1/models",
            prompt_only_window=True,
            server="llama.cpp",
        )
    return None


def _trained_length(model_info: Mapping[str, Any]) -> int | None:
    arch = model_info.get("general.architecture")
    if isinstance(arch, str) and arch:
        return _window(model_info.get(f"{arch}.context_length"))
    # No architecture named: a single ``*.context_length`` key is still unambiguous.
    found = [v for k, v in model_info.items() if str(k).endswith(".context_length")]
    return _window(found[0]) if len(found) == 1 else None


def parse_ollama_show(payload: object) -> ModelFacts | None:
    """Ollama's ``/api/show``; ``None`` when it is not one."""
    body = _mapping(payload)
    model_info = body.get("model_info")
    parameters = body.get("parameters")
    capabilities = body.get("capabilities")
    if not isinstance(model_info, Mapping) and not isinstance(capabilities, list):
        return None  # not an /api/show answer at all
    trained = _trained_length(_mapping(model_info))
    set_ctx = None
    if isinstance(parameters, str) and (found := _NUM_CTX.search(parameters)):
        set_ctx = _window(int(found.group(1)))
    if set_ctx is not None:
        window, how = set_ctx, "num_ctx"
    else:
        window, how = OLLAMA_DEFAULT_NUM_CTX, f"default num_ctx {OLLAMA_DEFAULT_NUM_CTX}"
    if trained is not None and trained < window:
        window, how = trained, "trained length"
    supports_tools = supports_vision = None
    if isinstance(capabilities, list):
        supports_tools = "tools" in capabilities
        supports_vision = "vision" in capabilities
    return ModelFacts(
        context_window=window,
        source=f"ollama /api/show ({how})",
        supports_tools=supports_tools,
        supports_vision=supports_vision,
        prompt_only_window=True,
        server="ollama",
    )


# -- probing ----------------------------------------------------------------------------


def server_root(base_url: str) -> str:
    """The server root: the base URL without its trailing ``/v1``."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def is_openai_itself(base_url: str | None) -> bool:
    return base_url is None or "api.openai.com" in base_url


class _Prober:
    """GET/POST of small JSON answers; every failure is ``None``."""

    def __init__(self, session: aiohttp.ClientSession, headers: Mapping[str, str]) -> None:
        self.session = session
        self.headers = dict(headers)

    async def json(self, method: str, url: str, body: object = None) -> object:
        try:
            async with self.session.request(
                method, url, json=body, headers=self.headers, allow_redirects=False
            ) as response:
                if response.status != 200:
                    log.debug("%s %s: HTTP %d", method, url, response.status)
                    return None
                raw = bytearray()
                async for piece in response.content.iter_chunked(64 * 1024):
                    raw += piece
                    if len(raw) > MAX_ANSWER_BYTES:
                        log.debug("%s %s: answer over %d bytes", method, url, MAX_ANSWER_BYTES)
                        return None
            return json.loads(bytes(raw))
        except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError) as exc:
            log.debug("%s %s: %s: %s", method, url, type(exc).__name__, exc)
            return None


async def probe_llamacpp(prober: _Prober, root: str) -> ModelFacts | None:
    return parse_llamacpp_props(await prober.json("GET", f"{root}/props"))


async def probe_models(prober: _Prober, base: str, model: str) -> ModelFacts | None:
    return parse_models(await prober.json("GET", f"{base}/models"), model)


async def probe_ollama(prober: _Prober, root: str, model: str) -> ModelFacts | None:
    # ``name`` is what Ollama before 0.4 read; later ones read ``model`` and ignore it.
    answer = await prober.json("POST", f"{root}/api/show", {"model": model, "name": model})
    return parse_ollama_show(answer)


async def discover_openai_compat(
    base_url: str | None,
    model: str,
    *,
    api_key: str | None = None,
    seconds: float = DEFAULT_DISCOVERY_TIMEOUT_SECONDS,
) -> ModelFacts:
    """What the server at ``base_url`` says about ``model``; empty facts when it says
    nothing (or cannot be reached within ``seconds``).

    The probes run side by side and are read in order of trust: llama.cpp's ``/props``
    (its per-slot window is exact), then Ollama's ``/api/show`` (Ollama's ``/v1/models``
    says nothing of the window), then ``/v1/models`` (vLLM, or llama.cpp without
    ``/props``). The first that says something decides, and the rest are cancelled.
    """
    if base_url is None or is_openai_itself(base_url):
        return ModelFacts(prompt_only_window=False, server="openai")
    base = base_url.rstrip("/")
    root = server_root(base)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = aiohttp.ClientTimeout(total=seconds, connect=seconds)
    # trust_env: reach the server the way the SDK's client does (it honours *_PROXY).
    async with aiohttp.ClientSession(timeout=limits, trust_env=True) as session:
        prober = _Prober(session, headers)
        probes = [
            asyncio.ensure_future(probe_llamacpp(prober, root)),
            asyncio.ensure_future(probe_ollama(prober, root, model)),
            asyncio.ensure_future(probe_models(prober, base, model)),
        ]
        try:
            async with asyncio.timeout(seconds):
                for probe in probes:
                    facts = await probe
                    if facts is not None:
                        return facts
        except TimeoutError:
            log.debug("discovery at %s took over %.1f s", base, seconds)
        finally:
            for probe in probes:
                probe.cancel()
            # Let the cancelled probes unwind before their session closes.
            await asyncio.gather(*probes, return_exceptions=True)
    return ModelFacts()
