"""Herald's HTTP surface: ops endpoints now, the /v2 REST API on top."""
