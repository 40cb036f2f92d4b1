"""Face transports: the native WebSocket adapter and the session they share."""
