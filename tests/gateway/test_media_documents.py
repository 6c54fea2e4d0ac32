"""Documents and voice notes end to end (Telegram's getFile and file download, the real
anthropic SDK), and the audience rule over media: one person's picture or document
never reaches another person's turn, nor their memory search."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from parley.core.memory.audience import Audience, Viewer
from parley.gateway.media.store import MediaStore
from tests.channels.discord_support import ANN, LIMIT
from tests.channels.discord_support import TOKEN as DISCORD_TOKEN
from tests.channels.telegram_helpers import TOKEN
from tests.fakes.openai_api import FakeOpenAI
from tests.gateway.media_support import (
    ALICE,
    BOB,
    all_text,
    chat_bodies,
    discord_world,
    images_of,
    picture,
    telegram_world,
    text_pdf,
)
from tests.gateway.memory_helpers import QUIET_MEMORY, use_hashing_embedder

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
MARKDOWN = "# Shopping\n\n- oat milk\n- 3 lemons\n"


def document(w: object, data: bytes, name: str, mime: str) -> dict[str, object]:
    return w.fake.document(TOKEN, data, name, mime)  # type: ignore[attr-defined]


async def test_markdown_document_becomes_text_the_model_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path / "home", monkeypatch) as w:
        extra = document(w, MARKDOWN.encode(), "list.md", "text/markdown")
        assert await w.send(caption="what do I need?", extra=extra) == "seen"
        text = all_text(chat_bodies(w.llm)[0])
        assert "[document list.md (Markdown, 34 bytes) begins]\n# Shopping" in text
        assert "- 3 lemons\n\n[document list.md ends]" in text
        assert "what do I need?" in text


async def test_pdf_text_layer_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with telegram_world(tmp_path / "home", monkeypatch) as w:
        pdf = text_pdf("Invoice 2026-114 total 42 EUR", "Due within 30 days")
        await w.send(caption="pay this?", extra=document(w, pdf, "invoice.pdf", "application/pdf"))
        text = all_text(chat_bodies(w.llm)[0])
        assert "[document invoice.pdf (PDF" in text
        assert "[page 1]\nInvoice 2026-114 total 42 EUR" in text
        assert "[page 2]\nDue within 30 days" in text


async def test_csv_and_json_documents_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path / "home", monkeypatch) as w:
        await w.send(extra=document(w, b"name,qty\nlemon,3\n", "stock.csv", "text/csv"))
        await w.send(extra=document(w, b'{"k": [1, 2]}', "data.json", "application/json"))
        first, second = (all_text(b) for b in chat_bodies(w.llm))
        assert "stock.csv (CSV" in first and "lemon,3" in first
        assert "data.json (JSON" in second and '{"k": [1, 2]}' in second


async def test_a_long_document_is_cut_like_a_tool_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path / "home", monkeypatch) as w:
        lines = "".join(f"line {n:06d} of the log\n" for n in range(20_000))
        await w.send(extra=document(w, lines.encode(), "app.log", "text/plain"))
        text = all_text(chat_bodies(w.llm)[0])
        assert "line 000000" in text and "line 019999" not in text  # the head is kept
        assert re.search(r"\[\.\.\. [\d,]+ characters \([\d,]+ lines\) omitted \.\.\.\]", text)
        assert "omitted ...]\n[document app.log ends]" in text
        assert len(text) < len(lines) // 4  # cut to the window's tool-result cap


async def test_unsupported_and_oversized_documents_get_a_clear_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"PARLEY_MEDIA__MAX_DOCUMENT_BYTES": "1024"}
    async with telegram_world(tmp_path / "home", monkeypatch, **env) as w:
        docx = document(w, b"PK\x03\x04 zip", "report.docx", DOCX)
        reply = await w.send(caption="summarise please", extra=docx)
        assert reply.startswith("(I could not read report.docx: application/vnd.openxml")
        assert "send plain text, Markdown, CSV, JSON or a PDF" in reply
        assert reply.endswith("seen")  # the model still answered the words
        assert "summarise please" in all_text(chat_bodies(w.llm)[0])
        big = document(w, b"x" * 5000, "big.txt", "text/plain")
        reply = await w.send(caption="and this", extra=big)
        assert "(I could not read big.txt: it is 5 kB; the limit is 1 kB.)" in reply
        last = all_text(chat_bodies(w.llm)[-1])
        assert "[document big.txt: not read: it is 5 kB; the limit is 1 kB]" in last
        assert "and this" in last
        assert w.fake.downloads == []  # neither was fetched


async def test_a_scanned_pdf_without_text_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path / "home", monkeypatch) as w:
        scan = text_pdf("")
        reply = await w.send(extra=document(w, scan, "scan.pdf", "application/pdf"))
        assert "(I could not read scan.pdf: the PDF has no text layer" in reply


async def test_voice_note_is_transcribed_when_an_endpoint_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with FakeOpenAI(api_key="sk-speech") as speech:
        audio = b"OggS fake opus frames"
        speech.transcripts[hashlib.sha256(audio).hexdigest()] = "remind me to buy oat milk"
        env = {
            "PARLEY_MEDIA__TRANSCRIPTION__URL": speech.base_url,
            "PARLEY_TRANSCRIPTION_API_KEY": "sk-speech",
            "PARLEY_MEDIA__TRANSCRIPTION__LANGUAGE": "en",
        }
        async with telegram_world(tmp_path / "home", monkeypatch, **env) as w:
            assert await w.send(extra=w.fake.voice(TOKEN, audio, 3)) == "seen"
            text = all_text(chat_bodies(w.llm)[0])
            assert "[voice note, 3 s, transcribed]\nremind me to buy oat milk" in text
        [request] = speech.transcription_requests
        assert request["model"] == "whisper-1" and request["language"] == "en"
        assert request["file"] == audio and request["filename"] == "voice.ogg"


async def test_voice_note_without_an_endpoint_is_a_placeholder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path / "home", monkeypatch) as w:
        assert await w.send(extra=w.fake.voice(TOKEN, b"OggS", 7)) == "seen"
        text = all_text(chat_bodies(w.llm)[0])
        assert "[voice note, 7 s: not transcribed: no transcription service is set up]" in text
        assert w.fake.downloads == []


async def test_a_failing_transcription_service_costs_only_the_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with FakeOpenAI(api_key="sk-right") as speech:
        env = {"PARLEY_MEDIA__TRANSCRIPTION__URL": speech.base_url,
               "PARLEY_TRANSCRIPTION_API_KEY": "sk-wrong"}  # fmt: skip
        async with telegram_world(tmp_path / "home", monkeypatch, **env) as w:
            reply = await w.send(caption="listen", extra=w.fake.voice(TOKEN, b"OggS", 2))
            assert reply.startswith("(I could not read the voice note: the transcription")
            assert "HTTP 401" in reply and reply.endswith("seen")
            assert "listen" in all_text(chat_bodies(w.llm)[0])


CANARY_DOC = "CANARY-ALICE-zqxwvtsrpnmk: the locker code is 8841"
ASK = "what is the locker code? CANARY-ALICE-zqxwvtsrpnmk"


async def test_one_persons_media_never_reaches_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice sends a document (a canary in its text) and a photo; Bob's turns see
    neither (he even asks with the canary's name: recall finds nothing of hers), his
    memory search finds nothing, and the media store refuses Alice's picture to Bob's
    viewer even when named directly. Alice's own search finds the document: its text
    is indexed; the picture's bytes never are."""
    use_hashing_embedder(monkeypatch)
    env = {"PARLEY_MEMORY__ENABLED": "true", **QUIET_MEMORY}
    home = tmp_path / "home"
    async with telegram_world(home, monkeypatch, **env) as w:
        secret = document(w, CANARY_DOC.encode(), "secret.txt", "text/plain")
        await w.send(chat_id=ALICE, caption="keep this", extra=secret)
        await w.send(chat_id=ALICE, caption="and my face",
                     extra=w.fake.photo(TOKEN, picture(200, 200), 200, 200))  # fmt: skip
        alice_requests = len(chat_bodies(w.llm))
        assert "8841" in all_text(chat_bodies(w.llm)[0])
        memory = w.gateway.memory
        assert memory is not None
        await memory.sync(reason="test")
        await w.send(chat_id=BOB, sender_first_name="Bob", text=ASK)
        await w.send(chat_id=BOB, sender_first_name="Bob", text="the locker code, 8841?")
        bob_requests = chat_bodies(w.llm)[alice_requests:]
        assert len(bob_requests) == 2
        assert "8841" not in all_text(bob_requests[0])
        assert all(not images_of(body) for body in bob_requests)
        await memory.sync(reason="test")
        alice = f"person:telegram:{ALICE}"
        bob = f"person:telegram:{BOB}"
        found = await memory.search("locker code CANARY-ALICE-zqxwvtsrpnmk", scopes=(alice,))
        assert any("8841" in hit.snippet for hit in found.hits)
        found = await memory.search("locker code CANARY-ALICE-zqxwvtsrpnmk", scopes=(bob,))
        assert not any("CANARY-ALICE-zqxwvtsrpnmk: the locker" in h.snippet for h in found.hits)
        # Nothing of the picture is in memory: neither its bytes nor its file's name.
        found = await memory.search("my face photo.jpg", scopes=(alice,))
        assert all("/9j/" not in h.snippet and ".jpg" not in h.snippet.split("photo")[0]
                   for h in found.hits)  # fmt: skip
    # The picture: stored under Alice's audience, refused to Bob, readable by Alice.
    [stored] = list((home / "media").rglob("*.jpg"))
    ref = str(stored.relative_to(home / "media"))
    assert ref.startswith("person/telegram%3A5001/")
    store = MediaStore(home / "media")
    assert store.read(ref, Viewer.only(Audience.person(f"telegram:{BOB}"))) is None
    assert store.read(ref, Viewer.only(Audience.person(f"telegram:{ALICE}"))) == stored.read_bytes()


async def test_discord_document_and_voice_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Discord's attachment URL, through discord.py's own CDN request: a PDF is read, a
    voice message is transcribed, one over the limit is refused before any fetch."""
    async with FakeOpenAI(api_key=None) as speech:
        audio = b"OggS discord voice"
        speech.transcripts[hashlib.sha256(audio).hexdigest()] = "see you at eight"
        env = {"PARLEY_MEDIA__TRANSCRIPTION__URL": speech.base_url,
               "PARLEY_MEDIA__MAX_DOCUMENT_BYTES": "2048"}  # fmt: skip
        async with discord_world(tmp_path / "home", monkeypatch, api="anthropic", **env) as w:
            dm = w.fake.add_dm(DISCORD_TOKEN, ANN)
            pdf = {"filename": "menu.pdf", "content_type": "application/pdf",
                   "data": text_pdf("Soup of the day: lentil")}  # fmt: skip
            voice = {"filename": "voice-message.ogg", "content_type": "audio/ogg",
                     "data": audio, "duration_secs": 2.0, "waveform": "AAAA"}  # fmt: skip
            huge = {"filename": "dump.csv", "content_type": "text/csv", "data": b"a,b\n" * 1000}
            for number, spec in enumerate((pdf, voice, huge), start=1):
                await w.fake.push_message(
                    DISCORD_TOKEN, channel_id=dm, content=f"file {number}", author=ANN,
                    attachments=[spec],
                )  # fmt: skip
                await w.fake.wait_until(lambda n=number: len(w.replies()) >= n, LIMIT)
                await w.gateway.wait_idle()
            first, second, third = (all_text(b) for b in chat_bodies(w.llm))
            assert "[document menu.pdf (PDF" in first and "Soup of the day: lentil" in first
            assert "[voice note, 2 s, transcribed]\nsee you at eight" in second
            assert "[document dump.csv: not read: it is 4 kB; the limit is 2 kB]" in third
            assert w.reply_texts()[-1].startswith("(I could not read dump.csv: it is 4 kB")
            assert len(w.fake.cdn_fetches) == 2  # the CSV was never fetched
