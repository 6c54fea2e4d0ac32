"""A message's way in: admitted (access and group activation, ``gateway.runtime.access``),
recorded in the durable inbox (a platform's redelivery is answered once), the
commands answered at once, then handed to its session's lane.

A group message not addressed to the agent is kept as group context
(``gateway.runtime.group_context``); the next message that addresses it there is
recorded with what was kept.

A message the inbox cannot record is not accepted: the adapter reports it, and the
platform (or the browser) may deliver it again once the state takes writes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import OrderedDict

from parley.channels.base import (
    Channel,
    ChannelError,
    EarlierMessage,
    InboundMessage,
    InboundNotStored,
)
from parley.gateway.lanes import LaneManager
from parley.gateway.runtime.access import AccessGate
from parley.gateway.runtime.commands.parsing import parse_info_command
from parley.gateway.runtime.commands.replies import CommandReplies
from parley.gateway.runtime.context import Runtime
from parley.gateway.runtime.delivery import Delivery, reply_to
from parley.gateway.runtime.dispatch import Dispatch
from parley.gateway.runtime.group_context import GroupContextBuffer
from parley.gateway.runtime.lane_items import LaneItem, LaneTask
from parley.gateway.runtime.user_errors import BUSY_TEXT, NOT_RECORDED_TEXT
from parley.gateway.storage.errors import storage_failure
from parley.gateway.storage.inbox import well_formed

log = logging.getLogger("parley.gateway")

# How many refused messages are remembered, so a platform's redelivery is told once.
NOT_RECORDED_MEMORY = 1000


class Inbound:
    def __init__(
        self,
        rt: Runtime,
        *,
        access: AccessGate,
        lanes: LaneManager[LaneItem | LaneTask],
        dispatch: Dispatch,
        delivery: Delivery,
        commands: CommandReplies,
        ready: asyncio.Event,
        group_context: GroupContextBuffer | None = None,
    ) -> None:
        self.rt = rt
        self.access = access
        self.lanes = lanes
        self.dispatch = dispatch
        self.delivery = delivery
        self.commands = commands
        self.ready = ready  # set once the gateway has started and recovered
        self.group_context = group_context if group_context is not None else GroupContextBuffer()
        self._not_recorded: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    async def handle(self, message: InboundMessage) -> None:
        """The channels' entry point: admitted, durable, then routed."""
        rt = self.rt
        message = well_formed(message)
        channel = rt.channels.get(message.channel)
        keep_context = 0
        if channel is not None:
            admission = await self.access.admit(channel, message)
            keep_context = admission.group_context_messages
            if not admission.allowed:
                if keep_context:
                    self.group_context.keep(rt.route(message).key, message, keep_context)
                if admission.notice is not None:
                    await self._notify(channel, message, admission.notice)
                return
        route = rt.route(message)
        info = parse_info_command(message.text)
        taken: tuple[EarlierMessage, ...] = ()
        if keep_context and info is None:
            # Peeked, not taken: a message the inbox refuses or already has leaves it.
            taken = self.group_context.peek(route.key)
            if taken:
                message = dataclasses.replace(message, group_context=taken)
        try:
            recorded = await rt.inbox.record(message, session_key=route.key)
        except Exception as exc:
            detail = storage_failure(exc)
            if detail is None:
                raise
            # Not durable, so not accepted: the adapter reports it and the platform (or
            # the browser) may deliver it again once state.db takes writes.
            log.error(
                "storage failure: cannot record %s message %s in the inbox: %s",
                message.channel,
                message.message_id,
                detail,
            )
            rt.metrics.error("storage")
            if channel is not None:
                await self._tell_not_recorded(channel, message)
            raise InboundNotStored(f"the message was not recorded: {detail}") from exc
        if not recorded.is_new:
            log.info(
                "duplicate %s message %s ignored (%s)",
                message.channel,
                message.message_id,
                recorded.item.status,
            )
            return
        self.group_context.drop(route.key, taken)
        rt.metrics.inbound(message.channel)
        await self.ready.wait()
        item_id = recorded.item.id
        if info is not None:
            text = await self.commands.answer(info, route, message)
            await self.delivery.deliver([item_id], message, None, text)
            return
        item = self.dispatch.lane_item(item_id, message, route)
        submitted = await self.lanes.submit(route.key, item)
        if not submitted.accepted:
            await self.delivery.deliver(
                [item_id], message, None, BUSY_TEXT, final_status="rejected"
            )

    async def _tell_not_recorded(self, channel: Channel, message: InboundMessage) -> None:
        """Tell the sender their message could not be saved: once per message, however
        often the platform delivers it again; best effort (nothing can be stored)."""
        key = (message.channel, message.account, message.message_id)
        if key in self._not_recorded:
            return
        self._not_recorded[key] = None
        while len(self._not_recorded) > NOT_RECORDED_MEMORY:
            self._not_recorded.popitem(last=False)
        try:
            await channel.send(reply_to(message, NOT_RECORDED_TEXT))
        except ChannelError as exc:
            log.warning("telling %s %s failed: %s", message.channel, message.sender_id, exc)

    async def _notify(self, channel: Channel, message: InboundMessage, text: str) -> None:
        """A reply outside any session (a pairing code): sent once, not stored."""
        try:
            await channel.send(reply_to(message, text, quote=False))
        except ChannelError as exc:
            log.warning("notice to %s %s failed: %s", message.channel, message.sender_id, exc)
            return
        await self.rt.pairing.mark_notified(message.channel, message.sender_id)
