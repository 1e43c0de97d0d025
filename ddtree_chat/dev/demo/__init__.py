"""The built-in demo model pair (issue 7): a small K2-architecture Python coder trained on the CPython
standard library, and its DFlash drafter. Entry point: ``python -m ddtree_chat.dev.demo.train --out DIR``
(``--target-from ddtree_chat/assets/demo/target`` retrains only the drafter); ``python benchmarks/profile_round.py
--device cpu --programs`` times a decoding round's programs on this CPU."""
