"""`parley doctor`: check what a running bot depends on, and say what is wrong.

Each check returns a ``Finding``; ``ok`` False on any ``error`` finding makes the
command exit non-zero. Warnings (for example memory search degraded to keywords)
are shown but do not fail.

The state, transcript, memory and pairing checks read the configured backend: state.db
and the session files, or the shared PostgreSQL (opened without migrating it: a check
changes nothing). State written by an earlier parley is reported by the ``migration``
check, and the checks that would upgrade it by opening it are skipped; ``fix=True``
(``parley doctor --fix``) backs the home up and migrates it first (gateway/home_upgrade/state.py).

The ``memory audiences`` check counts flush notes and task logs from before audiences
that still sit where everyone can reach them; ``--fix`` moves them
(gateway/home_upgrade/audiences.py).

The ``file modes`` check lists what under the home is open to group or others (every
message is in there); ``--fix`` narrows it to owner-only (gateway/file_modes.py).

The ``disk`` check says how many bytes each kind holds under the home (active and
archived transcripts, checkpoints, media, memory, state.db, logs); ``retention`` the
``[retention]`` settings, the last run and whether the disk cap is met.

The ``model`` check says what the gateway would decide about the model at start: its
context window and where that figure came from (the server, when it publishes one:
llama.cpp's ``/props``, Ollama, vLLM, the embedded model's file; else parley's table;
else the config or the default), whether it is offered tools, and the profile. It asks
the server as the gateway's start does, through the provider's optional ``discover()``,
and words it as ``/status`` does (``core.context.report``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import aiohttp

from parley.core.errors import TranscriptError
from parley.core.providers.base import ModelFacts
from parley.core.transcript_store import FileTranscriptStore, TranscriptStore
from parley.gateway.admin.auth import check_setup
from parley.gateway.cli.doctor_agents import agents_findings
from parley.gateway.config import LoadedConfig
from parley.gateway.errors import AdminServerError, GatewayError, StateError
from parley.gateway.file_modes import find_wide_modes, narrow_modes
from parley.gateway.home_upgrade.audiences import audience_check
from parley.gateway.home_upgrade.state import StateMigrationError, Survey, migrate, survey
from parley.gateway.providers import build_provider, choose_provider
from parley.gateway.storage.sqlite.database import Database

if TYPE_CHECKING:
    from parley.gateway.storage.pairing import PairingRequest
    from parley.gateway.storage.postgres.database import PgDatabase

Severity = Literal["ok", "warning", "error"]
PROBE_TIMEOUT_SECONDS = 5.0
# Transcripts named in one finding; the rest are counted.
LISTED_TRANSCRIPTS = 10
# Paths with too wide a mode named in the file modes finding.
WIDE_MODES_LISTED = 5


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    severity: Severity
    detail: str


async def run_doctor(loaded: LoadedConfig, *, fix: bool = False) -> list[Finding]:
    findings = [Finding("config", "ok", f"valid ({loaded.source})")]
    findings += [Finding(*f) for f in await asyncio.to_thread(agents_findings, loaded)]
    if fix:
        findings.append(await _fix(loaded))
    found = await asyncio.to_thread(survey, loaded)
    findings += _migration_findings(found, fixing=fix)
    # Memory from before audiences (gateway/home_upgrade/audiences.py): --fix moves it.
    moved = await audience_check(loaded, fix=fix, sync=not found.blocks("memory"))
    findings += [Finding("memory audiences", severity, detail) for severity, detail in moved]
    # Before the checks below open state.db (after --fix's backup, which it narrows too).
    findings.append(await asyncio.to_thread(_check_file_modes, loaded.home, fix))
    if loaded.config.storage.backend == "postgres":
        async with _postgres(loaded) as (db, state):
            findings.append(state)
            # Without a database to read (the state finding says why), the checks that
            # read it say so instead: fine on an empty one, a warning otherwise.
            skipped: Severity = "ok" if state.severity == "ok" else "warning"
            why = "not checked: " + ("no tables yet" if skipped == "ok" else "see state")
            if db is None:
                findings.append(Finding("transcripts", skipped, why))
            else:
                findings += await asyncio.to_thread(_check_transcripts, _pg_transcripts(db))
            if db is None and loaded.config.memory.enabled:
                findings.append(Finding("memory", skipped, why))
            else:
                findings.append(await _check_memory(loaded, db))
                findings += await _check_other_agents_memory(loaded, db)
            findings += await _check_provider_and_model(loaded)
            findings += await _check_channels(loaded)
            if db is None:
                findings.append(Finding("pairing", skipped, why))
            else:
                findings.append(await _check_pg_pairing(db))
            findings += await _check_disk(loaded, db)
    else:
        # Opening an out-of-date state.db or memory.db with today's code upgrades it:
        # those checks wait for --fix (the migration finding says what it would do).
        pending = Finding("state.db", "warning", "not checked: see migration")
        state_blocked = found.blocks("state")
        findings.append(pending if state_blocked else await _check_state_db(loaded.state_db))
        store = FileTranscriptStore(loaded.sessions_dir)
        findings += await asyncio.to_thread(_check_transcripts, store)
        if found.blocks("memory"):
            findings.append(Finding("memory", "warning", "not checked: see migration"))
        else:
            findings.append(await _check_memory(loaded))
            findings += await _check_other_agents_memory(loaded)
        findings += await _check_provider_and_model(loaded)
        findings += await _check_channels(loaded)
        if state_blocked:
            findings.append(Finding("pairing", "warning", "not checked: see migration"))
        else:
            findings.append(await _check_pairing(loaded))
        findings += await _check_disk(loaded, None, read_state=not state_blocked)
    findings.append(await asyncio.to_thread(_check_http, loaded))
    findings.append(await asyncio.to_thread(_check_media, loaded))
    return findings


def _check_media(loaded: LoadedConfig) -> Finding:
    """Pictures, documents and voice (gateway/media/): the extra, the transcription URL."""
    media = loaded.config.media
    if not media.enabled:
        return Finding("media", "ok", "off ([media] enabled = false): placeholders only")
    missing = [
        name for name, module in (("Pillow", "PIL"), ("pypdf", "pypdf"))
        if importlib.util.find_spec(module) is None
    ]  # fmt: skip
    url = media.transcription.url
    voice = f"voice notes transcribed at {url}" if url else "voice notes not transcribed"
    if missing:
        return Finding(
            "media", "warning",
            f"{' and '.join(missing)} missing (the media extra): pictures and PDFs get a "
            f'notice instead; pip install "parley[media]"; {voice}',
        )  # fmt: skip
    return Finding("media", "ok", f"pictures and documents read; {voice}")


async def _fix(loaded: LoadedConfig) -> Finding:
    try:
        report = await migrate(loaded)
    except StateMigrationError as exc:
        return Finding("fix", "error", str(exc))
    if report.backup is None:
        return Finding("fix", "ok", "nothing to migrate: the state is current")
    return Finding(
        "fix", "ok", f"backed up to {report.backup}; migrated: " + "; ".join(report.done)
    )


def _migration_findings(found: Survey, *, fixing: bool) -> list[Finding]:
    findings = [Finding("migration", "error", reason) for reason in found.refusals]
    if found.steps:
        # After a --fix that failed, the steps are still pending: that is an error.
        severity: Severity = "error" if fixing else "warning"
        todo = "; ".join(step.detail for step in found.steps)
        where = found.home / "backups" / "<UTC time>"
        findings.append(
            Finding(
                "migration",
                severity,
                f"state from an earlier parley: {todo}. `parley doctor --fix` backs up "
                f"{found.home} to {where} and migrates it (stop the gateway first)",
            )
        )
    findings += [Finding("migration", "warning", note) for note in found.notes]
    if not findings:
        what = ", ".join(found.current) or "no state yet"
        findings.append(Finding("migration", "ok", f"current ({what})"))
    return findings


@contextlib.asynccontextmanager
async def _postgres(loaded: LoadedConfig) -> AsyncIterator[tuple[PgDatabase | None, Finding]]:
    """The shared database, open, and the state finding; None for the database when
    the other checks cannot read it (unreachable, or its schema is not this parley's)."""
    from parley.gateway.storage.postgres.database import PgDatabase
    from parley.gateway.storage.postgres.schema_migrations import SCHEMA_VERSION, schema_version

    url = loaded.config.storage.url
    assert url is not None  # the config refuses postgres without one
    # Not migrated at open: `parley db migrate` (or the gateway's start) changes the
    # schema, a check never does.
    db = PgDatabase(url.get_secret_value(), pool_size=2, migrate_at_open=False)
    try:
        try:
            await db.open()
            version = await db.run(schema_version)
        except Exception as exc:  # any failure to reach it is the finding
            yield None, Finding("state", "error", f"PostgreSQL: {exc}")
            return
        where = f"postgres {db.where}"
        migrate = "`parley db migrate` (or the gateway's start) creates them"
        if version == SCHEMA_VERSION:
            yield db, Finding("state", "ok", f"{where}: schema version {version}")
        elif version == 0:
            yield None, Finding("state", "ok", f"{where}: no tables yet; {migrate}")
        elif version < SCHEMA_VERSION:
            detail = f"{where}: schema version {version} of {SCHEMA_VERSION}; {migrate}"
            yield None, Finding("state", "warning", detail)
        else:
            detail = f"{where}: schema version {version} is newer than this parley's"
            yield None, Finding("state", "error", f"{detail} ({SCHEMA_VERSION}): upgrade it")
    finally:
        await db.close()


async def _check_disk(
    loaded: LoadedConfig, db: PgDatabase | None, *, read_state: bool = True
) -> list[Finding]:
    """Disk use per kind, the retention settings and the last run (gateway/retention/)."""
    from parley.gateway.retention.usage import disk_findings

    if not read_state and db is None:
        return [Finding("disk", "warning", "not checked: see migration")]
    try:
        found = await disk_findings(loaded, db)
    except Exception as exc:  # a report, not a failure of the bot
        return [Finding("disk", "warning", f"cannot measure: {exc}")]
    return [Finding(f.check, f.severity, f.detail) for f in found]


def _pg_transcripts(db: PgDatabase) -> TranscriptStore:
    from parley.gateway.storage.postgres.transcripts import PgTranscriptStore

    return PgTranscriptStore(db)


def _check_file_modes(home: Path, fix: bool) -> Finding:
    """Is everything under the home owner-only; with ``fix``, make it so. An error when
    the home itself lets others in, a warning when only entries inside it would."""
    check = "file modes"
    if not home.exists():
        return Finding(check, "ok", f"{home} not created yet (first run creates it 0700)")
    wide = find_wide_modes(home)
    narrowed = 0
    if fix and wide:
        narrowed, failures = narrow_modes(wide)
        wide = find_wide_modes(home)
        if failures:
            return Finding(check, "error", "cannot narrow " + _listed(failures))
    if not wide:
        done = f"narrowed {narrowed} to owner-only" if narrowed else "owner-only"
        return Finding(check, "ok", f"{done} ({home})")
    listed = [f"{_relative(path, home)} ({mode:04o})" for path, mode in wide]
    home_open = wide[0][0] == home
    return Finding(
        check,
        "error" if home_open else "warning",
        f"{len(wide)} open to group or others under {home}: "
        + _listed(listed, WIDE_MODES_LISTED)
        + "; `parley doctor --fix` narrows them to owner-only (0755 to 0700, 0644 to 0600)",
    )


def _relative(path: Path, home: Path) -> str:
    return "." if path == home else str(path.relative_to(home))


def _check_http(loaded: LoadedConfig) -> Finding:
    """Would the admin server start: a token wherever the address is not loopback."""
    http = loaded.config.http
    if not http.enabled:
        return Finding("http", "ok", "off ([http] enabled = false)")
    secret = http.token.get_secret_value() if http.token else None
    try:
        how = check_setup(secret, http.host, loaded.admin_token_file)
    except AdminServerError as exc:
        return Finding("http", "error", str(exc))
    return Finding("http", "ok", f"http://{http.host}:{http.port}/ ({how})")


async def _check_state_db(path: Path) -> Finding:
    if not await asyncio.to_thread(path.exists):
        return Finding("state.db", "ok", f"{path} not created yet (first run creates it)")
    db = Database(path)
    try:
        await db.open()
        problems = await db.run(db.integrity_check)
    except StateError as exc:
        return Finding("state.db", "error", str(exc))
    finally:
        await db.close()
    if problems:
        return Finding("state.db", "error", "; ".join(problems[:5]))
    return Finding("state.db", "ok", f"{path}: integrity ok")


def _check_transcripts(store: TranscriptStore) -> list[Finding]:
    """Open every transcript of ``store`` read-only, as the gateway would (blocking)."""
    try:
        infos = store.list_transcripts()
    except TranscriptError as exc:
        return [Finding("transcripts", "error", f"cannot list them: {exc}")]
    if not infos:
        return [Finding("transcripts", "ok", "none yet")]
    broken: list[str] = []
    repaired: list[str] = []
    for info in infos:
        name = _transcript_name(store, info.session_id)
        try:
            transcript = store.open(info.session_id, read_only=True)
        except TranscriptError as exc:
            broken.append(f"{name}: {exc}")
            continue
        with transcript:
            report = transcript.load_report
            if not report.clean:
                repaired.append(f"{name}: {report}")
    findings: list[Finding] = []
    if broken:
        findings.append(Finding("transcripts", "error", "fail to load: " + _listed(broken)))
    if repaired:
        findings.append(
            Finding("transcripts", "warning", "need repair on next load: " + _listed(repaired))
        )
    if not findings:
        findings.append(Finding("transcripts", "ok", f"{len(infos)} load cleanly"))
    return findings


def _transcript_name(store: TranscriptStore, session_id: str) -> str:
    # Files by their file name, as an operator finds them in the sessions directory.
    return f"{session_id}.jsonl" if isinstance(store, FileTranscriptStore) else session_id


def _listed(items: list[str], shown: int = LISTED_TRANSCRIPTS) -> str:
    more = len(items) - shown
    return "; ".join(items[:shown]) + (f" (+{more} more)" if more > 0 else "")


async def _check_other_agents_memory(
    loaded: LoadedConfig, db: PgDatabase | None = None
) -> list[Finding]:
    """The memory check of each agent but the default (whose is ``memory``)."""
    from parley.gateway.agents import agent_specs, loaded_for

    found = []
    for spec in agent_specs(loaded.config)[1:]:
        finding = await _check_memory(loaded_for(loaded, spec), db)
        found.append(Finding(f"memory ({spec.id})", finding.severity, finding.detail))
    return found


async def _check_memory(loaded: LoadedConfig, db: PgDatabase | None = None) -> Finding:
    """Open the memory index as the gateway would and report what search can do."""
    from parley.core.errors import CoreError
    from parley.gateway.memory import build_memory_index

    if not loaded.config.memory.enabled:
        return Finding("memory", "ok", "long-term memory is turned off")
    if loaded.config.storage.backend == "postgres" and db is None:
        return Finding("memory", "error", "PostgreSQL unavailable")
    if loaded.config.storage.backend == "sqlite":
        from parley.gateway.memory import memory_db_path

        path = memory_db_path(loaded)
        # Opening creates it: a check must not (the gateway's start does).
        if not await asyncio.to_thread(path.exists):
            return Finding("memory", "ok", f"{path} not created yet (first run creates it)")
    index = build_memory_index(loaded, db=db)
    try:
        await index.open()
        status = await index.status()
    except (CoreError, GatewayError) as exc:
        return Finding("memory", "error", f"{index.backend.where}: {exc}")
    finally:
        await index.close()
    counts = status.counts
    detail = (
        f"{status.provider} {status.model or ''}".strip()
        + f"; {counts.files} files, {counts.chunks} chunks; driver {status.driver['driver']}"
    )
    if not status.vector_available:
        reason = status.vector_error or status.fallback or "no embedder"
        return Finding("memory", "warning", f"keyword-only search ({reason}); {detail}")
    if status.fallback:
        return Finding("memory", "warning", f"{status.fallback}; {detail}")
    return Finding("memory", "ok", f"hybrid search ready; {detail}")


async def _check_provider(loaded: LoadedConfig) -> Finding:
    providers = loaded.config.providers
    choice = choose_provider(providers)
    if choice.name == "local":
        from parley.core.providers.local import locate_model

        try:
            path = locate_model(providers.local)
        except Exception as exc:
            return Finding("provider", "error", f"local model unavailable: {exc}")
        if importlib.util.find_spec("xllamacpp") is None:
            return Finding("provider", "error", "xllamacpp is not installed (the `local` extra)")
        return Finding("provider", "ok", f"local model {path.name} ({choice.reason})")
    if choice.name == "anthropic":
        base = (providers.anthropic.base_url or "https://api.anthropic.com").rstrip("/")
        key = providers.anthropic.api_key
        url, headers = f"{base}/v1/models", {"anthropic-version": "2023-06-01"}
        if key is not None:
            headers["x-api-key"] = key.get_secret_value()
    else:
        base = (providers.openai.base_url or "https://api.openai.com/v1").rstrip("/")
        key = providers.openai.api_key
        url, headers = f"{base}/models", {}
        if key is not None:
            headers["Authorization"] = f"Bearer {key.get_secret_value()}"
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, headers=headers) as response,
        ):
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Finding("provider", "error", f"{choice.name}: cannot reach {base}: {exc!r}")
    if status in (401, 403):
        return Finding("provider", "error", f"{choice.name}: {base} refused the API key ({status})")
    return Finding("provider", "ok", f"{choice.name} reachable at {base} (HTTP {status})")


async def _check_provider_and_model(loaded: LoadedConfig) -> list[Finding]:
    provider = await _check_provider(loaded)
    # An unreachable server would only make the model check wait out its probes again.
    return [provider, await _check_model(loaded, ask=provider.severity == "ok")]


async def _check_model(loaded: LoadedConfig, *, ask: bool = True) -> Finding:
    """The model's window and its source, tools and profile, as the gateway would find
    them at start; ``ask``: put the provider's questions to its server (``discover``)."""
    from parley.core.context.engine import ContextEngine
    from parley.core.context.report import describe_tools, describe_window
    from parley.core.errors import WindowTooSmallError
    from parley.core.model_profile import choose_profile
    from parley.gateway.runtime.agents import tools_offered

    config = loaded.config
    try:
        provider, _ = build_provider(config.providers)
    except Exception as exc:  # a provider that cannot even be built: the finding says so
        return Finding("model", "error", f"cannot set up the provider: {exc}")
    try:
        facts = await _discover(provider) if ask else None
        model = provider.model
        engine = ContextEngine(
            config=config.context,
            provider=provider,
            retry=config.providers.retry,
            max_output=config.agent.max_output_tokens,
        )
        info = engine.window(model)
        override = config.context.models.get(model.strip().lower())
        tools = describe_tools(
            tools_offered(provider, config.context),
            count=None,  # the registry is the gateway's (memory adds tools at start)
            model=model,
            configured=override.tools if override is not None else None,
            provider=provider,
        )
        window = describe_window(info, model=model, facts=facts or getattr(provider, "facts", None))
        chosen = choose_profile(config.agent.profile, window=info.tokens, provider=provider)
        profile: str = chosen.name
        if config.agent.profile == "auto":
            profile += " (auto: small below 16,384 tokens and for the embedded model)"
        detail = f"{model}: window {window}; tools {tools}; profile {profile}"
        if not ask:
            detail += " (the server was not asked: see provider)"
        try:
            engine.check(model)
        except WindowTooSmallError as exc:
            return Finding("model", "error", f"{detail}. {exc}")
        return Finding("model", "warning" if info.source == "default" else "ok", detail)
    finally:
        await provider.aclose()


async def _discover(provider: object) -> ModelFacts | None:
    """The provider's ``discover()`` when it has one. It never fails by contract; a
    bound and a guard here keep a provider that breaks it from failing the doctor."""
    discover = getattr(provider, "discover", None)
    if not callable(discover):
        return None
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_SECONDS * 2):
            facts = await discover()
    except Exception:  # the finding then shows what is known without the server
        return None
    return facts if isinstance(facts, ModelFacts) else None


async def _probe(url: str, headers: dict[str, str]) -> tuple[int, object]:
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url, headers=headers) as response,
    ):
        try:
            body: object = await response.json(content_type=None)
        except ValueError:
            body = None
        return response.status, body


async def _check_channels(loaded: LoadedConfig) -> list[Finding]:
    """Each configured bot account: does the platform accept its token?"""
    channels = loaded.config.channels
    findings: list[Finding] = []
    if channels.telegram.is_on():
        for name, account in channels.telegram.accounts.items():
            if not account.enabled:
                continue
            check = f"telegram:{name}"
            token = account.token.get_secret_value()
            try:
                status, body = await _probe(f"{account.api_base_url}/bot{token}/getMe", {})
            except (aiohttp.ClientError, TimeoutError) as exc:
                findings.append(
                    Finding(
                        check,
                        "error",
                        f"cannot reach {account.api_base_url}: {exc or type(exc).__name__}",
                    )
                )
                continue
            result = body.get("result") if isinstance(body, dict) else None
            if status == 200 and isinstance(result, dict):
                streaming = channels.telegram.streaming
                findings.append(
                    Finding(
                        check,
                        "ok",
                        f"token accepted: @{result.get('username')}; replies stream: {streaming}",
                    )
                )
            else:
                findings.append(Finding(check, "error", f"token refused (HTTP {status})"))
    if channels.discord.is_on():
        base = channels.discord.api_base_url.rstrip("/")
        for name, bot in channels.discord.accounts.items():
            if not bot.enabled:
                continue
            check = f"discord:{name}"
            headers = {"Authorization": f"Bot {bot.token.get_secret_value()}"}
            try:
                status, body = await _probe(f"{base}/users/@me", headers)
            except (aiohttp.ClientError, TimeoutError) as exc:
                findings.append(
                    Finding(check, "error", f"cannot reach {base}: {exc or type(exc).__name__}")
                )
                continue
            if status == 200 and isinstance(body, dict):
                streaming = channels.discord.streaming
                findings.append(
                    Finding(
                        check,
                        "ok",
                        f"token accepted: {body.get('username')}; replies stream: {streaming}",
                    )
                )
            else:
                findings.append(Finding(check, "error", f"token refused (HTTP {status})"))
    return findings


async def _check_pairing(loaded: LoadedConfig) -> Finding:
    from parley.gateway.storage.sqlite.pairing import SqlitePairingStore

    if not await asyncio.to_thread(loaded.state_db.exists):
        return Finding("pairing", "ok", "no requests")
    try:
        async with Database(loaded.state_db) as db:
            store = SqlitePairingStore(db)
            pending = [r for r in await store.list("pending") if not r.expired(store.now())]
    except StateError as exc:
        return Finding("pairing", "error", str(exc))
    return _pairing_finding(pending)


async def _check_pg_pairing(db: PgDatabase) -> Finding:
    from parley.gateway.storage.postgres.pairing import PgPairingStore

    store = PgPairingStore(db)
    try:
        pending = [r for r in await store.list("pending") if not r.expired(store.now())]
    except Exception as exc:  # the driver's errors too: any failure is the finding
        return Finding("pairing", "error", f"PostgreSQL: {exc}")
    return _pairing_finding(pending)


def _pairing_finding(pending: list[PairingRequest]) -> Finding:
    if pending:
        who = ", ".join(f"{r.channel} {r.sender_name or r.sender_id}" for r in pending[:5])
        return Finding(
            "pairing", "warning", f"{len(pending)} waiting ({who}): see `parley pairing list`"
        )
    return Finding("pairing", "ok", "no one waiting")
