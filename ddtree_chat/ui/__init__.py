"""Textual terminal app. Imported lazily by the CLI so one-shot mode never loads Textual."""
