"""Tooling the runtime never imports (tests/test_structure.py checks it): the demo pair's training pipeline
(dev/demo/)."""
