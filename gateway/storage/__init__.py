"""The gateway's state: sessions, inbox and pairing (see the modules)."""
