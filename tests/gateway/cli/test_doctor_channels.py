"""`parley doctor` asks each platform whether it accepts the configured bot tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.gateway.cli.doctor_checks import _check_channels, _check_pairing
from parley.gateway.config import load_config
from tests.channels.discord_support import TOKEN as DISCORD_TOKEN
from tests.channels.discord_support import fake_discord
from tests.fakes.telegram_api import FakeTelegram


async def test_tokens_are_checked_against_each_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with FakeTelegram() as telegram, fake_discord(monkeypatch) as discord:
        telegram.add_bot("111:good", "good_bot")
        env = {
            "PARLEY_HOME": str(tmp_path),
            "TELEGRAM_BOT_TOKEN": "111:good",
            "TELEGRAM_API_BASE_URL": telegram.base_url,
            "PARLEY_CHANNELS__TELEGRAM__ACCOUNTS__OLD__TOKEN": "222:revoked",
            "PARLEY_CHANNELS__TELEGRAM__ACCOUNTS__OLD__API_BASE_URL": telegram.base_url,
            "DISCORD_BOT_TOKEN": DISCORD_TOKEN,
            "PARLEY_CHANNELS__DISCORD__API_BASE_URL": discord.api_base,
        }
        findings = {f.check: f for f in await _check_channels(load_config(env=env))}
    assert findings["telegram:default"].severity == "ok"
    assert "@good_bot" in findings["telegram:default"].detail
    assert "replies stream: partial" in findings["telegram:default"].detail
    assert findings["telegram:old"].severity == "error"
    assert "refused (HTTP 401)" in findings["telegram:old"].detail
    assert findings["discord:default"].severity == "ok"
    assert "parley" in findings["discord:default"].detail
    # Nothing stored yet: no one can be waiting for pairing.
    assert (await _check_pairing(load_config(env=env))).severity == "ok"


async def test_an_unreachable_api_is_reported(tmp_path: Path) -> None:
    async with FakeTelegram() as telegram:
        base = telegram.base_url
    env = {"PARLEY_HOME": str(tmp_path), "TELEGRAM_BOT_TOKEN": "1:x", "TELEGRAM_API_BASE_URL": base}
    [finding] = await _check_channels(load_config(env=env))
    assert finding.severity == "error" and f"cannot reach {base}" in finding.detail
