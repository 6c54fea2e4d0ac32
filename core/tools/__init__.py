"""Tools the model can call.

``tool_registry``: their definitions, the registry and one safe way to run a call;
``truncation``: the cap on a tool result where it enters the session; ``builtin``:
``current_time``, ``read_file``, ``list_files``; ``memory``: ``memory_search``,
``memory_get``, ``remember``.
"""
