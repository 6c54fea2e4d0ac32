"""python-telegram-bot's HTTP requests made with aiohttp.

PTB's own ``HTTPXRequest`` goes through httpcore's connection pool, which checks
every idle pooled connection with a ``getpeername`` and a ``poll`` call each time a
request starts or ends. With the 16 connections a busy bot needs, that probing was
about 8% of the gateway's CPU under load (bench/load.py), more than building and
parsing the requests. aiohttp's pool learns that a server closed a connection from
the event loop itself and costs nothing per idle connection; the gateway already
runs on aiohttp.

``AiohttpRequest`` implements PTB's public ``BaseRequest`` interface, keeping what
``HTTPXRequest`` promises: the timeouts it is given (aiohttp has no per-write
timeout, so an upload has an overall limit instead), ``TimedOut`` for a timeout and
``NetworkError`` for any other transport failure, the body as a form, or multipart
when there are files.

Proxies come from the environment as PTB's httpx client took them (``HTTPS_PROXY``,
``HTTP_PROXY``, ``ALL_PROXY``, minus ``NO_PROXY``), looked up once per scheme and host
on a worker thread. aiohttp's own ``trust_env`` looked them up, and searched for a
``.netrc`` file, in two executor jobs on every request: under load that was a file
open per message and two thread hops on the way to each send.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any
from urllib.parse import urlencode
from urllib.request import getproxies, proxy_bypass

import aiohttp
from telegram._utils.defaultvalue import DefaultValue
from telegram._utils.types import ODVInput
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData
from yarl import URL

log = logging.getLogger("parley.channels.telegram")

DEFAULT_TIMEOUT_SECONDS = 5.0  # PTB's defaults for read, write and connect
DEFAULT_POOL_TIMEOUT_SECONDS = 1.0  # PTB's default wait for a pooled connection
DEFAULT_MEDIA_WRITE_TIMEOUT_SECONDS = 20.0
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"

# The proxy and its headers (its credentials); no proxy: (None, None).
ProxyRoute = tuple[URL | None, dict[str, str] | None]


class AiohttpRequest(BaseRequest):
    """A PTB request backend on one ``aiohttp.ClientSession`` with at most
    ``connection_pool_size`` connections."""

    def __init__(
        self,
        connection_pool_size: int = 1,
        *,
        read_timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
        write_timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
        connect_timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
        pool_timeout: float | None = DEFAULT_POOL_TIMEOUT_SECONDS,
        media_write_timeout: float | None = DEFAULT_MEDIA_WRITE_TIMEOUT_SECONDS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if connection_pool_size < 1:
            raise ValueError("connection_pool_size must be at least 1")
        self._pool_size = connection_pool_size
        self._read_timeout = read_timeout
        self._write_timeout = write_timeout
        self._connect_timeout = connect_timeout
        self._pool_timeout = pool_timeout
        self._media_write_timeout = media_write_timeout
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._routes: dict[tuple[str, str | None, int | None], ProxyRoute | ValueError] = {}

    @property
    def read_timeout(self) -> float | None:
        return self._read_timeout

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._pool_size,
                limit_per_host=0,
                ssl=self._ssl if self._ssl is not None else True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers={"User-Agent": self.USER_AGENT},
                # PTB reads the status and the body itself; an error status is no
                # exception here.
                raise_for_status=False,
            )

    async def _route(self, target: URL) -> ProxyRoute:
        """``env_proxy`` for ``target``'s scheme, host and port, looked up once: the
        environment does not change while the bot runs, and neither does a refusal."""
        key = (target.scheme, target.host, target.explicit_port)
        route = self._routes.get(key)
        if route is None:
            try:
                route = await asyncio.to_thread(env_proxy, target)
            except ValueError as exc:  # a proxy aiohttp cannot use, or bad credentials
                route = exc
            self._routes[key] = route
        if isinstance(route, ValueError):
            raise NetworkError(f"proxy from the environment not usable: {route}")
        return route

    async def shutdown(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        write_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        connect_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        pool_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        session = self._session
        if session is None or session.closed:
            raise RuntimeError("This AiohttpRequest is not initialized!")
        files = request_data.multipart_data if request_data is not None else None
        read = _given(read_timeout, self._read_timeout)
        connect = _given(connect_timeout, self._connect_timeout)
        pool = _given(pool_timeout, self._pool_timeout)
        write = _given(write_timeout, self._media_write_timeout if files else self._write_timeout)
        timeout = aiohttp.ClientTimeout(
            # aiohttp counts the wait for a pooled connection into ``connect``.
            connect=None if connect is None or pool is None else connect + pool,
            sock_connect=connect,
            sock_read=read,
            # No per-write limit in aiohttp: an upload gets all its phases as a whole,
            # so that a stalled one cannot hold its lane for ever.
            total=_sum(write, read, connect, pool) if files else None,
        )
        body: aiohttp.FormData | bytes | None = None
        headers: dict[str, str] = {}
        if request_data is not None:
            body = _form(request_data.json_parameters, files) if files else None
            if body is None and request_data.json_parameters:
                # Encoded here: given a dict, aiohttp builds a multipart writer (and a
                # random boundary) for every request, only to send it urlencoded.
                body = urlencode(request_data.json_parameters).encode("ascii")
                headers["Content-Type"] = FORM_CONTENT_TYPE
        target = URL(url)
        proxy, credentials = await self._route(target)
        # aiohttp sends proxy headers on a tunnel's CONNECT only: a plain HTTP request
        # through a proxy carries its Proxy-Authorization itself.
        tunnel = target.scheme == "https"
        if credentials is not None and not tunnel:
            headers.update(credentials)
        try:
            async with session.request(
                method,
                target,
                data=body,
                timeout=timeout,
                allow_redirects=False,  # httpx, PTB's default, follows no redirect either
                proxy=proxy,
                proxy_headers=credentials if tunnel else None,
                headers=headers or None,
            ) as response:
                return response.status, await response.read()
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError is one too
            raise TimedOut from exc
        except aiohttp.ClientError as exc:
            raise NetworkError(f"aiohttp.{type(exc).__name__}: {exc}") from exc


def env_proxy(url: URL) -> ProxyRoute:
    """The proxy the environment names for ``url``: the scheme's own variable, else
    ``ALL_PROXY``; none for a host (or host:port) ``NO_PROXY`` lists. A value without a
    scheme is an HTTP proxy, as httpx reads it. Credentials in the proxy's URL go as its
    ``Proxy-Authorization`` (a ``.netrc`` file is not read). Blocking: the stdlib may
    read system settings.

    Raises ValueError for a proxy aiohttp cannot use: only HTTP proxies are. An
    ``ALL_PROXY`` of another kind (often SOCKS, set for other tools) is passed over with
    a warning instead, as it was before ``ALL_PROXY`` was read at all."""
    if url.host is None:
        return None, None
    authority = f"{url.host}:{url.explicit_port}" if url.explicit_port else url.host
    if proxy_bypass(authority):
        return None, None
    proxies = getproxies()
    own = proxies.get(url.scheme)
    raw = own or proxies.get("all")
    if not raw:
        return None, None
    proxy = URL(raw if "://" in raw else f"http://{raw}")
    if proxy.scheme != "http":
        if own:
            raise ValueError(
                f"the {url.scheme} proxy from the environment is a {proxy.scheme} proxy; "
                "only http:// proxies are supported"
            )
        log.warning("ALL_PROXY is a %s proxy, which is not supported: not used", proxy.scheme)
        return None, None
    if not proxy.user:
        return proxy, None
    credentials = aiohttp.encode_basic_auth(proxy.user, proxy.password or "")
    return proxy.with_user(None), {"Proxy-Authorization": credentials}


def _given(value: ODVInput[float], default: float | None) -> float | None:
    return default if isinstance(value, DefaultValue) else value


def _sum(*limits: float | None) -> float | None:
    return None if any(limit is None for limit in limits) else sum(x or 0.0 for x in limits)


def _form(parameters: dict[str, str], files: dict[str, Any]) -> aiohttp.FormData:
    """The multipart body: every parameter as a field, every file as a part with its
    name and type (PTB gives ``(file name, bytes or file object, mime type)``)."""
    form = aiohttp.FormData(quote_fields=False)
    for name, value in parameters.items():
        form.add_field(name, value)
    for name, upload in files.items():
        filename, content, mime_type = upload
        form.add_field(name, content, filename=filename, content_type=mime_type)
    return form
