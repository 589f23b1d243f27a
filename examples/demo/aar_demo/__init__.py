"""The continuous-batching demo of ascend_attn_rt: a program that uses the library, kept beside it
rather than in it (the package holds only the runtime).

From the repository root, after a build::

    PYTHONPATH=python:examples/demo .venv/bin/python -m aar_demo [--attention gqa|mla|sfa|dsa] [--dcp 2 | --dsa-cp 2] ...

``make demo`` runs it once per attention backend, then with ``--dcp 2`` (GQA),
``--attention sfa --dcp 2`` and ``--attention dsa --dsa-cp 2`` (DSA-CP: each step's
tokens split over two processes). The code is in ``aar_demo/demo.py``.
"""
