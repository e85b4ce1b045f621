"""Tests of the Python workers: python3 -m unittest discover -s adapters/tests -t adapters"""

import os
import sys

# The tests import the tools of adapters/tools/ (capture.py) as the vllm worker does: by name.
TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
if TOOLS not in sys.path:
    sys.path.append(TOOLS)
