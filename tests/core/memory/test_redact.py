from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.core.memory.redact import REDACTED, redact_secrets

# Fake credentials in each provider's shape (none of them is, or was, a real key).
ANTHROPIC = "sk-ant-api03-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" * 2
OPENAI = "sk-" + "T3BlbkFJ" * 6
OPENAI_PROJECT = "sk-proj-" + "aB1cD2eF3gH4" * 4
GITHUB_CLASSIC = "ghp_" + "a1B2c3D4e5F6g7H8i9J0" * 2
GITHUB_OAUTH = "gho_" + "Z9y8X7w6V5u4T3s2R1q0" * 2
GITHUB_SERVER = "ghs_" + "Q1w2E3r4T5y6U7i8O9p0" * 2
GITHUB_FINE = "github_pat_11ABCDEFG0" + "abcdefghijklmnopqrstuv_0123456789" * 2
SLACK_BOT = "xoxb-1234567890-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx"
SLACK_USER = "xoxp-1234567890-1234567890-1234567890123-" + "0123456789abcdef" * 2
AWS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GOOGLE = "AIzaSyD-" + "9tSrke72PouQMnMX-a7eZSW0jkFMBWY"
TELEGRAM = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
DISCORD = "MTIzNDU2Nzg5MDEyMzQ1Njc4OQ.GhIjKl." + "abcdefghijklmnopqrstuvwxyz0123456789"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
PEM_BODY = "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2\nKOlqmP9mrYu0a0iTz8oF3Jkx5yJ6T8s2rYq\n"


@pytest.mark.parametrize(
    ("template", "secret"),
    [
        ("my anthropic key is {} thanks", ANTHROPIC),
        ("OPENAI_API_KEY={}", OPENAI),
        ("use {} for the project", OPENAI_PROJECT),
        ("git remote token {}.", GITHUB_CLASSIC),
        ("oauth: {}", GITHUB_OAUTH),
        ("server token ({})", GITHUB_SERVER),
        ("fine-grained {} here", GITHUB_FINE),
        ("slack bot {}", SLACK_BOT),
        ("slack user {}", SLACK_USER),
        ("aws id {} in the config", AWS_KEY_ID),
        ("maps key {}!", GOOGLE),
        ("the bot token is {}", TELEGRAM),
        ("discord: {}", DISCORD),
        ("cookie session={}", JWT),
        ("jwt {} expires soon", JWT),
        ("Authorization: Bearer {}", "abc123DEF456ghi789"),
        ("curl -H 'authorization: bearer {}'", "tok_live.9f8e7d6c5b4a"),
    ],
)
def test_known_credentials_are_replaced(template: str, secret: str) -> None:
    assert redact_secrets(template.format(secret)) == template.format(REDACTED)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=hunter2", "password=[redacted]"),
        ("DB_PASSWORD = correct horse", "DB_PASSWORD = [redacted] horse"),
        ("export GITHUB_TOKEN=abc", "export GITHUB_TOKEN=[redacted]"),
        ("api_key: 'xyz'", "api_key: '[redacted]'"),
        ('{"apiKey": "p@ss word", "user": "ann"}', '{"apiKey": "[redacted]", "user": "ann"}'),
        ("client_secret: s3cr3t-value", "client_secret: [redacted]"),
        ("my password: hunter2 ok", "my password: [redacted] ok"),
        ("token=abc&user=ann", "token=[redacted]&user=ann"),
        ("aws_secret_access_key = " + AWS_SECRET, "aws_secret_access_key = [redacted]"),
        (
            "AWS_SECRET_ACCESS_KEY: " + AWS_SECRET + "\nnext",
            "AWS_SECRET_ACCESS_KEY: [redacted]\nnext",
        ),
        (
            '{"aws_secret_access_key": "' + AWS_SECRET + '"}',
            '{"aws_secret_access_key": "[redacted]"}',
        ),
        (
            "[default]\naws_secret_access_key=" + AWS_SECRET,
            "[default]\naws_secret_access_key=[redacted]",
        ),
        (
            "postgres://admin:s3cret@db.internal:5432/app",
            "postgres://admin:[redacted]@db.internal:5432/app",
        ),
        ("see https://bob:pa:ss@example.com/x", "see https://bob:[redacted]@example.com/x"),
    ],
)
def test_assignments_and_urls_keep_their_key(text: str, expected: str) -> None:
    assert redact_secrets(text) == expected


def test_private_key_block_keeps_its_armour_lines() -> None:
    text = (
        "before\n-----BEGIN RSA PRIVATE KEY-----\n"
        + PEM_BODY
        + "-----END RSA PRIVATE KEY-----\nafter"
    )
    assert redact_secrets(text) == (
        "before\n-----BEGIN RSA PRIVATE KEY-----\n[redacted]\n-----END RSA PRIVATE KEY-----\nafter"
    )


def test_private_key_on_one_line_and_without_an_end_is_redacted() -> None:
    one_line = "k: -----BEGIN PRIVATE KEY----- MIIEvQIBADANBg -----END PRIVATE KEY----- done"
    assert redact_secrets(one_line) == (
        "k: -----BEGIN PRIVATE KEY----- [redacted] -----END PRIVATE KEY----- done"
    )
    truncated = "-----BEGIN OPENSSH PRIVATE KEY-----\n" + PEM_BODY
    out = redact_secrets(truncated)
    assert out == "-----BEGIN OPENSSH PRIVATE KEY-----\n[redacted]\n"


def test_public_key_and_certificate_are_not_secrets() -> None:
    text = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A\n-----END PUBLIC KEY-----"
    assert redact_secrets(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "Order ORD-2024-1187 shipped on 2024-03-05 to Berlin.",
        "Connect to db.internal:5432 and then to cache.local:6379.",
        "Request id 123e4567-e89b-12d3-a456-426614174000 failed.",
        "Fixed in da39a3ee5e6b4b0d3255bfef95601890afd80709 (see 1a2b3c4).",
        "Call me at +1 (555) 123-4567 or 030 1234567 after 18:30.",
        "Meeting at 2023-05-08T13:56:00Z, ratio 3:2, score 10:7.",
        "Set max_tokens=400 and token_count: 5, tokens_used = 12.",
        "Secret: we're planning a surprise party. Token: nice!",
        "He was the bearer of bad news about bearer instruments.",
        "The bearer ORD-2024-1187 and bearer 2024-02-29 and Bearer responsibilities.",
        "The task-list skill is risky; sk-learn is a typo of scikit-learn.",
        "We ran a risk-assessment-for-the-quarterly-review today.",
        "Mail ann@example.com or visit https://example.com:8080/a/b?q=1.",
        "https://user@example.com/repo has no password in it.",
        "Keep the password field empty: password=\nthen submit.",
        "Use the [redacted] marker itself: password=[redacted] token: [redacted]",
    ],
)
def test_ordinary_text_is_untouched(text: str) -> None:
    assert redact_secrets(text) == text


def test_empty_text() -> None:
    assert redact_secrets("") == ""


# 1 MB inputs shaped to make a backtracking pattern go quadratic or worse. They pin the
# result; a pattern that backtracked catastrophically would never get to the assertion.
@pytest.mark.parametrize(
    ("hostile", "expected"),
    [
        ("a" * 1_000_000, None),
        ("sk-" * 333_333, REDACTED),
        ("eyJa." * 200_000, None),
        ("eyJhbGciOi." * 90_000, "[redacted]." * 30_000),
        ("a://b:" * 160_000, None),
        ("x://" + "u:" * 400_000 + "no-at-sign", None),
        ("token=" * 160_000, "token=[redacted]"),
        ("password: " * 100_000, None),
        ("passwordpassword" * 60_000, None),
        ("Bearer " * 140_000, None),
        ("1234567890:" * 90_000, None),
        (("M" * 24 + ".") * 40_000, None),
        ("-----BEGIN PRIVATE KEY-----" * 30_000, None),
        ("a-" * 500_000, None),
    ],
)
def test_hostile_megabyte_inputs_finish_with_the_expected_result(
    hostile: str, expected: str | None
) -> None:
    out = redact_secrets(hostile)
    if expected is not None:
        assert out == expected
    elif hostile.startswith("-----BEGIN"):
        # Every BEGIN line but the first is inside the first (unterminated) block.
        assert out == "-----BEGIN PRIVATE KEY-----" + REDACTED
    else:
        assert out == hostile


def test_hostile_token_run_is_redacted_once() -> None:
    out = redact_secrets("sk-" + "A" * 1_000_000 + " tail")
    assert out == REDACTED + " tail"


_SECRETS = st.sampled_from(
    [ANTHROPIC, OPENAI, GITHUB_CLASSIC, SLACK_BOT, AWS_KEY_ID, GOOGLE, TELEGRAM, DISCORD, JWT]
)
_FILLER = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_PIECES = st.one_of(
    _FILLER,
    _SECRETS,
    st.sampled_from(["password=", "token: ", "Bearer ", "://u:", "@", " ", "\n", "-----"]),
)


@settings(max_examples=300)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_redaction_is_idempotent_and_only_shrinks_apart_from_markers(text: str) -> None:
    once = redact_secrets(text)
    assert redact_secrets(once) == once
    assert len(once.replace(REDACTED, "")) <= len(text)


@settings(max_examples=200)
@given(st.lists(_SECRETS, min_size=1, max_size=4), st.lists(_FILLER, min_size=5, max_size=5))
def test_every_planted_secret_disappears(secrets: list[str], fillers: list[str]) -> None:
    # Surround each secret with spaces: glued to arbitrary letters a token is not a token.
    text = "".join(f"{f} {s} " for f, s in zip(fillers, secrets, strict=False)) + fillers[-1]
    out = redact_secrets(text)
    for secret in secrets:
        assert secret not in out


_WORDS = st.sampled_from(
    re.findall(
        r"\S+",
        "the a meeting moved to Tuesday order ORD-2024-1187 shipped host db.internal:5432 "
        "call +1-555-0100 at 14:30 on 2024-02-29 ok sure thanks Caroline Melanie token "
        "password secret key api bearer of news 42 3.14 (see notes) — café 東京 ✓",
    )
)


@settings(max_examples=200)
@given(st.lists(_WORDS, max_size=30), st.sampled_from([" ", ", ", ". ", "\n"]))
def test_prose_built_from_ordinary_words_is_unchanged(words: list[str], sep: str) -> None:
    text = sep.join(words)
    assert redact_secrets(text) == text
