"""Tooling the runtime never imports (tests/test_structure.py checks it): the demo pair's training pipeline
(dev/demo/) and random-weight K2.6-shaped models for tests and benchmarks (dev/random_model.py)."""
