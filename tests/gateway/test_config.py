from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from parley.gateway import config as config_module
from parley.gateway.config import (
    ParleyConfig,
    effective_config_toml,
    load_config,
)
from parley.gateway.errors import ConfigFileError

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "parley.example.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "parley.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_file(tmp_path: Path) -> None:
    loaded = load_config(env={"PARLEY_HOME": str(tmp_path)})
    assert loaded.source == "built-in defaults"
    assert loaded.home == tmp_path
    assert loaded.workspace == tmp_path / "workspace"
    assert loaded.config.session.dm_scope == "per-channel-peer"


def test_home_file_is_found(tmp_path: Path) -> None:
    write(tmp_path, '[agent]\nname = "Ada"\n')
    loaded = load_config(env={"PARLEY_HOME": str(tmp_path)})
    assert loaded.config.agent.name == "Ada"
    assert loaded.source.endswith("parley.toml")


def test_invalid_field_reports_dotted_path(tmp_path: Path) -> None:
    path = write(tmp_path, "[lanes]\nmax_concurrent_runs = 0\n[session.reset]\nat_hour = 25\n")
    with pytest.raises(ConfigFileError) as info:
        load_config(path, env={"PARLEY_HOME": str(tmp_path / "home")})
    paths = [p for p, _ in info.value.problems]
    assert "lanes.max_concurrent_runs" in paths
    assert "session.reset.at_hour" in paths
    assert not (tmp_path / "home").exists()  # nothing written


def test_unknown_key_and_syntax_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError) as info:
        load_config(write(tmp_path, "[agent]\nnmae = 'x'\n"), env={})
    assert info.value.problems[0][0] == "agent.nmae"
    with pytest.raises(ConfigFileError) as info:
        load_config(write(tmp_path, "[agent\n"), env={})
    assert info.value.problems[0][0] == "(syntax)"


def test_missing_explicit_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError):
        load_config(tmp_path / "nope.toml", env={})


def test_env_overrides_and_secrets(tmp_path: Path) -> None:
    path = write(tmp_path, "[lanes]\nqueue_cap = 5\n")
    env = {
        "PARLEY_HOME": str(tmp_path),
        "PARLEY_LANES__QUEUE_CAP": "7",
        "PARLEY_AGENT__NAME": "Robin",
        "PARLEY_LOG_LEVEL": "debug",
        "ANTHROPIC_API_KEY": "sk-ant-secret-value-1234",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    }
    config = load_config(path, env=env).config
    assert config.lanes.queue_cap == 7
    assert config.agent.name == "Robin"
    assert config.logging.level == "DEBUG"
    assert config.providers.anthropic.api_key is not None
    assert config.providers.anthropic.api_key.get_secret_value() == "sk-ant-secret-value-1234"
    assert config.providers.openai.base_url == "http://127.0.0.1:9/v1"


def test_bad_env_override_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError) as info:
        load_config(env={"PARLEY_HOME": str(tmp_path), "PARLEY_LANES__QUEUE_CAP": "many"})
    assert info.value.problems[0][0] == "lanes.queue_cap"


def test_show_masks_secrets_and_round_trips(tmp_path: Path) -> None:
    env = {"PARLEY_HOME": str(tmp_path), "OPENAI_API_KEY": "sk-openai-very-secret-9876"}
    config = load_config(env=env).config
    text = effective_config_toml(config)
    assert "very-secret" not in text
    assert "****9876" in text
    parsed = tomllib.loads(text)
    assert parsed["lanes"]["queue_cap"] == config.lanes.queue_cap
    # What `config show` prints (minus masked secrets) is itself a valid config.
    parsed["providers"]["openai"].pop("api_key")
    assert ParleyConfig.model_validate(parsed) == config.model_copy(
        update={
            "providers": config.providers.model_copy(
                update={"openai": config.providers.openai.model_copy(update={"api_key": None})}
            )
        }
    )


def _field_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for name, info in model.model_fields.items():
        key = info.alias or name
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths |= _field_paths(annotation, f"{prefix}{key}.")
        else:
            paths.add(f"{prefix}{key}")
    return paths


def test_example_file_is_valid_and_documents_every_option() -> None:
    loaded = load_config(EXAMPLE, env={})
    assert loaded.config == ParleyConfig()  # the example shows the defaults
    text = EXAMPLE.read_text(encoding="utf-8")
    missing = [p for p in _field_paths(ParleyConfig) if p.rsplit(".", 1)[-1] not in text]
    assert missing == []


def test_bot_tokens_from_the_environment_turn_channels_on() -> None:
    loaded = load_config(
        env={
            "TELEGRAM_BOT_TOKEN": "123456:ABC-def_ghi",
            "TELEGRAM_API_BASE_URL": "http://127.0.0.1:8081/",
            "DISCORD_BOT_TOKEN": "MTEx.abc.def",
        }
    )
    channels = loaded.config.channels
    assert channels.configured() == ["telegram", "discord"]
    account = channels.telegram.accounts["default"]
    assert account.token.get_secret_value() == "123456:ABC-def_ghi"
    assert account.api_base_url == "http://127.0.0.1:8081"  # the override wins, tidied
    assert channels.discord.accounts["default"].token.get_secret_value() == "MTEx.abc.def"
    # No token: the base-URL override alone does not invent an account.
    bare = load_config(env={"TELEGRAM_API_BASE_URL": "http://127.0.0.1:8081"})
    assert bare.config.channels.telegram.accounts == {}
    assert bare.config.channels.configured() == []


def test_channel_config_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "parley.toml"
    path.write_text(
        '[channels.telegram]\nmode = "webhook"\ndm_policy = "friends"\n'
        '[channels.telegram.accounts.main]\ntoken = "not-a-token"\n'
        '[channels.discord.accounts."Bad Id"]\ntoken = "x"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigFileError) as caught:
        load_config(path, env={})
    paths = [p for p, _ in caught.value.problems]
    assert "channels.telegram.dm_policy" in paths
    assert "channels.telegram.accounts.main.token" in paths
    assert "channels.discord.accounts" in paths


def test_webhook_mode_needs_url_and_secret(tmp_path: Path) -> None:
    path = tmp_path / "parley.toml"
    path.write_text(
        '[channels.telegram]\nmode = "webhook"\n'
        '[channels.telegram.accounts.main]\ntoken = "1:abc"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigFileError, match="webhook_url and webhook_secret"):
        load_config(path, env={})


GIB = 1024**3


@pytest.mark.parametrize(
    ("memory", "mib"),
    [
        (GIB // 2, 16),
        (GIB, 16),
        (2 * GIB, 32),
        (3 * GIB, 48),
        (4 * GIB, 64),
        (8 * GIB, 128),
        (64 * GIB, 128),
    ],
)
def test_warm_windows_take_a_share_of_the_machines_memory_by_default(
    tmp_path: Path, memory: int, mib: int
) -> None:
    storage = load_config(env={"PARLEY_HOME": str(tmp_path)}).config.storage
    assert storage.warm_transcripts_mib == "auto"
    assert storage.warm_transcripts_bytes(memory) == mib * 1024 * 1024


def test_warm_windows_ask_the_system_how_much_memory_there_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = load_config(env={"PARLEY_HOME": str(tmp_path)}).config.storage
    monkeypatch.setattr(config_module, "usable_memory_bytes", lambda: 3 * GIB)
    assert storage.warm_transcripts_bytes() == 48 * 1024 * 1024
    monkeypatch.setattr(config_module, "usable_memory_bytes", lambda: None)  # not known
    assert storage.warm_transcripts_bytes() == 32 * 1024 * 1024


def test_warm_windows_set_by_hand_or_off_whatever_the_memory(tmp_path: Path) -> None:
    env = {"PARLEY_HOME": str(tmp_path), "PARLEY_STORAGE__WARM_TRANSCRIPTS_MIB": "100"}
    assert load_config(env=env).config.storage.warm_transcripts_bytes(GIB) == 100 * 1024 * 1024
    off = write(tmp_path, "[storage]\nwarm_transcripts_mib = 0\n")
    assert (
        load_config(off, env={"PARLEY_HOME": str(tmp_path)}).config.storage.warm_transcripts_bytes(
            64 * GIB
        )
        == 0
    )
    shouted = {**env, "PARLEY_STORAGE__WARM_TRANSCRIPTS_MIB": "AUTO"}
    assert load_config(env=shouted).config.storage.warm_transcripts_mib == "auto"
    for bad in ("lots", "-1", "32.5", "70000"):
        with pytest.raises(ConfigFileError) as info:
            load_config(env={**env, "PARLEY_STORAGE__WARM_TRANSCRIPTS_MIB": bad})
        # One problem, that says what would do.
        assert [p[0] for p in info.value.problems] == ["storage.warm_transcripts_mib"]
        assert '"auto" or a whole number of MiB' in info.value.problems[0][1]


def test_example_file_documents_every_agents_and_bindings_key() -> None:
    from parley.gateway.agents_config import AgentEntry, BindingConfig

    text = EXAMPLE.read_text(encoding="utf-8")
    keys = set(AgentEntry.model_fields) | set(BindingConfig.model_fields)
    assert [k for k in sorted(keys) if f"{k} " not in text and f"{k}," not in text] == []
    assert "[[agents]]" in text and "[[bindings]]" in text
