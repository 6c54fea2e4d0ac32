"""Long-term memory in PostgreSQL (``[storage] backend = "postgres"``): ``store``."""
