"""ddtree-chat: terminal chat for Kimi K2.6 with DDTree speculative decoding."""

__version__ = "0.1.0"
