"""The context-overflow pattern table."""

from __future__ import annotations

import pytest

from parley.core.providers.overflow import OverflowMatch, match_overflow

CASES: list[tuple[str, dict, OverflowMatch | None]] = [
    # Anthropic
    (
        "prompt is too long: 203284 tokens > 200000 maximum",
        {"status": 400},
        OverflowMatch(203284, 200000),
    ),
    (
        "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again",
        {"status": 400},
        OverflowMatch(209573, 200000),
    ),
    (
        "Request exceeds the maximum allowed number of bytes.",
        {"status": 413, "error_type": "request_too_large"},
        OverflowMatch(),
    ),
    # OpenAI
    (
        "This model's maximum context length is 8192 tokens. However, your messages resulted "
        "in 9000 tokens. Please reduce the length of the messages.",
        {"status": 400, "code": "context_length_exceeded"},
        OverflowMatch(9000, 8192),
    ),
    (
        "This model's maximum context length is 128,000 tokens. However, you requested "
        "130,500 tokens (129,000 in the messages, 1,500 in the completion).",
        {"status": 400},
        OverflowMatch(130500, 128000),
    ),
    (
        "Your input exceeds the context window of this model.",
        {"status": 400, "code": "context_length_exceeded"},
        OverflowMatch(),
    ),
    # vLLM, newer wording
    (
        "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum "
        "context length is 4096 tokens and your request has 3500 input tokens "
        "(1000 > 4096 - 3500).",
        {"status": 400},
        OverflowMatch(4500, 4096),
    ),
    # TGI
    (
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
        "Given: 4000 `inputs` tokens and 500 `max_new_tokens`",
        {"status": 422},
        OverflowMatch(4500, 4096),
    ),
    # llama.cpp: numbers beside the message
    (
        "the request exceeds the available context size, try increasing it",
        {
            "status": 400,
            "error_type": "exceed_context_size_error",
            "body": {"n_prompt_tokens": 5000, "n_ctx": 4096},
        },
        OverflowMatch(5000, 4096),
    ),
    ("", {"status": 400, "error_type": "exceed_context_size_error"}, OverflowMatch()),
    # Generic text from some other server
    ("Error: maximum context length exceeded", {"status": 400}, OverflowMatch()),
    ("Input is too long for requested model.", {"status": 400}, OverflowMatch()),
    # A stream error event (status 200 or unknown) is judged on its words.
    ("prompt is too long: 12 tokens > 10 maximum", {"status": 200}, OverflowMatch(12, 10)),
    ("prompt is too long: 12 tokens > 10 maximum", {}, OverflowMatch(12, 10)),
    # Not overflow
    ("max_tokens: Field required", {"status": 400}, None),
    ("messages: roles must alternate", {"status": 400}, None),
    ("Rate limit reached: maximum context length is irrelevant here", {"status": 429}, None),
    ("prompt is too long: 1 tokens > 0 maximum", {"status": 500}, None),
    ("invalid x-api-key", {"status": 401, "error_type": "authentication_error"}, None),
]


@pytest.mark.parametrize(("message", "kwargs", "expected"), CASES)
def test_overflow_table(message: str, kwargs: dict, expected: OverflowMatch | None) -> None:
    assert match_overflow(message, **kwargs) == expected
