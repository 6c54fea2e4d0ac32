"""Config models owned by the channel adapters (the ``[channels]`` section).

Telegram and Discord each take one or more bot accounts (``accounts.<id>``); a channel
is on when ``enabled = true``, or when ``enabled`` is left unset and an account has a
token. Access rules (``dm_policy``, ``allow_from``) can be set for the channel and
overridden per account; group rules (``activation``) for the channel, per group and,
on Discord, per guild and per channel. The web chat (``[channels.web]``) is on by
default when neither Telegram nor Discord is (``ChannelsConfig.web_enabled``).
A Discord account may connect only some of its bot's shards (``shard_count``,
``shard_ids``), so that several replicas split one bot between them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictInt,
    field_validator,
    model_validator,
)

from parley.channels.base import Activation, ChatPolicy, DmPolicy, StreamMode

EditRule = Literal["ignore", "answer"]
TelegramMode = Literal["polling", "webhook"]

_ACCOUNT_ID_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
# Telegram's rule for setWebhook's secret_token.
_WEBHOOK_SECRET_RE = re.compile(r"[A-Za-z0-9_-]{1,256}")
_TELEGRAM_TOKEN_RE = re.compile(r"\d+:[A-Za-z0-9_-]+")
# Far above what any bot needs, low enough that "all shards" stays a small tuple.
MAX_SHARD_COUNT = 65_536
# Messages not addressed to the bot kept per group chat, shown when it is addressed.
DEFAULT_GROUP_CONTEXT_MESSAGES = 50
MAX_GROUP_CONTEXT_MESSAGES = 500


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _normalise_ids(ids: list[str]) -> list[str]:
    cleaned = [str(i).strip().lower() for i in ids]
    if any(not i for i in cleaned):
        raise ValueError("ids must not be empty")
    return cleaned


def _check_account_ids(accounts: Mapping[str, object]) -> None:
    for account in accounts:
        if not _ACCOUNT_ID_RE.fullmatch(account):
            raise ValueError(
                f"account id {account!r} must be 1-64 of a-z 0-9 _ - (starting with a letter"
                " or digit)"
            )


class TerminalConfig(_Strict):
    # The terminal chat is what `parley run` starts when no other channel is configured.
    enabled: bool = Field(False, description="run the terminal chat beside other channels")
    sender_id: str = Field("local", min_length=1, max_length=64, description="who you are")
    sender_name: str = Field("You", min_length=1, max_length=64)
    prompt: str = Field("you> ", max_length=32)
    max_input_chars: int = Field(32_000, ge=1, le=1_000_000, description="longer lines are refused")


class GroupRule(_Strict):
    activation: Activation | None = Field(None, description="mention | always; unset: inherit")


class _AccountAccess(_Strict):
    enabled: bool = True
    dm_policy: DmPolicy | None = Field(None, description="unset: the channel's dm_policy")
    allow_from: list[str] | None = Field(None, description="unset: the channel's allow_from")

    @field_validator("allow_from")
    @classmethod
    def _ids(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _normalise_ids(value)


class _ChannelAccess(_Strict):
    enabled: bool | None = Field(None, description="unset: on when an account has a token")
    dm_policy: DmPolicy = Field("pairing", description="open | allowlist | pairing")
    allow_from: list[str] = Field(
        default_factory=list,
        description="user ids always allowed in direct messages (the allowlist)",
    )
    edited_messages: EditRule = Field(
        "ignore",
        description="ignore: an edit is not answered; answer: an edit is answered as a new"
        " message marked (edited)",
    )

    @field_validator("allow_from")
    @classmethod
    def _ids(cls, value: list[str]) -> list[str]:
        return _normalise_ids(value)

    def _direct_policy(self, account: _AccountAccess | None) -> ChatPolicy:
        dm = (account.dm_policy if account else None) or self.dm_policy
        allowed = account.allow_from if account and account.allow_from is not None else None
        return ChatPolicy(
            activation="always",
            dm_policy=dm,
            allow_from=frozenset(self.allow_from if allowed is None else allowed),
        )


class TelegramAccountConfig(_AccountAccess):
    token: SecretStr = Field(description="the bot token from @BotFather")
    api_base_url: str = Field(
        "https://api.telegram.org",
        description="the Bot API server (a self-hosted telegram-bot-api, or a test fake)",
    )
    webhook_url: str | None = Field(
        None, description="webhook mode: the public https URL Telegram posts updates to"
    )
    webhook_secret: SecretStr | None = Field(
        None, description="webhook mode: checked against X-Telegram-Bot-Api-Secret-Token"
    )

    @field_validator("token")
    @classmethod
    def _token_shape(cls, value: SecretStr) -> SecretStr:
        if not _TELEGRAM_TOKEN_RE.fullmatch(value.get_secret_value().strip()):
            raise ValueError("a Telegram bot token looks like 123456:ABC-DEF... (from @BotFather)")
        return value

    @field_validator("api_base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("api_base_url must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("webhook_secret")
    @classmethod
    def _secret_shape(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not _WEBHOOK_SECRET_RE.fullmatch(value.get_secret_value()):
            raise ValueError("webhook_secret must be 1-256 of A-Z a-z 0-9 _ -")
        return value


# Telegram's and Discord's ``group_context_messages``: one definition for both.
_GROUP_CONTEXT_FIELD: int = Field(
    DEFAULT_GROUP_CONTEXT_MESSAGES,
    ge=0,
    le=MAX_GROUP_CONTEXT_MESSAGES,
    description="where the bot answers only when addressed: how many of the other "
    "messages it keeps per chat and shows the model when addressed (0: none)",
)


# Telegram's and Discord's ``streaming``.
_STREAMING_FIELD: StreamMode = Field(
    "partial",
    description="show replies while they are written: off | partial (one message edited "
    "as the text grows) | block (a paragraph-sized message at a time)",
)


def _group_policy(activation: Activation, context_messages: int) -> ChatPolicy:
    # Only where the bot waits to be addressed: with "always" every message is a turn.
    kept = context_messages if activation == "mention" else 0
    return ChatPolicy(activation=activation, group_context_messages=kept)


class TelegramConfig(_ChannelAccess):
    mode: TelegramMode = Field("polling", description="polling | webhook")
    poll_timeout_seconds: int = Field(30, ge=0, le=50, description="getUpdates long-poll wait")
    group_activation: Activation = Field(
        "mention", description="in groups: answer when mentioned or replied to, or always"
    )
    groups: dict[str, GroupRule] = Field(
        default_factory=dict, description='per-group rules, by chat id ("-100123...")'
    )
    reply_in_groups: bool = Field(True, description="replies quote the message they answer")
    group_context_messages: int = _GROUP_CONTEXT_FIELD
    streaming: StreamMode = _STREAMING_FIELD
    max_retry_after_seconds: float = Field(
        30.0, ge=0, le=3600, description="flood control longer than this fails the send"
    )
    accounts: dict[str, TelegramAccountConfig] = Field(default_factory=dict)

    @field_validator("accounts")
    @classmethod
    def _accounts(cls, value: dict[str, TelegramAccountConfig]) -> dict[str, TelegramAccountConfig]:
        _check_account_ids(value)
        return value

    @model_validator(mode="after")
    def _webhook_needs(self) -> TelegramConfig:
        if self.mode != "webhook":
            return self
        for name, account in self.accounts.items():
            if account.enabled and (not account.webhook_url or account.webhook_secret is None):
                raise ValueError(
                    f"mode = 'webhook' needs accounts.{name}.webhook_url and webhook_secret"
                )
        return self

    def is_on(self) -> bool:
        if self.enabled is not None:
            return self.enabled
        return any(a.enabled for a in self.accounts.values())

    def policy(self, account: str, chat_type: str, chat_id: str) -> ChatPolicy:
        if chat_type == "direct":
            return self._direct_policy(self.accounts.get(account))
        rule = self.groups.get(chat_id)
        activation = (rule.activation if rule else None) or self.group_activation
        return _group_policy(activation, self.group_context_messages)


class DiscordChannelRule(_Strict):
    activation: Activation | None = Field(None, description="mention | always; unset: inherit")


class DiscordGuildConfig(_Strict):
    activation: Activation | None = Field(None, description="unset: the channel default")
    channels: dict[str, DiscordChannelRule] = Field(
        default_factory=dict, description="per-channel rules, by channel id"
    )


class DiscordAccountConfig(_AccountAccess):
    token: SecretStr = Field(description="the bot token from the Developer Portal")
    # Sharding is per bot (per token): several replicas sharing one database each
    # connect a disjoint part of the bot's shards, and Discord sends each replica only
    # the guilds of its shards (DMs ride on shard 0).
    shard_count: StrictInt = Field(
        1, ge=1, le=MAX_SHARD_COUNT, description="the bot's total shards, over all replicas"
    )
    shard_ids: list[StrictInt] | None = Field(
        None, description="the shards this replica connects; unset: all of 0..shard_count-1"
    )

    @field_validator("token")
    @classmethod
    def _token_shape(cls, value: SecretStr) -> SecretStr:
        token = value.get_secret_value().strip()
        if not token or any(c.isspace() for c in token):
            raise ValueError("a Discord bot token is one word (Developer Portal → Bot → Token)")
        return value

    @model_validator(mode="after")
    def _shards_in_range(self) -> DiscordAccountConfig:
        ids = self.shard_ids
        if ids is None:
            return self
        if not ids:
            raise ValueError("shard_ids must name at least one shard (or be left unset: all)")
        outside = sorted({i for i in ids if not 0 <= i < self.shard_count})
        if outside:
            raise ValueError(
                f"shard_ids {outside} out of range: with shard_count = {self.shard_count}"
                f" a shard id is 0..{self.shard_count - 1}"
            )
        repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
        if repeated:
            raise ValueError(f"shard_ids lists {repeated} more than once")
        return self

    def shards(self) -> tuple[int, ...]:
        """The shard ids this replica connects (all of them when ``shard_ids`` is unset)."""
        return (
            tuple(self.shard_ids) if self.shard_ids is not None else tuple(range(self.shard_count))
        )


class DiscordConfig(_ChannelAccess):
    guild_activation: Activation = Field(
        "mention", description="in guilds: answer when mentioned or replied to, or always"
    )
    guilds: dict[str, DiscordGuildConfig] = Field(
        default_factory=dict, description="per-guild rules (and per-channel), by guild id"
    )
    allow_bots: bool = Field(False, description="answer messages from other bots")
    group_context_messages: int = _GROUP_CONTEXT_FIELD
    streaming: StreamMode = _STREAMING_FIELD
    # Process-wide: discord.py keeps both in class attributes.
    api_base_url: str = Field(
        "https://discord.com/api/v10", description="the REST API (a proxy or a test fake)"
    )
    gateway_url: str = Field(
        "wss://gateway.discord.gg/", description="the gateway websocket (a proxy or a test fake)"
    )
    accounts: dict[str, DiscordAccountConfig] = Field(default_factory=dict)

    @field_validator("accounts")
    @classmethod
    def _accounts(cls, value: dict[str, DiscordAccountConfig]) -> dict[str, DiscordAccountConfig]:
        _check_account_ids(value)
        return value

    def is_on(self) -> bool:
        if self.enabled is not None:
            return self.enabled
        return any(a.enabled for a in self.accounts.values())

    def policy(
        self,
        account: str,
        chat_type: str,
        *,
        guild_id: str | None = None,
        channel_id: str | None = None,
        parent_id: str | None = None,
    ) -> ChatPolicy:
        """``parent_id``: a thread's channel, whose rule the thread inherits."""
        if chat_type == "direct":
            return self._direct_policy(self.accounts.get(account))
        activation: Activation = self.guild_activation
        guild = self.guilds.get(guild_id or "")
        if guild is not None:
            activation = guild.activation or activation
            for cid in (parent_id, channel_id):
                rule = guild.channels.get(cid or "")
                if rule is not None and rule.activation is not None:
                    activation = rule.activation
        return _group_policy(activation, self.group_context_messages)


class WebConfig(_Strict):
    # The browser chat at /chat, served by the gateway's HTTP server behind the admin token.
    enabled: bool | None = Field(
        None, description="unset: on when no platform channel (telegram, discord) is configured"
    )
    backlog: int = Field(
        100, ge=1, le=10_000, description="replies kept per client while no tab is connected"
    )
    max_text_chars: int = Field(
        20_000, ge=1, le=1_000_000, description="longer messages are refused"
    )
    max_clients: int = Field(
        1000, ge=1, le=100_000, description="browser clients connected (or with replies kept)"
    )
    # Files sent with a message (pictures, documents, voice), carried in its frame.
    max_upload_bytes: int = Field(
        10 * 1024 * 1024, ge=1024, le=100 * 1024 * 1024, description="one file's size"
    )
    max_files: int = Field(4, ge=0, le=16, description="files per message; 0: none taken")


class ChannelsConfig(_Strict):
    terminal: TerminalConfig = TerminalConfig()
    telegram: TelegramConfig = TelegramConfig()
    discord: DiscordConfig = DiscordConfig()
    web: WebConfig = WebConfig()

    def configured(self) -> list[str]:
        """Names of the channels the operator turned on."""
        names = ["terminal"] if self.terminal.enabled else []
        names += [name for name in ("telegram", "discord") if getattr(self, name).is_on()]
        return names

    def web_enabled(self) -> bool:
        """The web chat: as configured, else on for a local setup (no platform channel)."""
        if self.web.enabled is not None:
            return self.web.enabled
        return not (self.telegram.is_on() or self.discord.is_on())
