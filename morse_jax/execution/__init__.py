"""Running model-written code safely: the sandbox (bubblewrap, or reduced isolation by choice), the
verifier that extracts code from replies and runs tests on it, and the two sides of its harness
(the trusted test process and the sandboxed program server, shipped as source text with the
strict comparisons of `strict.py`). Task families score replies through it; see docs/SECURITY.md.
"""
