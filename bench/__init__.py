"""Benchmarks of etcdq_v2 against baseline queues: ``python bench/run.py [--quick]``.

See bench/README.md for what is measured and how to read the tables.
"""
