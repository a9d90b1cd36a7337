"""The operator web console, served under ``/console/`` by ``herald run``."""
