"""Who the agent answers: group activation and the direct-message access policy.

Checked before a message enters the inbox, so ignored chatter costs one lookup and
leaves no trace. The rules come from the adapter (``Channel.policy``), which knows its
platform's ids; the decision and the pairing state live here.

- group or thread, activation ``mention``: only messages that mention the bot, reply
  to it, or are a bare command;
- direct, ``open``: everyone; ``allowlist``: only ``allow_from``; ``pairing``:
  ``allow_from`` and people an operator approved, strangers get a pairing code.
Automated events (heartbeats, cron) always pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from parley.channels.base import Channel, InboundMessage
from parley.gateway.storage.pairing import PairingCheck, PairingRequest, pairing_text

log = logging.getLogger("parley.gateway.access")


@dataclass(frozen=True, slots=True)
class Admission:
    allowed: bool
    reason: str = ""
    notice: str | None = None  # text to send the sender instead of an answer
    pairing: PairingRequest | None = None
    # A group message the bot was not addressed in, or one that addresses it: how many
    # of the group's other messages to keep as context (0: none, or not a group).
    group_context_messages: int = 0


ADMITTED = Admission(allowed=True)


class PairingGate(Protocol):
    """What the gate asks of the pairing store; the SQLite and PostgreSQL ones have it."""

    def now(self) -> datetime: ...

    async def check(
        self, channel: str, account: str, sender_id: str, sender_name: str | None
    ) -> PairingCheck: ...


class AccessGate:
    def __init__(self, pairing: PairingGate) -> None:
        self.pairing = pairing

    async def admit(self, channel: Channel, message: InboundMessage) -> Admission:
        if message.automated:
            return ADMITTED
        policy = channel.policy(message)
        if message.chat_type != "direct":
            kept = policy.group_context_messages
            if policy.activation == "mention" and not message.mentions_bot:
                return Admission(
                    allowed=False, reason="not addressed to the bot", group_context_messages=kept
                )
            return Admission(allowed=True, group_context_messages=kept) if kept else ADMITTED
        if policy.dm_policy == "open" or message.sender_id.lower() in policy.allow_from:
            return ADMITTED
        if policy.dm_policy == "allowlist":
            log.info(
                "%s direct message from %s ignored: not in allow_from",
                message.channel,
                message.sender_id,
            )
            return Admission(allowed=False, reason="not in allow_from")
        check = await self.pairing.check(
            message.channel, message.account, message.sender_id, message.sender_name
        )
        if check.allowed:
            return ADMITTED
        log.info(
            "%s direct message from %s held for pairing (%s)",
            message.channel,
            message.sender_id,
            check.reason,
        )
        notice = None
        if check.notify and check.request is not None:
            notice = pairing_text(check.request, self.pairing.now())
        return Admission(allowed=False, reason=check.reason, notice=notice, pairing=check.request)
