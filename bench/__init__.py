"""Vancetope benchmarks: each measures its own baseline in the same run and reports ratios.

Run ``python bench/run.py [--quick]``; see bench/README.md. Nothing here asserts a time.
"""
