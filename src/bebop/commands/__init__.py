"""Command implementations behind the thin CLI (one file per command)."""
