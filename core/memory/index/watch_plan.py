"""What the event-driven watcher watches, and which of its events count.

Every directory is watched on its own (not recursively): ``memory/`` and each of its
subdirectories, each extra directory and its subdirectories, the notes root and its
subdirectories (the *trees*), the workspace itself (for ``MEMORY.md``, ``memory.md`` and
a ``memory/`` made later), the directory of each extra file, and for a root that does
not exist yet its nearest existing ancestor, so that its appearance is seen. A directory
that appears inside a tree (or a root that appears) makes the watcher plan again.

Why not the library's recursive mode: it cannot watch the workspace flat and the trees
deep in one watcher, and it adds the watch of a new directory without saying so when
the kernel's limit (``max_user_watches``) refuses it; here every watch is added when the
watcher is (re)made, where a refusal raises and the index falls back to polling.

The rules mirror ``sources.memory_files`` and ``NoteStore.files``: ``.md`` files inside a
tree (hidden and tool directories such as ``.git`` are not walked), the two root files
and the extra ``.md`` files; symlinks are not followed. Every function here blocks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# The directories memory_files does not walk; shared so the two never disagree.
from parley.core.memory.sources import _SKIP_DIRS, ROOT_MEMORY_FILES

# watchfiles' change codes (watchfiles.Change): added, modified, deleted.
ADDED, MODIFIED, DELETED = 1, 2, 3


@dataclass(frozen=True, slots=True)
class WatchPlan:
    dirs: frozenset[str]  # every directory watched, each on its own
    tree_dirs: frozenset[str]  # those inside a tree: a ``.md`` file in one counts
    files: frozenset[str]  # single files that count: the root files, the extra .md files
    # The roots (trees, extra files, the workspace) whether they exist or not: one of
    # them, or a directory on the way to one, appearing or going means planning again.
    anchors: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    changed: bool = False  # a watched file changed: the index is dirty
    replan: bool = False  # a directory came or went where the plan has to follow


def plan_watch(workspace: Path, extra_paths: Sequence[Path], notes_root: Path) -> WatchPlan:
    """The directories to watch now and the files that count (blocking: walks the trees)."""
    root = workspace.resolve() if workspace.exists() else workspace.absolute()
    trees = [str(root / "memory"), str(notes_root.absolute())]
    files = [str(root / name) for name in ROOT_MEMORY_FILES]
    dirs: set[str] = set()
    anchors = [str(root), *trees]
    for extra in extra_paths:
        # Normalised as memory_files does: "../notes.md" is relative to the workspace.
        path = os.path.normpath(extra if extra.is_absolute() else root / extra)
        if os.path.islink(path):
            continue  # memory_files skips it too
        anchors.append(path)
        if os.path.isdir(path):
            trees.append(path)
        elif path.lower().endswith(".md"):
            files.append(path)
            dirs.add(_nearest_dir(os.path.dirname(path)))
        else:
            dirs.add(_nearest_dir(os.path.dirname(path)))  # it may yet become a directory
    tree_dirs: set[str] = set()
    for tree in trees:
        if os.path.isdir(tree) and not os.path.islink(tree):
            tree_dirs.update(_walk_dirs(tree))
        else:
            dirs.add(_nearest_dir(os.path.dirname(tree)))
    dirs.add(_nearest_dir(str(root)))
    dirs |= tree_dirs
    return WatchPlan(frozenset(dirs), frozenset(tree_dirs), frozenset(files), tuple(anchors))


def classify(plan: WatchPlan, changes: Iterable[tuple[int, str]]) -> Verdict:
    """What a batch of (change, path) events means for the index and for the plan
    (blocking: looks at what an added path is)."""
    changed = replan = False
    for change, path in changes:
        parent, name = os.path.split(path)
        if path in plan.files:
            changed = True
        elif parent in plan.tree_dirs:
            if name.lower().endswith(".md"):
                changed = True
            elif change == DELETED and path in plan.dirs:
                changed = True  # a watched directory went, maybe with .md files in it
            elif change == ADDED and path not in plan.dirs and _walkable(path, name):
                replan = True  # its files are looked at once it is watched
        # A root itself (an extra file saved by rename, say) needs no new plan.
        if change != MODIFIED and path not in plan.files and _on_the_way(plan, path):
            replan = True
            changed = changed or change == DELETED
    return Verdict(changed, replan)


def counted_files(plan: WatchPlan, dirs: Iterable[str]) -> bool:
    """Does any of ``dirs`` (new to the plan) hold a file that counts? (blocking)"""
    for directory in dirs:
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    path = entry.path
                    if path in plan.files or (
                        directory in plan.tree_dirs
                        and entry.name.lower().endswith(".md")
                        and entry.is_file(follow_symlinks=False)
                    ):
                        return True
        except OSError:
            continue  # gone again: nothing of it to count
    return False


def _on_the_way(plan: WatchPlan, path: str) -> bool:
    """Is ``path`` a root of the plan, or a directory on the way to one?"""
    prefix = path + os.sep
    return any(anchor == path or anchor.startswith(prefix) for anchor in plan.anchors)


def _walkable(path: str, name: str) -> bool:
    """A directory memory_files would walk into (no symlink, no hidden or tool dir)."""
    if name in _SKIP_DIRS or name.startswith("."):
        return False
    return os.path.isdir(path) and not os.path.islink(path)


def _walk_dirs(tree: str) -> list[str]:
    found = []
    for directory, subdirs, _ in os.walk(tree, followlinks=False):
        found.append(directory)
        # os.walk lists a symlink to a directory among the directories: leave it out.
        subdirs[:] = [d for d in subdirs if _walkable(os.path.join(directory, d), d)]
    return found


def _nearest_dir(path: str) -> str:
    """``path`` or its nearest ancestor that is a directory (``/`` at worst)."""
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
