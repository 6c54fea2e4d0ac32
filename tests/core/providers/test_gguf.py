from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest

from parley.core.providers.gguf import GGUFError, GGUFInfo, read_gguf_file, read_gguf_info
from parley.core.providers.local import locate_model

UINT32, STRING, ARRAY, UINT64 = 4, 8, 9, 10


def _string(text: str, order: str = "<") -> bytes:
    data = text.encode()
    return struct.pack(order + "Q", len(data)) + data


def _kv(key: str, kind: int, value: bytes, order: str = "<") -> bytes:
    return _string(key, order) + struct.pack(order + "I", kind) + value


def gguf(*kvs: bytes, version: int = 3, order: str = "<") -> bytes:
    """A GGUF header with ``kvs`` and no tensors."""
    return (
        b"GGUF"
        + struct.pack(order + "I", version)
        + struct.pack(order + "QQ", 0, len(kvs))
        + b"".join(kvs)
    )


def arch(name: str, order: str = "<") -> bytes:
    return _kv("general.architecture", STRING, _string(name, order), order)


def ctx(key: str, value: int, order: str = "<") -> bytes:
    return _kv(key, UINT32, struct.pack(order + "I", value), order)


def read(data: bytes) -> GGUFInfo:
    return read_gguf_info(io.BytesIO(data))


def test_the_default_model_file_says_llama_and_8192() -> None:
    info = read_gguf_file(locate_model())

    assert info.version == 3
    assert info.architecture == "llama"
    assert info.context_length == 8192


def test_a_crafted_header_is_read_past_arrays_of_numbers_and_strings() -> None:
    numbers = struct.pack("<IQ", UINT32, 3) + struct.pack("<3I", 1, 2, 3)
    words = struct.pack("<IQ", STRING, 2) + _string("a") + _string("bc")
    data = gguf(
        arch("qwen2"),
        _kv("tokenizer.scores", ARRAY, numbers),
        _kv("tokenizer.tokens", ARRAY, words),
        ctx("qwen2.context_length", 32768),
    )

    info = read(data)

    assert (info.architecture, info.context_length) == ("qwen2", 32768)


def test_the_context_length_may_come_before_the_architecture() -> None:
    data = gguf(ctx("llama.context_length", 4096), ctx("bert.context_length", 512), arch("llama"))

    assert read(data).context_length == 4096


def test_a_64_bit_context_length_is_read() -> None:
    data = gguf(arch("llama"), _kv("llama.context_length", UINT64, struct.pack("<Q", 131072)))

    assert read(data).context_length == 131072


def test_reading_stops_once_both_keys_are_known() -> None:
    # The header promises a third key/value that is not there: it must never be read.
    data = gguf(arch("llama"), ctx("llama.context_length", 2048), ctx("x", 1))
    cut = data[: data.rindex(_string("x"))]

    assert read(cut).context_length == 2048


def test_no_context_length_key_is_none() -> None:
    info = read(gguf(arch("llama"), ctx("other.context_length", 4096)))

    assert info.architecture == "llama"
    assert info.context_length is None


def test_a_big_endian_file_is_read() -> None:
    data = gguf(arch("llama", ">"), ctx("llama.context_length", 2048, ">"), order=">")

    info = read(data)

    assert (info.version, info.context_length) == (3, 2048)


def test_version_1_uses_32_bit_counts() -> None:
    def s1(text: str) -> bytes:
        return struct.pack("<I", len(text)) + text.encode()

    data = (
        b"GGUF"
        + struct.pack("<III", 1, 0, 2)
        + s1("general.architecture")
        + struct.pack("<I", STRING)
        + s1("llama")
        + s1("llama.context_length")
        + struct.pack("<II", UINT32, 2048)
    )

    assert read(data).context_length == 2048


def test_bad_magic_is_a_clear_error() -> None:
    with pytest.raises(GGUFError, match="not a GGUF file"):
        read(b"not a model" * 10)


def test_a_truncated_header_is_a_clear_error() -> None:
    data = gguf(arch("llama"), ctx("llama.context_length", 2048))

    for cut in (6, 20, 30, len(data) - 2):
        with pytest.raises(GGUFError, match="truncated"):
            read(data[:cut])


def test_an_array_running_past_the_end_is_a_clear_error() -> None:
    huge = struct.pack("<IQ", UINT32, 1_000_000)
    with pytest.raises(GGUFError, match="truncated"):
        read(gguf(_kv("tokenizer.scores", ARRAY, huge), arch("llama")))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (gguf(version=7), "unsupported GGUF version 7"),
        (gguf(_kv("k", 99, b"")), "unknown value type 99"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40), "string"),
    ],
)
def test_corrupt_headers_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(GGUFError, match=message):
        read(data)


def test_read_gguf_file_of_a_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        read_gguf_file(tmp_path / "nope.gguf")
