"""The agent runtime. It knows nothing of chat platforms, HTTP or the process."""
