"""Platform adapters and the message vocabulary they share with the gateway."""
