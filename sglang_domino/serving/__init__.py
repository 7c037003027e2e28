"""SGLang serving glue for Domino: ``--speculative-algorithm DOMINO`` as an SGLang plugin."""
