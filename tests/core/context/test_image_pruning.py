"""Pictures people sent are pruned by age: after ``keep_image_turns`` completed turns a
placeholder naming them takes their place in the view (never in the transcript)."""

from __future__ import annotations

from pathlib import Path

from parley.core.context.config import ContextConfig, PruningConfig
from parley.core.context.pruning import prune_old_images
from parley.core.context.view import build_view
from parley.core.media import without_vision
from parley.core.messages import ImageBlock, Message, TextBlock
from parley.core.tokens import default_counter
from parley.core.transcript import Transcript

PHOTO = ImageBlock("image/png", ref="conversation/x/ab/" + "ab" * 32 + ".png",
                   name="plan.png", width=10, height=20)  # fmt: skip
PLACEHOLDER = TextBlock("[image plan.png, 10×20: sent earlier, no longer shown to the model]")


def history(turns_after: int, *, answered: bool = True) -> list[Message]:
    messages = [Message("user", (TextBlock("see"), PHOTO))]
    if answered:
        messages.append(Message.assistant("ok"))
    for n in range(turns_after):
        messages += [Message.user(f"q{n}"), Message.assistant(f"a{n}")]
    return messages


def test_kept_for_three_completed_turns_then_a_placeholder() -> None:
    for after in range(3):
        shown = history(after)
        assert prune_old_images(shown, 3) == shown  # its own turn and 2..3 more: kept
    # Three completed turns after its own: the picture's turn is the fourth newest.
    pruned = prune_old_images(history(3), 3)
    assert pruned[0].content == (TextBlock("see"), PLACEHOLDER)
    assert pruned[1:] == history(3)[1:]
    # The newest turn, still waiting for its answer, counts for nothing.
    waiting = [*history(2), Message.user("and now?")]
    assert prune_old_images(waiting, 3)[0].content[1] == PHOTO


def test_pruning_is_stable_and_keeps_untouched_messages() -> None:
    shown = history(3)
    first, second = prune_old_images(shown, 3), prune_old_images(shown, 3)
    assert first[0] is second[0]  # the same copy each view: its counts and wire form kept
    assert all(a is b for a, b in zip(first[1:], shown[1:], strict=True))
    assert prune_old_images(shown, 0)[0].content[1] == PLACEHOLDER
    assert prune_old_images(history(0), 0)[0].content[1] == PLACEHOLDER


def test_the_view_prunes_and_names_the_change_in_its_key(tmp_path: Path) -> None:
    transcript = Transcript.create(tmp_path / "s.jsonl", "s1", "k")
    for message in history(2):
        transcript.append_message(message)
    config = ContextConfig()
    kept, key_before, _ = build_view(config, transcript.live_entries(), "direct")
    assert kept[0].content[1] == PHOTO
    transcript.append_message(Message.user("q9"))
    transcript.append_message(Message.assistant("a9"))
    pruned, key_after, _ = build_view(config, transcript.live_entries(), "direct")
    assert pruned[0].content[1] == PLACEHOLDER
    assert "|images:1" in key_after and "images" not in key_before
    # The stored entry keeps its reference: pruning is the view's only.
    assert next(iter(transcript.entries())).message.content[1] == PHOTO
    off = config.model_copy(update={"pruning": PruningConfig(mode="off")})
    assert build_view(off, transcript.live_entries(), "direct")[0][0].content[1] == PHOTO


def test_a_model_without_vision_is_shown_and_counted_a_placeholder(tmp_path: Path) -> None:
    transcript = Transcript.create(tmp_path / "s.jsonl", "s1", "k")
    for message in history(0):
        transcript.append_message(message)
    config = ContextConfig()
    seeing, _, _ = build_view(config, transcript.live_entries(), "direct")
    blind, _, _ = build_view(config, transcript.live_entries(), "direct", vision=False)
    again, _, _ = build_view(config, transcript.live_entries(), "direct", vision=False)
    assert seeing[0].content[1] == PHOTO
    assert blind[0].content == (
        TextBlock("see"),
        TextBlock(
            "[image plan.png, 10×20: the current model cannot see images; "
            "only the words sent with it are here]"
        ),
    )
    assert again[0] is blind[0] and blind[1] is seeing[1]  # stable copies, others as they are
    counter = default_counter()
    assert counter.message(seeing[0]) - counter.message(blind[0]) == (
        counter.block(PHOTO) - counter.block(blind[0].content[1])
    )
    photo = ImageBlock("image/jpeg", ref=PHOTO.ref, name="big.jpg", width=1200, height=1200)
    big = Message("user", (TextBlock("x"), photo))
    assert counter.message(without_vision([big])[0]) < counter.message(big) // 20
