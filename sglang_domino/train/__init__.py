"""Training of Domino drafters: data generation, base-anchored curriculum, export.

``python -m sglang_domino.train {gen-data,train}`` (or ``sglang-domino gen-data|train`` once the
main CLI calls ``sglang_domino.train.cli.add_parsers``).
"""
