"""Benchmarks: `python -m bench <name>` imports bench.<name> and calls its main().

Each benchmark prints a table and writes JSON to bench/results/<name>.json. Run them with the
embedded services up: `make bench NAME=<name>`.
"""
