"""The answers of the commands answered at once (``parsing.parse_info_command``):
read-only views of the session and this conversation's own memory, and the notes
``/remember`` and ``/forget`` change. None of them waits for the session's lane.

``/status``, ``/context`` and the admin inspector take a session's context figures from
one report (``context_report``, printed by ``core.context.report.figure_lines``), so the
three agree on the numbers and on what each one means.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from parley.channels.base import InboundMessage
from parley.core.context.report import (
    ContextReport,
    build_context_report,
    describe_profile,
    describe_tools,
    describe_window,
    figure_lines,
    last_call,
    render_context,
)
from parley.core.context.view import ContextView
from parley.core.errors import CoreError, TranscriptError
from parley.core.memory.notes import NoteError
from parley.core.memory.recall import last_recall
from parley.core.memory.tasks import format_task_stats
from parley.core.transcript_store import SessionTranscript
from parley.gateway.routing import SessionRoute
from parley.gateway.runtime.commands.parsing import InfoCommand
from parley.gateway.runtime.commands.texts import (
    FORGET_USAGE,
    HELP_TEXT,
    MEMORY_USAGE,
    REMEMBER_USAGE,
    format_memory_status,
    format_search,
    format_status,
)
from parley.gateway.runtime.context import Runtime
from parley.gateway.runtime.transcripts import TranscriptCache
from parley.gateway.storage.sessions import SessionRecord

MEMORY_OFF_TEXT = "Long-term memory is turned off ([memory] enabled = false)."


class CommandReplies:
    def __init__(self, rt: Runtime, transcripts: TranscriptCache) -> None:
        self.rt = rt
        self.transcripts = transcripts

    async def answer(self, info: InfoCommand, route: SessionRoute, message: InboundMessage) -> str:
        if info.name == "help":
            return HELP_TEXT
        if info.name == "context":
            return await self.context_text(route, info.argument)
        if info.name == "memory":
            return await self.memory_text(route, message, info.argument)
        if info.name in ("remember", "forget"):
            return await self.note_text(route, message, info.name, info.argument)
        return await self.status_text(route.key, route.chat_type)

    async def status_text(self, key: str, chat_type: str = "direct") -> str:
        rt = self.rt
        record = await rt.registry.get_active(key)
        # What the session's last turn or compaction in this process left: the whole
        # transcript is not re-read outside the lane for compaction counts.
        stats = rt.figures.peek(record.session_id) if record is not None else None
        report = await self._current_report(record, chat_type, key)
        agent = rt.agent(key)
        return format_status(
            record,
            key=key,
            model=agent.model,
            figures=figure_lines(report),
            now=rt.clock(),
            compactions=stats,
            tools=self.tools_text(record, key),
            profile=describe_profile(agent.profile),
            agent=f"{agent.name} ({agent.id})",
        )

    def tools_text(self, record: SessionRecord | None, key: str | None = None) -> str:
        """Whether the session's model is offered tools, and who decided."""
        rt = self.rt
        key = record.key if record is not None else key
        agent = rt.agent(key)
        runner, model = agent.runner, self.model_for(record, key)
        override = rt.config.context.models.get(model.strip().lower())
        return describe_tools(
            bool(runner.offer_tools),
            count=len(runner.tools.specs()),
            model=model,
            configured=override.tools if override is not None else None,
            provider=agent.provider,
        )

    def model_for(self, record: SessionRecord | None, key: str | None = None) -> str:
        """The session's model: its own setting, else its agent's (as ``window_for``)."""
        model = record.settings.get("model") if record is not None else None
        if isinstance(model, str) and model:
            return model
        return self.rt.agent(record.key if record is not None else key).model

    def window_note(self, record: SessionRecord | None, key: str | None = None) -> str:
        """The session's window and where it came from, in plain words."""
        rt, model = self.rt, self.model_for(record, key)
        agent = rt.agent(record.key if record is not None else key)
        provider = agent.provider
        facts = getattr(provider, "facts", None) if model == provider.model else None
        info = agent.engine.window(model)
        note = describe_window(info, model=model, facts=facts)
        window = rt.window_for(record)
        if window < info.tokens:
            # A refusal taught the session a smaller window: that one is the figure.
            return f"{window:,} tokens, as the provider's refusal showed (resolved: {note})"
        return note

    async def context_text(self, route: SessionRoute, mode: str) -> str:
        """``/context [list|detail|json]``: what the next request would hold, by part."""
        record = await self.rt.registry.get_active(route.key)
        report = await self._current_report(record, route.chat_type, route.key)
        return render_context(report, mode or "list")

    async def _current_report(
        self, record: SessionRecord | None, chat_type: str, key: str | None = None
    ) -> ContextReport:
        """The report on the session's live transcript, read outside the lane."""
        transcript = opened = None
        if record is not None:
            transcript = await self.transcripts.cached(record)
            if transcript is None:
                # Outside the lane: a read-only copy for this read (none yet: the lane
                # may be creating it), never the lane's way of opening.
                with contextlib.suppress(TranscriptError):
                    transcript = opened = await asyncio.to_thread(
                        self.rt.state.transcripts.open, record.session_id, read_only=True
                    )
        try:
            report, _ = await self.context_report(record, transcript, chat_type, key)
        finally:
            if opened is not None:
                opened.close()
        return report

    async def context_report(
        self,
        record: SessionRecord | None,
        transcript: SessionTranscript | None,
        chat_type: str,
        key: str | None = None,
    ) -> tuple[ContextReport, ContextView | None]:
        """What the next request would hold, by part, and how the history was cut.
        ``key``: the session's when there is no record yet (its agent's parts)."""
        rt = self.rt
        key = record.key if record is not None else key
        agent = rt.agent(key)
        engine, runner, profile = agent.engine, agent.runner, agent.profile
        tools = runner.tools.specs() if runner.offer_tools else ()
        window = rt.window_for(record)
        file_cap, total_cap = rt.config.context.file_max_chars, rt.config.context.total_max_chars
        if profile.short_prompt:
            file_cap = total_cap = profile.workspace_max_chars
        window_note = self.window_note(record, key)

        def build() -> tuple[ContextReport, ContextView | None]:
            # In a worker thread, all of it: reading the transcript and cutting the view
            # of a long session would hold up the event loop. One hop: the prompt too.
            prompt = agent.prompt.build()
            history: list[Any] = []
            view = None
            recall = called = None
            if transcript is not None:
                live = transcript.live_entries()
                view = engine.inspect_view(live, chat_type, window=window)
                history = view.messages
                recall = last_recall(live)  # what the last turn recalled from memory
                # From the transcript, not the registry's context_tokens: after /compact
                # that holds the compactor's estimate, which no model reported.
                called = last_call(live)
            report = build_context_report(
                prompt=prompt,
                tools=tools,
                history=history,
                counter=engine.counter,
                window=window,
                workspace=agent.workspace,
                # The small profile's short prompt has its own, smaller cap on the files.
                file_max_chars=file_cap,
                total_max_chars=total_cap,
                last_call=called,
                recall=recall,
                window_note=window_note,
            )
            return report, view

        return await asyncio.to_thread(build)

    async def memory_text(self, route: SessionRoute, message: InboundMessage, argument: str) -> str:
        """``/memory status``, ``search <query>`` and ``stats``: this conversation's
        audiences only, as its own searches see them, in its agent's memory."""
        memory = self.rt.agent(route.key).memory
        if memory is None:
            return MEMORY_OFF_TEXT
        action, _, query = argument.partition(" ")
        try:
            viewer = self.rt.viewer(route, message)
            if action in ("", "status"):
                return format_memory_status(await memory.status(viewer))
            if action == "search" and query.strip():
                scopes = await memory.visible_scopes(viewer)
                result = await memory.search(query.strip(), scopes=scopes)
                return format_search(query.strip(), result)
            if action == "stats" and not query.strip():
                scopes = await memory.visible_scopes(viewer)
                return format_task_stats(await memory.task_stats(scopes))
        except CoreError as exc:
            return f"Memory is unavailable: {exc}"
        return MEMORY_USAGE

    async def note_text(
        self, route: SessionRoute, message: InboundMessage, name: str, argument: str
    ) -> str:
        """``/remember <text>`` and ``/forget <text or citation>``: the notes of this
        conversation's own audience (the person's, or the group's), nobody else's, in
        its agent's memory."""
        memory = self.rt.agent(route.key).memory
        if memory is None:
            return MEMORY_OFF_TEXT
        if not argument:
            return REMEMBER_USAGE if name == "remember" else FORGET_USAGE
        audience = self.rt.audience(route, message)
        where = "your memory" if audience.kind == "person" else "this group's memory"
        try:
            if name == "remember":
                citation = await memory.remember(audience, argument)
                return f"Remembered in {where} ({citation})."
            removed = await memory.forget_note(audience, argument)
        except (NoteError, OSError) as exc:
            return f"Could not change {where}: {exc}"
        if not removed:
            return f"Nothing in {where} matches that."
        lines = sum(len(f.lines) for f in removed)
        return f"Forgot {lines} line(s) from {where}: " + "; ".join(
            f"{f.path} ({len(f.lines)})" for f in removed
        )
