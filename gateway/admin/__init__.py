"""The admin HTTP API, the inspector page and the web chat page (issue 6)."""
