"""Puts adapters/ (the folder above this one) on sys.path, once, for the Python tools here.

A tool run as a script (`python3 adapters/tools/capture.py`) has adapters/tools first on its
sys.path, not adapters/ as the workers have; importing this module first lets it import the
worker library (relattn_worker.py, vllm_loader.py) by name, as the workers do. Appended, not
inserted: a tool imported where adapters/ is on the path already changes nothing.
"""

import os
import sys

ADAPTERS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if ADAPTERS not in sys.path:
    sys.path.append(ADAPTERS)
