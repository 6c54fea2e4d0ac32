"""`parley doctor` on pictures, documents and voice: the media extra and transcription."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from parley.gateway.cli.doctor_checks import _check_media
from parley.gateway.config import load_config


def test_media_findings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"PARLEY_HOME": str(tmp_path)}
    ok = _check_media(load_config(env=base))
    assert (ok.severity, ok.detail) == (
        "ok",
        "pictures and documents read; voice notes not transcribed",
    )
    url = {"PARLEY_MEDIA__TRANSCRIPTION__URL": "http://127.0.0.1:8080/v1"}
    assert (
        "transcribed at http://127.0.0.1:8080/v1"
        in _check_media(load_config(env=base | url)).detail
    )
    off = _check_media(load_config(env=base | {"PARLEY_MEDIA__ENABLED": "false"}))
    assert off.severity == "ok" and off.detail.startswith("off")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "PIL" else real(name, *a))  # fmt: skip
    missing = _check_media(load_config(env=base))
    assert missing.severity == "warning"
    assert missing.detail.startswith("Pillow missing (the media extra)")
