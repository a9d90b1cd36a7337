"""Shared test machinery: real receivers on 127.0.0.1 and the daemon as a subprocess."""
