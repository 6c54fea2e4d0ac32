"""The process: config, routing, sessions, lanes, commands, CLI."""
