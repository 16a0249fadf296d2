"""The demo: a tiny GPT-style model and a byte-level corpus that exists offline."""
