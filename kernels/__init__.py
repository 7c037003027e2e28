"""Triton kernels of sglang-domino, installed as ``sglang_domino.kernels``.

From a checkout's root this folder could be imported as a top-level ``kernels`` and shadow the PyPI
package of that name, which SGLang imports. In that case hand the name over to the real package.
"""

if __name__ == "kernels":
    import importlib
    import os
    import sys

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _root]
    del sys.modules["kernels"]
    sys.modules["kernels"] = importlib.import_module("kernels")
