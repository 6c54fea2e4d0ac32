"""The root config: TOML file + environment, validated by pydantic.

Where the file comes from: ``--config PATH``, else ``$PARLEY_HOME/parley.toml`` when
it exists, else the built-in defaults. Then the environment:

- secrets: ``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``, ``OPENAI_API_KEY``,
  ``OPENAI_BASE_URL`` fill the provider sections when the file leaves them unset;
  ``PARLEY_TRANSCRIPTION_API_KEY`` the voice transcription endpoint's key;
  ``TELEGRAM_BOT_TOKEN`` and ``DISCORD_BOT_TOKEN`` the ``default`` bot account's
  token; ``PARLEY_DATABASE_URL`` the PostgreSQL URL (``[storage] url``);
  ``TELEGRAM_API_BASE_URL`` overrides the ``default`` Telegram account's Bot API
  server; ``PARLEY_ADMIN_HOST``, ``PARLEY_ADMIN_PORT`` and ``PARLEY_ADMIN_TOKEN``
  override the HTTP server's ``[http]`` host, port and token;
- overrides: ``PARLEY_<SECTION>__<FIELD>[__<FIELD>...]=value`` set any field (the
  value is read as a TOML value when it parses as one, else as a string), e.g.
  ``PARLEY_LANES__MAX_CONCURRENT_RUNS=8``; ``PARLEY_LOG_LEVEL`` is short for
  ``PARLEY_LOGGING__LEVEL``.

Each package owns its section's models; this module only composes them.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from parley.channels.config import ChannelsConfig
from parley.core.agent_config import AgentConfig
from parley.core.context.config import ContextConfig
from parley.core.memory.memory_config import MemorySettings
from parley.core.providers.provider_config import ProvidersConfig
from parley.gateway.agents_config import AgentEntry, BindingConfig, check_agents, inherit_limits
from parley.gateway.errors import ConfigFileError
from parley.gateway.lanes import LanesConfig
from parley.gateway.machine_memory import usable_memory_bytes
from parley.gateway.media.config import MediaConfig
from parley.gateway.retention_config import RetentionConfig
from parley.gateway.session_config import SessionConfig

DEFAULT_HOME = Path("~/.parley")
CONFIG_FILE_NAME = "parley.toml"
ENV_PREFIX = "PARLEY_"
# Environment variables that are not field overrides.
_RESERVED_ENV = {
    "PARLEY_HOME",
    "PARLEY_LOG_LEVEL",
    "PARLEY_CONFIG",
    "PARLEY_DATABASE_URL",
    "PARLEY_TRANSCRIPTION_API_KEY",
}
# Arrays of tables: no environment variable reaches them.
_FILE_ONLY = frozenset({"agents", "bindings"})
_SECRET_ENV: dict[str, tuple[str, ...]] = {
    "ANTHROPIC_API_KEY": ("providers", "anthropic", "api_key"),
    "ANTHROPIC_BASE_URL": ("providers", "anthropic", "base_url"),
    "OPENAI_API_KEY": ("providers", "openai", "api_key"),
    "OPENAI_BASE_URL": ("providers", "openai", "base_url"),
    "TELEGRAM_BOT_TOKEN": ("channels", "telegram", "accounts", "default", "token"),
    "DISCORD_BOT_TOKEN": ("channels", "discord", "accounts", "default", "token"),
    "PARLEY_DATABASE_URL": ("storage", "url"),
    "PARLEY_TRANSCRIPTION_API_KEY": ("media", "transcription", "api_key"),
}
# Overrides (not defaults): they win over the file, and apply to an existing account only.
_OVERRIDE_ENV: dict[str, tuple[str, ...]] = {
    "TELEGRAM_API_BASE_URL": ("channels", "telegram", "accounts", "default", "api_base_url"),
}
# Overrides of the admin server's address and token: they win over the file.
_ADMIN_ENV: dict[str, tuple[str, ...]] = {
    "PARLEY_ADMIN_HOST": ("http", "host"),
    "PARLEY_ADMIN_PORT": ("http", "port"),
    "PARLEY_ADMIN_TOKEN": ("http", "token"),
}


# ``warm_transcripts_mib = "auto"``: this share of the memory the gateway may count on
# (the machine's, or its cgroup's limit: gateway/machine_memory.py), within bounds.
MIB = 1024 * 1024
WARM_AUTO_SHARE = 64
WARM_AUTO_MIN_MIB = 16
WARM_AUTO_MAX_MIB = 128  # from 8 GiB on
WARM_AUTO_UNKNOWN_MIB = 32  # where the system does not say how much memory there is


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StorageConfig(_Strict):
    # SQLite (state.db, JSONL transcripts, memory.db under $PARLEY_HOME) is the embedded
    # default; PostgreSQL with pgvector is shared by several gateway replicas.
    backend: Literal["sqlite", "postgres"] = Field(
        "sqlite", description="where sessions, transcripts, the inbox and memory live"
    )
    url: SecretStr | None = Field(
        None,
        description="postgres: a libpq URL (postgresql://user:pass@host/db); "
        "PARLEY_DATABASE_URL when unset",
    )
    pool_size: int = Field(10, ge=2, le=200, description="postgres: connections per replica")
    # write() alone survives a killed process; fsync also survives a power cut, at a
    # cost of milliseconds per transcript append and per state.db commit.
    fsync: bool = Field(False, description="fsync transcripts and state.db on every write")
    max_open_transcripts: int = Field(256, ge=1, le=100_000, description="kept in memory, LRU")
    # Past max_open_transcripts a session's file is closed but its live window stays in
    # memory, so picking it up again reads nothing; 0 turns that off. Counted in the
    # windows' file bytes: parsed, counted and encoded for the provider, a window of
    # short messages takes about 4 times that in memory. "auto": 1/64 of the memory the
    # gateway may count on, between 16 and 128 MiB (~540 MiB in windows at most). A
    # window that does not fit is read again on its session's next turn, a cost that
    # grows with the session: bench/load.py (1,000 chats, 420 s) answered 173 msgs/s
    # with a p99 of 6.7 s at 32 MiB, which the windows outgrew from round ~38 on,
    # against 183 and 5.3 s with every window warm. 64 MiB held them to round ~78, and
    # the 600 s run's rounds past that cost 6-8 ms per message instead of ~5: its p99
    # reached 1.5x the bare bot's. 128 MiB holds 1,000 chats to their compaction.
    warm_transcripts_mib: int | Literal["auto"] = Field(
        "auto",
        description="live windows kept after their file is closed, in MiB of file (~4x in "
        'memory); "auto": 1/64 of memory, 16 to 128',
    )

    @field_validator("warm_transcripts_mib", mode="before")
    @classmethod
    def _warm_mib(cls, value: object) -> object:
        # One clear message for anything else, rather than one per member of the union.
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65_536:
            return value
        raise ValueError(f'must be "auto" or a whole number of MiB from 0 to 65536, not {value!r}')

    def warm_transcripts_bytes(self, memory_bytes: int | None = None) -> int:
        """``warm_transcripts_mib`` in bytes, "auto" worked out from ``memory_bytes``
        (the memory the gateway may count on, asked of the system when None)."""
        if self.warm_transcripts_mib != "auto":
            return self.warm_transcripts_mib * MIB
        if memory_bytes is None:
            memory_bytes = usable_memory_bytes()
        if memory_bytes is None:
            return WARM_AUTO_UNKNOWN_MIB * MIB
        share = memory_bytes // WARM_AUTO_SHARE // MIB
        return min(WARM_AUTO_MAX_MIB, max(WARM_AUTO_MIN_MIB, share)) * MIB

    # pgvector's HNSW index answers by the server's distance operators; some pgvector
    # builds cannot run them (SIGILL on CPUs without the instructions they were built for).
    vector_index: Literal["hnsw", "exact"] = Field(
        "hnsw",
        description="postgres memory: 'hnsw' (pgvector's ANN index) or 'exact' (vectors "
        "ranked in the client, for pgvector builds that cannot compute distances)",
    )

    @model_validator(mode="after")
    def _postgres_needs_a_url(self) -> StorageConfig:
        if self.backend == "postgres" and self.url is None:
            raise ValueError("backend 'postgres' needs url (or PARLEY_DATABASE_URL)")
        return self


class LoggingConfig(_Strict):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    json_lines: bool = Field(False, alias="json", description="one JSON object per log line")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class HttpConfig(_Strict):
    # The gateway's one HTTP server: the admin API, the inspector and web chat pages,
    # and channel endpoints (Telegram webhooks, the web chat's websocket).
    enabled: bool = Field(True, description="serve the admin API and pages with `parley run`")
    host: str = Field("127.0.0.1", min_length=1, description="listen address")
    port: int = Field(8787, ge=0, le=65535, description="0 picks a free port")
    max_body_bytes: int = Field(1 << 20, ge=1024, le=64 << 20, description="larger is refused")
    # Silent or slow sockets must not hold descriptors (gateway.http_limits): each
    # phase of a connection has a deadline, and past the cap the oldest idle or
    # unfinished connection is closed to let a new one in.
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="a request line and headers must arrive within this long of the "
        "connection opening (or of their first byte on a kept-alive connection); else 408",
    )
    body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="a request body must arrive in full within this long of its headers; else 408",
    )
    keepalive_timeout_seconds: float = Field(
        75.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="an idle connection between requests is closed after this long (keep "
        "it above a load balancer's idle timeout); open websockets are exempt",
    )
    max_connections: int = Field(
        512,
        ge=1,
        le=1_000_000,
        description="open connections at most, lowered to fit the descriptor limit "
        "(ulimit -n); past it the oldest idle or unfinished one is closed, else 503",
    )
    token: SecretStr | None = Field(
        None,
        description="bearer token for every route but /health; unset on a loopback address: "
        "one is generated and kept in $PARLEY_HOME/admin.token",
    )


class ParleyConfig(_Strict):
    agent: AgentConfig = AgentConfig()
    # Several agents (gateway/agents_config.py); none: [agent] is the one agent.
    agents: tuple[AgentEntry, ...] = ()
    bindings: tuple[BindingConfig, ...] = ()
    providers: ProvidersConfig = ProvidersConfig()
    context: ContextConfig = ContextConfig()
    memory: MemorySettings = MemorySettings()
    session: SessionConfig = SessionConfig()
    lanes: LanesConfig = LanesConfig()
    channels: ChannelsConfig = ChannelsConfig()
    http: HttpConfig = HttpConfig()
    storage: StorageConfig = StorageConfig()
    retention: RetentionConfig = RetentionConfig()
    logging: LoggingConfig = LoggingConfig()
    media: MediaConfig = MediaConfig()

    @model_validator(mode="before")
    @classmethod
    def _agents_inherit(cls, data: object) -> object:
        return inherit_limits(data)

    @model_validator(mode="after")
    def _agents_valid(self) -> ParleyConfig:
        check_agents(self.agents, self.bindings, self.agent.id)
        return self

    def default_agent(self) -> AgentConfig:
        """The agent that answers what no binding names: ``[agent]`` without
        ``[[agents]]``, else the entry with ``default = true`` (else the first)."""
        if not self.agents:
            return self.agent
        return next((a for a in self.agents if a.default), self.agents[0])


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    config: ParleyConfig
    home: Path
    source: str  # the file read, or "built-in defaults"

    @property
    def workspace(self) -> Path:
        return self.config.agent.workspace or self.home / "workspace"

    @property
    def admin_token_file(self) -> Path:
        return self.home / "admin.token"

    @property
    def state_db(self) -> Path:
        return self.home / "state.db"

    @property
    def sessions_dir(self) -> Path:
        return self.home / "sessions"

    @property
    def media_dir(self) -> Path:
        """The media store: pictures and files people sent (owner-only)."""
        return self.home / "media"

    @property
    def checkpoints_dir(self) -> Path:
        return self.home / "sessions" / "checkpoints"


def resolve_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("PARLEY_HOME") or DEFAULT_HOME).expanduser()


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None) -> LoadedConfig:
    """Read, merge and validate; raises ConfigFileError and writes nothing."""
    env = os.environ if env is None else env
    home = resolve_home(env)
    if path is None and env.get("PARLEY_CONFIG"):
        path = Path(env["PARLEY_CONFIG"]).expanduser()
    if path is None and (home / CONFIG_FILE_NAME).is_file():
        path = home / CONFIG_FILE_NAME
    source = str(path) if path is not None else "built-in defaults"
    data: dict[str, Any] = _read_toml(path) if path is not None else {}
    overrides = _env_overrides(env)
    for dotted, value in overrides:
        _set_path(data, dotted, value)
    for var, dotted in _SECRET_ENV.items():
        if env.get(var) and _get_path(data, dotted) is None:
            _set_path(data, dotted, env[var])
    for var, dotted in _OVERRIDE_ENV.items():
        if env.get(var) and isinstance(_get_path(data, dotted[:-1]), Mapping):
            _set_path(data, dotted, env[var])
    for var, dotted in _ADMIN_ENV.items():
        if env.get(var):
            _set_path(data, dotted, env[var])
    try:
        config = ParleyConfig.model_validate(data)
    except ValidationError as exc:
        problems = [(_dotted(err["loc"]), err["msg"]) for err in exc.errors()]
        raise ConfigFileError(source, problems) from None
    if config.agents:
        # The default agent stands in [agent]'s place: its workspace, its memory.db.
        config = config.model_copy(update={"agent": config.default_agent()})
    return LoadedConfig(config=config, home=home, source=source)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigFileError(str(path), [("(file)", "no such file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(str(path), [("(file)", f"cannot read: {exc}")]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(str(path), [("(syntax)", str(exc))]) from None


def _env_overrides(env: Mapping[str, str]) -> list[tuple[tuple[str, ...], Any]]:
    found: list[tuple[tuple[str, ...], Any]] = []
    if env.get("PARLEY_LOG_LEVEL"):
        found.append((("logging", "level"), env["PARLEY_LOG_LEVEL"].upper()))
    for name, raw in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name in _RESERVED_ENV or "__" not in name:
            continue
        parts = tuple(p.lower() for p in name[len(ENV_PREFIX) :].split("__"))
        if parts[0] in _FILE_ONLY:
            raise ConfigFileError(
                name, [(parts[0], "[[agents]] and [[bindings]] are set in the file only")]
            )
        if all(parts):
            found.append((parts, _parse_env_value(raw)))
    return found


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _set_path(data: dict[str, Any], dotted: tuple[str, ...], value: Any) -> None:
    node = data
    for part in dotted[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[dotted[-1]] = value


def _get_path(data: Mapping[str, Any], dotted: tuple[str, ...]) -> Any:
    node: Any = data
    for part in dotted:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(root)"


def effective_config_toml(config: ParleyConfig) -> str:
    """The effective config as TOML, secrets masked (for `parley config show`)."""
    data = config.model_dump(mode="python", by_alias=True)
    return _to_toml(data, _masked_paths(config))


def _masked_paths(config: ParleyConfig) -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()

    def walk(model: BaseModel, prefix: tuple[str, ...]) -> None:
        for name in type(model).model_fields:
            value = getattr(model, name)
            if isinstance(value, SecretStr):
                paths.add((*prefix, name))
            elif isinstance(value, BaseModel):
                walk(value, (*prefix, name))

    walk(config, ())
    return paths


def mask_secret(value: str) -> str:
    return "****" + value[-4:] if len(value) >= 12 else "****"


def _to_toml(
    data: dict[str, Any], masked: set[tuple[str, ...]], prefix: tuple[str, ...] = ()
) -> str:
    scalars: list[str] = []
    tables: list[str] = []
    for key, value in data.items():
        path = (*prefix, key)
        if isinstance(value, dict) and key not in _INLINE_TABLE_FIELDS:
            body = _to_toml(value, masked, path)
            header = f"[{'.'.join(_toml_key(p) for p in path)}]"
            tables.append(f"{header}\n{body}" if body.strip() else f"{header}\n")
            continue
        if value is None:
            scalars.append(f"# {_toml_key(key)} = (unset)")
            continue
        if isinstance(value, list | tuple) and value and all(isinstance(v, dict) for v in value):
            header = f"[[{'.'.join(_toml_key(p) for p in path)}]]"  # [[agents]], [[bindings]]
            tables += [f"{header}\n{_to_toml(item, masked, path)}" for item in value]
            continue
        if path in masked:
            value = (
                mask_secret(value.get_secret_value()) if isinstance(value, SecretStr) else "****"
            )
        scalars.append(f"{_toml_key(key)} = {_toml_value(value)}")
    out = "\n".join(scalars)
    if tables:
        out = (out + "\n\n" if out else "") + "\n\n".join(t.rstrip("\n") for t in tables)
    return out + "\n"


# dict-valued fields rendered inline rather than as sub-tables
_INLINE_TABLE_FIELDS = {"identity_links", "models"}


def _toml_key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
        )
    text = str(value)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
