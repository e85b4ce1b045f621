"""Tests of the Python workers: python3 -m unittest discover -s adapters/tests -t adapters"""
