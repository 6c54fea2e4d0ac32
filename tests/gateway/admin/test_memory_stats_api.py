"""``GET /api/memory/stats``: the task records of the seeded session's tool turn."""

from __future__ import annotations

import aiohttp

from tests.gateway.admin.conftest import AdminWorld


async def test_memory_stats(admin_server: AdminWorld, client: aiohttp.ClientSession) -> None:
    async with client.get("/api/memory/stats") as response:
        assert response.status == 200
        stats = await response.json()
    # seed_session's first turn called list_files once.
    assert stats["enabled"] is True and stats["scopes"] is None
    assert stats["total"] == 1 and stats["tools"] == {"list_files": 1}
    assert sum(stats["by_outcome"].values()) == 1
    async with client.get("/api/memory/stats", params={"scope": "person:nobody"}) as response:
        nobody = await response.json()
    assert (nobody["scopes"], nobody["total"]) == (["person:nobody"], 0)
    async with client.get("/api/memory/stats", params={"scope": ""}) as response:
        assert response.status == 400
